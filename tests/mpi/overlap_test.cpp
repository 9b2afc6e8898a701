// Communication/compute overlap (decompose-for-overlap): every chunked program computes what the
// undecomposed one does, with the collectives its algorithm implies; and the timeline of an
// overlapped run has communication running while compute runs.
#include <chrono>
#include <thread>

#include "meshfuse/ops.h"
#include "mpi_test_main.h"
#include "models.h"

namespace meshfuse::testing {
namespace {

using Strs = std::vector<std::string>;

ExecutorOptions overlap(const std::string& algorithm, int64_t chunks, bool trace = false) {
  ExecutorOptions o;
  o.pipeline.overlap.algorithm = algorithm;
  o.pipeline.overlap.chunks = chunks;
  o.trace = trace;
  return o;
}

std::vector<std::pair<DeviceMesh, Ps>> layouts(std::initializer_list<Ps> per_input) {
  std::vector<std::pair<DeviceMesh, Ps>> out;
  for (const Ps& p : per_input) out.emplace_back(worldMesh(), p);
  return out;
}

int64_t count(const std::vector<CollectiveInfo>& cs, const std::string& kind) {
  int64_t n = 0;
  for (const CollectiveInfo& c : cs) n += commKindName(c.kind) == kind;
  return n;
}

// Sequence-parallel MLP: allgather+GEMM, then GEMM+reduce-scatter.
ShardedRun sequenceParallelMlp(const ExecutorOptions& options) {
  Fusion f;
  models::buildMlp(f, 16);
  return runSharded(f, layouts({{S(0)}, {S(0)}, {S(1)}}), {{"s0", 16 * worldSize()}}, options);
}

TEST(Overlap, CollectiveBasedSequenceParallelMlp) {
  for (int64_t s : {1, 2, 4}) {
    SCOPED_TRACE(fmt::format("chunks {}", s));
    ShardedRun run = sequenceParallelMlp(overlap("collective", s));
    expectMatchesReference(run);
    const int64_t per_pair = worldSize() > 1 ? s : 0;  // one smaller collective per chunk
    EXPECT_EQ(count(run.collectives, "allgather"), per_pair);
    EXPECT_EQ(count(run.collectives, "reduce_scatter"), per_pair);
    EXPECT_EQ(run.collectives.size(), 2u * per_pair);
    EXPECT_EQ(run.local_outputs[0].placements, Ps{S(0)});
  }
}

TEST(Overlap, RingBasedSequenceParallelMlp) {
  for (int64_t c : {1, 2}) {  // chunks a multiple of the devices
    const int64_t s = c * worldSize();
    SCOPED_TRACE(fmt::format("chunks {}", s));
    ShardedRun run = sequenceParallelMlp(overlap("ring", s));
    expectMatchesReference(run);
    // n - 1 forwarding steps of c sub-chunks, for each of the two rings.
    EXPECT_EQ(count(run.collectives, "send_recv"), 2 * (worldSize() - 1) * c);
    EXPECT_EQ(run.collectives.size(), static_cast<size_t>(2 * (worldSize() - 1) * c));
  }
}

TEST(Overlap, RingNeedsChunksAMultipleOfTheDevices) {
  if (worldSize() == 1) GTEST_SKIP() << "no collective to overlap on one rank";
  Fusion f;
  models::buildMlp(f, 16);
  try {
    runSharded(f, layouts({{S(0)}, {S(0)}, {S(1)}}), {{"s0", 16 * worldSize()}}, overlap("ring", worldSize() + 1));
    ADD_FAILURE() << "expected a ValueError";
  } catch (const UserError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Value);
    EXPECT_THAT(e.message(), ::testing::HasSubstr(fmt::format(
                                 "ring-based overlap needs the number of chunks ({}) to be a multiple of the {} devices",
                                 worldSize() + 1, worldSize())));
  }
}

// Row-parallel linear: x [t, k] and w [n, k] sharded on k; the pending sum is all-reduced
// (output replicated) or reduce-scattered (output pinned Shard(0)).
ShardedRun rowParallel(bool scatter, const ExecutorOptions& options) {
  Fusion f;
  TensorView* x = f.defineTensor({-1, 32}, DataType::Float, "x");
  TensorView* w = f.defineTensor({24, 32}, DataType::Float, "w");
  TensorView* y = ops::linear(x, w);
  if (scatter) {
    y = ops::set(y);
    applyPlacements(y, worldMesh(), {S(0)});
  }
  f.addOutput(y);
  return runSharded(f, layouts({{S(1)}, {S(1)}}), {{"s0", 8 * worldSize()}}, options);
}

TEST(Overlap, RowParallelLinearWithChunkedAllreduceAndReduceScatter) {
  for (bool scatter : {false, true}) {
    for (std::string algorithm : {"collective", "ring"}) {
      SCOPED_TRACE(fmt::format("{} {}", scatter ? "reduce-scatter" : "allreduce", algorithm));
      const int64_t s = 2 * worldSize();
      ShardedRun run = rowParallel(scatter, overlap(algorithm, s));
      expectMatchesReference(run);
      if (worldSize() == 1) continue;
      if (algorithm == "collective") {
        EXPECT_EQ(count(run.collectives, scatter ? "reduce_scatter" : "allreduce"), s);
      } else {
        // A reduce-scatter ring (n - 1 steps), plus an allgather ring for the allreduce.
        EXPECT_EQ(count(run.collectives, "send_recv"), (scatter ? 1 : 2) * (worldSize() - 1) * 2);
      }
    }
  }
}

// A backend whose every segment takes a while: compute is long enough that the timeline shows
// whether communication ran beside it (the results are not checked with it).
class SlowBackend final : public Backend {
 public:
  std::string name() const override { return "slow"; }
  Tensor allocate(DataType dt, const std::vector<int64_t>& shape) override { return Tensor(dt, shape); }
  void runSegment(const Segment&, const std::vector<const Tensor*>&, const std::vector<Tensor*>&,
                  const ShapeFn&) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
};

TEST(Overlap, TimelineOfARingShowsCommunicationBesideCompute) {
  if (worldSize() == 1) GTEST_SKIP() << "no communication on one rank";
  Fusion f;
  models::buildMlp(f, 16);
  ShardedRun run = runSharded(f, layouts({{S(0)}, {S(0)}, {S(1)}}), {{"s0", 16 * worldSize()}},
                              overlap("ring", worldSize(), /*trace=*/true), std::make_unique<SlowBackend>());
  bool compute_on_main = false, comm_beside = false;
  for (const TraceEvent& e : run.trace) {
    compute_on_main |= e.kind == TaskKind::Compute && e.stream == 0;
    comm_beside |= e.kind == TaskKind::Communication && e.stream != 0;
  }
  EXPECT_TRUE(compute_on_main);
  EXPECT_TRUE(comm_beside);
  OverlapSummary sum = summarizeOverlap(run.trace);
  EXPECT_GT(sum.hidden_us, 0) << "no communication interval intersects a compute interval";
  if (worldRank() == 0)
    std::printf("[ overlap  ] compute %.0f us, communication %.0f us, hidden %.0f%%\n", sum.compute_us,
                sum.communication_us, 100 * sum.hiddenFraction());
}

}  // namespace
}  // namespace meshfuse::testing
