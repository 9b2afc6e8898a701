// Shared helpers of the multi-rank tests (run under `mpirun -np N`, own main()):
// a world communicator, running a definition sharded across the world, gathering outputs
// everywhere and comparing them with single-device execution.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "meshfuse/executor.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/placement.h"
#include "meshfuse/reference.h"
#include "meshfuse/communicator.h"
#include "runtime/host_ir_evaluator.h"

namespace meshfuse::testing {

// The world communicator of this test process (created once by main()).
Communicator& world();
inline int64_t worldSize() { return world().size(); }
inline int64_t worldRank() { return world().rank(); }
// A 1-D mesh over every rank.
inline DeviceMesh worldMesh() {
  std::vector<int64_t> ids(worldSize());
  std::iota(ids.begin(), ids.end(), 0);
  return DeviceMesh(ids);
}

// The world sizes a multi-rank test runs at. A test that needs particular sizes (2x2 meshes, a
// ring, three pipeline stages) declares them where it is defined, with MPI_TEST below, instead of
// skipping at run time inside a ctest entry that then shows Passed: the MPI main runs it only at
// those sizes and lists it as not run at the others, and `--world-coverage` (the ctest entry
// mpi_world_coverage) fails when some test runs in none of the launches ctest makes.
struct WorldSizes {
  int64_t min = 1;
  int64_t max = std::numeric_limits<int64_t>::max();
  std::string why;  // what the sizes are for ("a 2x2 mesh"); may be empty
  bool accepts(int64_t n) const { return n >= min && n <= max; }
  std::string describe() const;  // "needs 4 ranks (a 2x2 mesh)", "needs at least 2 ranks"
};
inline WorldSizes atLeast(int64_t n, std::string why = "") {
  return {n, std::numeric_limits<int64_t>::max(), std::move(why)};
}
inline WorldSizes exactly(int64_t n, std::string why = "") { return {n, n, std::move(why)}; }
// Records `sizes` for the test "Suite.Name" (before main, from MPI_TEST); returns true.
bool declareWorldSizes(const char* test, WorldSizes sizes);

using Ps = std::vector<Placement>;
inline Placement S(int64_t d) { return Placement::shard(d); }
inline const Placement R = Placement::replicate();
inline const Placement P = Placement::partial();

struct ShardedRun {
  std::vector<Tensor> full_inputs;
  std::vector<Tensor> reference;  // single-device outputs of the definition
  std::vector<Tensor> gathered;   // the sharded outputs, assembled from every rank's block
  std::vector<ShardedTensor> local_outputs;
  std::vector<CollectiveInfo> collectives;  // executed by this rank
  std::vector<CollectiveInfo> reported;     // this rank's program's static report (collectives())
  int64_t peak_estimate = 0;                // peakMemoryBytes of this rank's program
  int64_t input_bytes = 0;                  // this rank's blocks of the inputs
  std::shared_ptr<Fusion> compiled;         // the decomposed fusion
  std::vector<TraceEvent> trace;            // with options.trace
};

// Runs `definition` with seeded random inputs (shapes from `sizes` for symbolic dims) placed by
// `layouts` (one per input: mesh + placements); every rank gathers every output.
ShardedRun runSharded(const Fusion& definition, const std::vector<std::pair<DeviceMesh, Ps>>& layouts,
                      const SymbolBindings& sizes = {}, const ExecutorOptions& options = {},
                      std::unique_ptr<Backend> backend = nullptr);

// Every rank's `local` block of a tensor of `dims` dims and `dtype` (any shape: uneven shards; an
// undefined tensor, on a rank that holds none, counts as empty), indexed by global rank, on
// every rank (collective over the world).
std::vector<Tensor> everyRanksBlock(const Tensor& local, int64_t dims, DataType dtype);

// Kinds of the collectives, in execution order: "allreduce", "allgather", ...
std::vector<std::string> kinds(const std::vector<CollectiveInfo>& cs);
// Asserts every gathered output matches the reference within dtype tolerance.
void expectMatchesReference(const ShardedRun& run);

// The CPU backend, counting the bytes of the buffers it handed out that are still alive (a
// buffer lives while any tensor or task holds it): what a rank really holds, to hold
// peakMemoryBytes against. The counts outlive the backend (an executor owns it).
struct MemoryCounts {
  std::atomic<int64_t> live{0}, peak{0};
};
class CountingBackend final : public Backend {
 public:
  explicit CountingBackend(std::shared_ptr<MemoryCounts> counts) : counts_(std::move(counts)) {}
  std::string name() const override { return "counting cpu"; }
  Tensor allocate(DataType dtype, const std::vector<int64_t>& shape) override;
  void runSegment(const Segment& seg, const std::vector<const Tensor*>& inputs, const std::vector<Tensor*>& outputs,
                  const ShapeFn& shape_of) override {
    inner_->runSegment(seg, inputs, outputs, shape_of);
  }
  void copy(Tensor& dst, const Tensor& src) override { inner_->copy(dst, src); }
  void accumulate(Tensor& dst, const Tensor& src) override { inner_->accumulate(dst, src); }
  Streams& streams() override { return inner_->streams(); }

 private:
  std::unique_ptr<Backend> inner_ = makeCpuBackend();
  std::shared_ptr<MemoryCounts> counts_;
};

// Asserts a static collectives report (meshfuse collectives) lists what a run executed: the
// same collectives in the same order, with the same teams, bytes, tensors and provenance.
void expectSameCollectives(const std::vector<CollectiveInfo>& reported, const std::vector<CollectiveInfo>& executed);

// The message of the UserError `fn` throws (and checks its kind), or "" when it throws none.
std::string errorOf(ErrorKind kind, const std::function<void()>& fn);

}  // namespace meshfuse::testing

// TEST(suite, name) that runs only at the world sizes `sizes` accepts: atLeast(n, why) or
// exactly(n, why).
#define MPI_TEST(suite, name, sizes)                                                     \
  [[maybe_unused]] static const bool suite##_##name##_world_sizes =                      \
      ::meshfuse::testing::declareWorldSizes(#suite "." #name, ::meshfuse::testing::sizes); \
  TEST(suite, name)

