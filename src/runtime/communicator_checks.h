// Argument checks shared by the Communicator implementations: a bad team or root is a user-
// visible error naming the collective, never a hang inside the transport.
#pragma once

#include <algorithm>

#include "meshfuse/error.h"
#include "meshfuse/communicator.h"

namespace meshfuse {

// Checks that `team` is non-empty, holds distinct ranks of a world of `world` ranks including
// `rank`, and (root >= 0) holds `root`. Returns `rank`'s index in the team.
inline int64_t checkTeamAndRoot(const char* what, const Team& team, int64_t root, int64_t rank, int64_t world) {
  MF_USER_CHECK(!team.empty(), ErrorKind::Runtime, "{}: empty team", what);
  for (int64_t r : team)
    MF_USER_CHECK(r >= 0 && r < world, ErrorKind::Mesh,
                  "{}: team [{}] names rank {} but the world has {} ranks (launch with mpirun -np N)", what,
                  fmt::join(team, ", "), r, world);
  auto me = std::find(team.begin(), team.end(), rank);
  MF_USER_CHECK(me != team.end(), ErrorKind::Runtime, "{}: rank {} is not in team [{}]", what, rank,
                fmt::join(team, ", "));
  MF_USER_CHECK(root < 0 || std::find(team.begin(), team.end(), root) != team.end(), ErrorKind::Runtime,
                "{}: root {} is not in team [{}]", what, root, fmt::join(team, ", "));
  return me - team.begin();
}

}  // namespace meshfuse
