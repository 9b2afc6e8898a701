// Argument checks shared by the Communicator implementations: a bad team or root is a user-
// visible error naming the collective, never a hang inside the transport.
#pragma once

#include <algorithm>
#include <vector>

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

// Throws RuntimeError unless `counts` has one count per member of `team`, none negative.
inline void checkCounts(const char* what, const Counts& counts, const Team& team) {
  MF_USER_CHECK(counts.size() == team.size(), ErrorKind::Runtime, "{}: {} counts [{}] for a team of {} ranks [{}]",
                what, counts.size(), fmt::join(counts, ", "), team.size(), fmt::join(team, ", "));
  for (int64_t c : counts)
    MF_USER_CHECK(c >= 0, ErrorKind::Runtime, "{}: negative count in [{}]", what, fmt::join(counts, ", "));
}

// Where each block starts when the blocks of `counts` are packed in team order.
inline std::vector<int64_t> displacements(const Counts& counts) {
  std::vector<int64_t> out(counts.size(), 0);
  for (size_t j = 1; j < counts.size(); ++j) out[j] = out[j - 1] + counts[j - 1];
  return out;
}

inline int64_t totalCount(const Counts& counts) {
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  return n;
}

// Whether every block has the same count (the equal-count collectives do).
inline bool equalCounts(const Counts& counts) {
  return std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == counts.front(); });
}

}  // namespace meshfuse
