// The rooted collectives of the Communicator interface (broadcast, reduce, gather, scatter) on
// whatever world mpirun started (1, 2, 4 ranks): the mpi communicator on the whole world, on
// sub-teams (even and odd ranks) and on a team in reversed order (the root's and the blocks'
// positions are team positions, not global ranks); blocking and non-blocking (every call issued
// before any is waited for); sums and maxima. The self communicator runs the same checks on its
// one-rank team.
#include <numeric>

#include "mpi_test_main.h"

namespace meshfuse::testing {
namespace {

constexpr int64_t kCount = 3;  // elements per rank-chunk

// A value that tells ranks and positions apart: 100 * rank + i (+ 1, so none is 0).
float valueOf(int64_t rank, int64_t i) { return static_cast<float>(100 * rank + i + 1); }

Tensor valuesOf(int64_t rank, int64_t chunks = 1) {
  Tensor t(DataType::Float, {chunks * kCount});
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, valueOf(rank, i));
  return t;
}

Tensor filled(int64_t n, float v) {
  Tensor t(DataType::Float, {n});
  for (int64_t i = 0; i < n; ++i) t.set(i, v);
  return t;
}

// The teams this rank is in: the world, its parity class, and the world reversed.
std::vector<Team> teamsOf(const Communicator& comm) {
  Team world(comm.size());
  std::iota(world.begin(), world.end(), 0);
  Team parity, reversed(world.rbegin(), world.rend());
  for (int64_t r = comm.rank() % 2; r < comm.size(); r += 2) parity.push_back(r);
  return {world, parity, reversed};
}

// Every rooted collective on `team` with the root at its last position, each checked on every
// member. With `nonblocking`, all four are issued before the first wait.
void checkRootedCollectives(Communicator& comm, const Team& team, bool nonblocking) {
  const int64_t me = comm.rank(), root = team.back(), n = static_cast<int64_t>(team.size());
  const bool is_root = me == root;
  SCOPED_TRACE(fmt::format("team [{}], root {}, rank {}{}", fmt::join(team, ", "), root, me,
                           nonblocking ? ", non-blocking" : ""));
  // broadcast: the root's values everywhere.
  Tensor bcast = is_root ? valuesOf(root) : filled(kCount, -1);
  // reduce (sum and max): on the root only; the other ranks pass no receive buffer.
  Tensor mine = valuesOf(me);
  Tensor sum = filled(kCount, -1), max = filled(kCount, -1);
  // gather: the root receives every member's chunk in team order.
  Tensor gathered = filled(n * kCount, -1);
  // scatter: the root's chunk j (values of team[j]) goes to member j.
  Tensor to_scatter(DataType::Float, {n * kCount});
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < kCount; ++i) to_scatter.set(j * kCount + i, valueOf(team[j], i));
  Tensor scattered = filled(kCount, -1);

  std::vector<std::unique_ptr<Work>> works;
  auto run = [&](std::unique_ptr<Work> w) {
    if (nonblocking) {
      works.push_back(std::move(w));
    } else {
      w->wait();
    }
  };
  run(comm.broadcast(bcast.data(), kCount, DataType::Float, root, team));
  run(comm.reduce(mine.data(), is_root ? sum.data() : nullptr, kCount, DataType::Float, ReduceOp::Sum, root, team));
  run(comm.reduce(mine.data(), is_root ? max.data() : nullptr, kCount, DataType::Float, ReduceOp::Max, root, team));
  run(comm.gather(mine.data(), is_root ? gathered.data() : nullptr, kCount, DataType::Float, root, team));
  run(comm.scatter(is_root ? to_scatter.data() : nullptr, scattered.data(), kCount, DataType::Float, root, team));
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();  // any order

  for (int64_t i = 0; i < kCount; ++i) {
    EXPECT_EQ(bcast.get(i), valueOf(root, i)) << "broadcast element " << i;
    EXPECT_EQ(scattered.get(i), valueOf(me, i)) << "scatter element " << i;
    float expected_sum = 0, expected_max = 0;
    for (int64_t r : team) expected_sum += valueOf(r, i), expected_max = std::max(expected_max, valueOf(r, i));
    EXPECT_EQ(sum.get(i), is_root ? expected_sum : -1) << "reduce (sum) element " << i;
    EXPECT_EQ(max.get(i), is_root ? expected_max : -1) << "reduce (max) element " << i;
    for (int64_t j = 0; j < n; ++j)
      EXPECT_EQ(gathered.get(j * kCount + i), is_root ? valueOf(team[j], i) : -1)
          << "gather: chunk " << j << " element " << i;
  }
}

TEST(Communicator, RootedCollectivesBlockingOnEveryTeam) {
  for (const Team& team : teamsOf(world())) checkRootedCollectives(world(), team, /*nonblocking=*/false);
}

TEST(Communicator, RootedCollectivesNonBlockingOnEveryTeam) {
  for (const Team& team : teamsOf(world())) checkRootedCollectives(world(), team, /*nonblocking=*/true);
}

TEST(Communicator, RootedCollectivesOnTheSelfCommunicator) {
  std::unique_ptr<Communicator> self = makeSelfCommunicator();
  checkRootedCollectives(*self, {0}, /*nonblocking=*/false);
  checkRootedCollectives(*self, {0}, /*nonblocking=*/true);
}

MPI_TEST(Communicator, RootOutsideTheTeamIsAnError, atLeast(2)) {
  Tensor t = valuesOf(worldRank());
  const int64_t other = (worldRank() + 1) % worldSize();
  try {
    world().broadcast(t.data(), kCount, DataType::Float, other, {worldRank()});
    FAIL() << "expected an error";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(),
                ::testing::HasSubstr(fmt::format("broadcast: root {} is not in team [{}]", other, worldRank())));
  }
}

}  // namespace
}  // namespace meshfuse::testing
