// The order of single-axis resharding steps: splits of one dim nest in mesh-axis order, so they
// are taken away inner axes first and added outer axes first.
#include "decompose/resharding_steps.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "meshfuse/ir/fusion.h"
#include "test_helpers.h"

namespace meshfuse {

void PrintTo(const Placement& p, std::ostream* os) { *os << p.toString(); }

namespace {

using Ps = std::vector<Placement>;
const Placement R = Placement::replicate();
const Placement P = Placement::partial();
Placement S(int64_t d) { return Placement::shard(d); }

std::vector<Ps> steps(const Ps& from, const Ps& to) {
  std::vector<Ps> out;
  for (const Sharding& s : reshardingSteps({0, from}, {0, to})) out.push_back(s.axes);
  return out;
}

TEST(ReshardingSteps, OneAxisIsOneStep) {
  EXPECT_EQ(steps({S(0)}, {R}), (std::vector<Ps>{{R}}));
  EXPECT_EQ(steps({R}, {S(1)}), (std::vector<Ps>{{S(1)}}));
  EXPECT_EQ(steps({S(0)}, {S(1)}), (std::vector<Ps>{{S(1)}})) << "one all-to-all";
  EXPECT_EQ(steps({P}, {S(0)}), (std::vector<Ps>{{S(0)}})) << "one reduce-scatter";
  EXPECT_EQ(steps({P}, {R}), (std::vector<Ps>{{R}}));
  EXPECT_TRUE(steps({S(0), R}, {S(0), R}).empty());
}

// Replicate -> Partial is one local step (the first device keeps the value, the others hold
// zeros), and sends nothing; other axes' moves nest around it as usual.
TEST(ReshardingSteps, AWholeValueBecomesAPendingSumLocally) {
  EXPECT_EQ(steps({R}, {P}), (std::vector<Ps>{{P}}));
  EXPECT_EQ(steps({S(0), R}, {R, P}), (std::vector<Ps>{{R, R}, {R, P}}));
  Fusion f;
  const int64_t mesh = f.addMesh(DeviceMesh({0, 1}));
  TensorView* x = f.defineTensor({4, 8}, DataType::Float, "x");
  EXPECT_EQ(wireBytes(f, x, {mesh, {R}}, {mesh, {P}}), 0);
  EXPECT_EQ(wireBytes(f, x, {mesh, {S(0)}}, {mesh, {P}}), std::nullopt) << "a split value does not become one";
}

TEST(ReshardingSteps, MovingADimToTheOuterAxisGathersTheInnerFirst) {
  // Slicing axis 0 while axis 1 still splits dim 1 would take a block this rank does not hold.
  EXPECT_EQ(steps({R, S(1)}, {S(1), R}), (std::vector<Ps>{{R, R}, {S(1), R}}));
  EXPECT_EQ(steps({S(1), R}, {R, S(1)}), (std::vector<Ps>{{R, R}, {R, S(1)}}));
}

TEST(ReshardingSteps, NestedSplitsOfOneDim) {
  // Gathering the outer split while the inner one stays would interleave blocks.
  EXPECT_EQ(steps({S(1), S(1)}, {R, S(1)}), (std::vector<Ps>{{S(1), R}, {R, R}, {R, S(1)}}));
  // Adding an inner split under an outer one is a slice of the rank's block.
  EXPECT_EQ(steps({S(0), R}, {S(0), S(0)}), (std::vector<Ps>{{S(0), S(0)}}));
  EXPECT_EQ(steps({S(0), S(0)}, {S(0), R}), (std::vector<Ps>{{S(0), R}}));
}

TEST(ReshardingSteps, IndependentDimsAndPendingSums) {
  EXPECT_EQ(steps({S(0), S(1)}, {R, R}), (std::vector<Ps>{{S(0), R}, {R, R}}));
  EXPECT_EQ(steps({S(0), P}, {S(0), R}), (std::vector<Ps>{{S(0), R}}));
  // An all-to-all is one step only when no other axis splits either dim: axis 1's split of dim 1
  // is gathered first, then axis 0 moves from dim 0 to dim 1 by one all-to-all (its blocks are then
  // the innermost split of both), and axis 1 slices dim 1 again.
  EXPECT_EQ(steps({S(0), S(1)}, {S(1), S(1)}), (std::vector<Ps>{{S(0), R}, {S(1), R}, {S(1), S(1)}}));
  EXPECT_EQ(steps({S(0), R}, {S(1), R}), (std::vector<Ps>{{S(1), R}}));
}

// planResharding between meshes: each step as "<mesh> <placements>: <what>".
std::vector<std::string> plan(Fusion& f, const DeviceMesh& a, const Ps& from, const DeviceMesh& b, const Ps& to) {
  std::vector<std::string> out;
  for (const ReshardingStep& s : planResharding(f, nullptr, {f.addMesh(a), from}, {f.addMesh(b), to}, "%x"))
    out.push_back(fmt::format("{} {}: {}", f.mesh(s.to.mesh).toString(), toString(s.to), s.what));
  return out;
}

using Strs = std::vector<std::string>;

std::vector<Ps> sizedSteps(const Ps& from, const Ps& to, const std::vector<int64_t>& sizes) {
  std::vector<Ps> out;
  for (const Sharding& s : reshardingSteps({0, from}, {0, to}, sizes)) out.push_back(s.axes);
  return out;
}

// Given the mesh's sizes, the order of fewest collectives, then fewest bytes, where it beats the
// nesting order (the placement fuzzer's 2x2 oracle found both: s1-w4-c343, s1-w4-c79).
TEST(ReshardingSteps, WithTheMeshSizesACheaperOrderIsTaken) {
  // Slice first, then all-reduce half the value on each team of axis 0.
  EXPECT_EQ(steps({P, R}, {R, S(1)}), (std::vector<Ps>{{R, R}, {R, S(1)}}));
  EXPECT_EQ(sizedSteps({P, R}, {R, S(1)}, {2, 2}), (std::vector<Ps>{{P, S(1)}, {R, S(1)}}));
  // A pending sum is reduced before the other axis gathers (not whole values after it).
  EXPECT_EQ(steps({P, S(0)}, {R, R}), (std::vector<Ps>{{P, R}, {R, R}}));
  EXPECT_EQ(sizedSteps({P, S(0)}, {R, R}, {2, 2}), (std::vector<Ps>{{R, S(0)}, {R, R}}));
  // Ties keep the nesting order; a 1-D mesh has one order.
  EXPECT_EQ(sizedSteps({S(1), S(1)}, {R, S(1)}, {2, 2}), steps({S(1), S(1)}, {R, S(1)}));
  EXPECT_EQ(sizedSteps({S(0)}, {S(1)}, {4}), (std::vector<Ps>{{S(1)}}));
  // wireBytes measures the order taken: x [4, 8] f32 (128 bytes), the allreduce of 64-byte
  // halves on two teams of two (64 bytes sent per rank), times the 4 devices.
  Fusion f;
  const int64_t mesh = f.addMesh(DeviceMesh({0, 1, 2, 3}, {2, 2}));
  TensorView* x = f.defineTensor({4, 8}, DataType::Float, "x");
  EXPECT_EQ(wireBytes(f, x, {mesh, {P, R}}, {mesh, {R, S(1)}}), 4 * 256);
}

// By bytes (Fusion::reshardByBytes), an order of more collectives that sends less is taken, and
// its intermediate placements may split a dim neither side splits: a pending sum is
// reduce-scattered along one so that it travels reduced (the placement fuzzer's s2-w4-u40-c332).
TEST(ReshardingSteps, ByBytesAPendingSumIsReducedBeforeItTravels) {
  Fusion f;
  const int64_t mesh = f.addMesh(DeviceMesh({0, 1, 2, 3}, {2, 2}));
  TensorView* x = f.defineTensor({4, 8}, DataType::Float, "x");
  const Sharding from{mesh, {P, S(0)}}, to{mesh, {S(0), R}};
  // By collectives: the pending sums gathered, then reduce-scattered (2 collectives, each rank
  // sending 64 bytes in each: 512 bytes over the ranks, times the 4 devices).
  EXPECT_EQ(sizedSteps({P, S(0)}, {S(0), R}, {2, 2}), (std::vector<Ps>{{P, R}, {S(0), R}}));
  EXPECT_EQ(wireBytes(f, x, from, to), 4 * 512);
  // By bytes: three collectives through a split of dim 1, which neither side splits, 384 bytes.
  std::vector<Ps> by_bytes;
  for (const Sharding& s : reshardingSteps(from, to, {2, 2}, true, {4, 8})) by_bytes.push_back(s.axes);
  EXPECT_EQ(by_bytes.size(), 3u);
  EXPECT_EQ(by_bytes.back(), (Ps{S(0), R}));
  EXPECT_TRUE(std::any_of(by_bytes.begin(), by_bytes.end(), [](const Ps& p) { return p[0] == S(1) || p[1] == S(1); }));
  f.setReshardByBytes(true);
  EXPECT_EQ(wireBytes(f, x, from, to), 4 * 384);
  // Without the value's extents no other dim is known, and a 1-D mesh has one order.
  EXPECT_EQ(reshardingSteps(from, to, {2, 2}, true).size(), 2u);
  EXPECT_EQ(reshardingSteps({0, {P}}, {0, {S(0)}}, {4}, true, {4, 8}).size(), 1u);
}

// wireBytes counts torch.chunk's uneven blocks exactly: 5 floats on 3 ranks are blocks of 2, 2
// and 1, each rank sending its block to the other two (times the 3 devices).
TEST(ReshardingSteps, WireBytesCountsUnevenBlocksExactly) {
  Fusion f;
  const int64_t mesh = f.addMesh(DeviceMesh({0, 1, 2}));
  TensorView* x = f.defineTensor({5}, DataType::Float, "x");
  EXPECT_EQ(wireBytes(f, x, {mesh, {S(0)}}, {mesh, {R}}), 3 * (2 * (8 + 8 + 4)));
  EXPECT_EQ(wireBytes(f, x, {mesh, {P}}, {mesh, {S(0)}}), 2 * (20 + 20 + 20)) << "each rank's whole pending sum";
}

TEST(PlanResharding, FromOneDeviceBroadcastsOrScatters) {
  Fusion f;
  const DeviceMesh one({0}), four({0, 1, 2, 3}), grid({0, 1, 2, 3}, {2, 2});
  EXPECT_EQ(plan(f, one, {R}, four, {R}),
            (Strs{"[0, 1, 2, 3] [Replicate()]: broadcast from stage [0] to stage [0, 1, 2, 3]"}));
  EXPECT_EQ(plan(f, one, {R}, four, {S(1)}),
            (Strs{"[0, 1, 2, 3] [Shard(1)]: scattered from stage [0] over stage [0, 1, 2, 3]"}));
  // N-d with Shard axes: broadcast, then local slices (outer axis first).
  EXPECT_EQ(plan(f, one, {R}, grid, {S(0), S(1)}),
            (Strs{"[[0, 1], [2, 3]] [Replicate(), Replicate()]: broadcast from stage [0] to stage [[0, 1], [2, 3]]",
                  "[[0, 1], [2, 3]] [Shard(0), Replicate()]: Replicate() -> Shard(0) on mesh axis 0",
                  "[[0, 1], [2, 3]] [Shard(0), Shard(1)]: Replicate() -> Shard(1) on mesh axis 1"}));
}

TEST(PlanResharding, ARootOutsideTheTeamIsReachedThroughASingleDeviceMesh) {
  Fusion f;
  const DeviceMesh zero({0}), rest({1, 2, 3}), two({0, 1}), three({3});
  EXPECT_EQ(plan(f, zero, {R}, rest, {R}),
            (Strs{"[1] [Replicate()]: moved from stage [0] to stage [1]",
                  "[1, 2, 3] [Replicate()]: broadcast from stage [1] to stage [1, 2, 3]"}));
  EXPECT_EQ(plan(f, two, {S(0)}, three, {R}), (Strs{"[0] [Replicate()]: gathered from stage [0, 1] to stage [0]",
                                                    "[3] [Replicate()]: moved from stage [0] to stage [3]"}));
  EXPECT_EQ(plan(f, two, {P}, DeviceMesh({1}), {R}),
            (Strs{"[1] [Replicate()]: reduced from stage [0, 1] to stage [1]"}));
  // A replicated value: a copy on a device of the mesh, else one send from its first device.
  EXPECT_EQ(plan(f, two, {R}, DeviceMesh({1}), {R}),
            (Strs{"[1] [Replicate()]: copied from stage [0, 1] to stage [1]"}));
  EXPECT_EQ(plan(f, two, {R}, three, {R}), (Strs{"[3] [Replicate()]: sent from stage [0, 1] to stage [3]"}));
}

TEST(PlanResharding, ToOneDeviceKeepsOnlyTheOutermostSplitForTheGather) {
  Fusion f;
  const DeviceMesh grid({0, 1, 2, 3}, {2, 2}), zero({0});
  EXPECT_EQ(plan(f, grid, {S(0), S(1)}, zero, {R}),
            (Strs{"[[0, 1], [2, 3]] [Shard(0), Replicate()]: Shard(1) -> Replicate() on mesh axis 1",
                  "[0] [Replicate()]: gathered from stage [[0, 1], [2, 3]] to stage [0]"}));
  // A pending sum on the inner axis is reduced over it alone; the replicas along axis 0 stay out.
  EXPECT_EQ(plan(f, grid, {R, P}, zero, {R}),
            (Strs{"[0] [Replicate()]: reduced from stage [[0, 1], [2, 3]] to stage [0]"}));
}

TEST(PlanResharding, TwoMultiDeviceMeshesOfDifferentShapesAreUnsupported) {
  Fusion f;
  EXPECT_THAT(
      testing_helpers::userErrorMessage(ErrorKind::Unsupported,
                                        [&] {
                                          plan(f, DeviceMesh({0, 1}), {S(0)}, DeviceMesh({0, 1, 2}), {R});
                                        }),
      ::testing::HasSubstr("%x: cannot move from [Shard(0)] on mesh [0, 1] to [Replicate()] on mesh [0, 1, 2]"));
}

}  // namespace
}  // namespace meshfuse
