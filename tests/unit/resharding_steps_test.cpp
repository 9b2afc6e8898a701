// The order of single-axis resharding steps: splits of one dim nest in mesh-axis order, so they
// are taken away inner axes first and added outer axes first.
#include <gtest/gtest.h>

#include "decompose/resharding_steps.h"

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
  // An all-to-all stays one step only when no other axis splits either dim.
  EXPECT_EQ(steps({S(0), S(1)}, {S(1), S(1)}), (std::vector<Ps>{{S(0), R}, {R, R}, {S(1), R}, {S(1), S(1)}}));
  EXPECT_EQ(steps({S(0), R}, {S(1), R}), (std::vector<Ps>{{S(1), R}}));
}

}  // namespace
}  // namespace meshfuse
