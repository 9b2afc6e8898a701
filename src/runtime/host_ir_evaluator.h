// HostIrEvaluator: interprets a rank's host program over a Backend and a Communicator.
//
// The interpreter walks the nodes on the host thread and submits each piece of work (kernels,
// GEMMs, copies, collectives) as a task to the current stream of the backend's Streams; loops
// run their body once per trip with the loop variable bound; events order streams. A run ends
// by synchronizing every stream, so run() returns finished outputs.
#pragma once

#include <map>
#include <optional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "lower/host_ir.h"
#include "runtime/backend.h"
#include "meshfuse/communicator.h"
#include "meshfuse/tensor.h"

namespace meshfuse {

class CommunicationPlan;  // src/lower/check_collectives.h

class HostIrEvaluator {
 public:
  // `program` must be specialized for comm.rank().
  HostIrEvaluator(const HostProgram& program, Backend& backend, Communicator& comm);
  ~HostIrEvaluator();

  // Runs the program on this rank's local inputs (aligned with the fusion's inputs; a rank
  // outside an input's mesh passes an empty Tensor, and `global_shapes` then gives that input's
  // global shape so symbolic sizes can be bound). Returns the local outputs (empty for outputs
  // on meshes without this rank). Throws a UserError naming the input and both shapes when a
  // local input has the wrong shape or dtype.
  std::vector<Tensor> run(const std::vector<Tensor>& local_inputs,
                          const std::vector<std::vector<int64_t>>& global_shapes = {});

  // The collectives the last run executed, in issue order.
  const std::vector<CollectiveInfo>& executed() const { return executed_; }

  // Timeline of the next runs (see Streams::setTracing); takeTrace() returns the last run's.
  void setTracing(bool on);
  std::vector<TraceEvent> takeTrace();

  // With several ranks, a failure once the program runs may leave peers waiting in a collective
  // this rank will never join. When on (the default) and this rank's program communicates, such
  // a failure aborts the job through the communicator (every rank exits with this rank's
  // message) instead of being thrown. Failures while checking the inputs are always thrown.
  void setAbortOnFailure(bool on) { abort_on_failure_ = on; }

  // Every rank's communications as check-collectives proved them to match: with it, a watchdog
  // timeout reports where this rank is blocked in its team's sequence and which peers have not
  // arrived (the node each should be at). Without one the report names the collective only.
  void setCommunicationPlan(std::shared_ptr<const CommunicationPlan> plan) { plan_ = std::move(plan); }

 private:
  struct Handle;
  class IssueGate;
  // Submits work that, when it fails, poisons the issue gate, so that waiting communications fail
  // too (no hang). A template, so that the task and the failure handling are one closure: one
  // std::function per launch (the per-launch cost: benchmarks/results/runtime.md).
  template <class Task>
  void submit(TaskKind kind, const std::string& name, Task&& task) {
    streams_.submit(stream_, kind, name, [gate = gate_, task = std::forward<Task>(task)]() mutable {
      try {
        task();
      } catch (...) {
        poison(*gate);
        throw;
      }
    });
  }
  static void poison(IssueGate& gate);
  int64_t submitCommunication(const std::string& name, std::function<void()> issue);  // returns its ticket
  std::string describeWait(int64_t ticket) const;
  struct Executor;  // the std::visit dispatch of execute(): one operator() per node kind
  void execute(const std::vector<HostNode>& nodes);
  void allocate(const hir::Allocate& n);
  void launch(const hir::SegmentCall& n);
  void communicate(const hir::Communication& n);
  // The task that issues collective `n` (any kind but send/recv) on this rank's views `in` and
  // `out` and sets h's work; issueByCounts: those whose members' blocks go by counts (allgather,
  // reduce-scatter, scatter, gather).
  std::function<void()> issueCollective(const hir::Communication& n, const std::shared_ptr<Handle>& h, Tensor in,
                                        Tensor out);
  std::function<void()> issueByCounts(const hir::Communication& n, const std::shared_ptr<Handle>& h, Tensor in,
                                      Tensor out);
  // The task that issues all-to-all `n` (packing its blocks) and sets h's work and finish.
  std::function<void()> allToAll(const hir::Communication& n, const std::shared_ptr<Handle>& h, const Tensor& in,
                                 const Tensor& out);
  void sendRecv(const hir::Communication& n);
  void wait(const hir::Wait& n);
  void slice(const hir::ShardSlice& n);
  void copy(const hir::Copy& n);
  void loop(const hir::ForLoop& n);
  void waitEvent(const hir::EventNode& n, bool host);
  Tensor view(const BlockRef& ref);
  // The block `ref` names along dim `dim` of its buffer: the whole buffer, and the block's
  // offsets and sizes in it (a block along another dim than 0 is not contiguous).
  struct DimBlock {
    Tensor whole;
    std::vector<int64_t> offsets, sizes;
  };
  DimBlock blockAlong(const BlockRef& ref, int64_t dim);
  AttentionLaunch attentionLaunch(const hir::SegmentCall& n) const;
  std::optional<AttentionLaunch> causalQueryBlock(const Segment& seg);
  Tensor& value(const TensorView* tv, int64_t slot = 0);
  int64_t eventInstance(const hir::EventNode& n) const;
  std::vector<int64_t> loopValues() const;  // the enclosing loops' variables, outermost first
  // The elements each member of n's team passes for `ref` (v-collectives' counts).
  Counts memberCounts(const hir::Communication& n, const BlockRef& ref) const;
  std::string describe(const hir::SegmentCall& n) const;
  std::string describe(const hir::Communication& n) const;
  template <typename Node>
  std::string taskName(const Node& n) const {  // names matter only in timelines: building them costs
    return tracing_ ? describe(n) : std::string();
  }
  CollectiveInfo collectiveInfo(const hir::Communication& n, CommKind kind, const Team& team, int64_t bytes);

  const HostProgram& program_;
  Backend& backend_;
  Communicator& comm_;
  Streams& streams_;
  SymbolBindings bindings_;
  std::map<std::pair<const TensorView*, int64_t>, Tensor> values_;  // (tensor, slot)
  std::unique_ptr<BufferSizes> sizes_;  // blocks and buffers on every rank, for bindings_
  struct Loop {
    int64_t i, trips;
  };
  std::vector<Loop> loops_;   // enclosing loops, innermost last
  int64_t iteration() const;  // the enclosing loops' iterations counted together (row-major)
  int64_t stream_ = 0;
  std::map<std::pair<int64_t, int64_t>, std::shared_ptr<Handle>> handles_;  // (handle, iteration)
  std::map<std::pair<int64_t, int64_t>, std::shared_ptr<Event>> events_;    // (event, iteration)
  std::vector<CollectiveInfo> executed_;
  std::unordered_map<const hir::Communication*, CollectiveInfo> info_;
  std::shared_ptr<IssueGate> gate_;
  std::shared_ptr<const CommunicationPlan> plan_;
  int64_t run_serial_ = 0;  // which run of this process this is (the progress board's run)
  bool tracing_ = false;
  bool abort_on_failure_ = true;
  bool communicates_ = false;  // the program holds a communication (set at construction)
  Team program_ranks_;         // every rank of the fusion's meshes (empty when not among them)
  std::vector<Team> teams_;    // communicationTeams(): prepared before the first communication
  std::vector<TraceEvent> trace_;
};

// The teams a rank's host program communicates on, in the order Communicator::prepareTeams asks
// for (sorted): every collective's team of two or more ranks, and `program_ranks` (every rank of
// the fusion's meshes) when the program exchanges point to point with another rank (sendRecv's
// team).
std::vector<Team> communicationTeams(const HostProgram& program, const Team& program_ranks);

// The one size binding (the evaluator, the executor's cache, the Python programs): the values of
// the symbolic sizes of `fusion`'s inputs from their global shapes, one per input (an empty shape
// binds nothing). ShapeErrors name the input: a rank that is not the input's, a static dim the
// shape contradicts (checked for the `stated` shapes only, those a caller was given: a shape
// implied by a local block is checked block by block, with a better message), a size that no
// integer value of the symbol gives, one symbol given two values.
SymbolBindings bindSizes(const Fusion& fusion, const std::vector<std::vector<int64_t>>& global_shapes,
                         const std::vector<bool>& stated = {});
// The global shape a local block implies: each dim times its number of shards (exact for even
// shards only; rank -1: a full tensor, its own shape).
std::vector<int64_t> impliedGlobalShape(const TensorView* tv, const Tensor& local, int64_t rank);

// Binds symbolic sizes from local inputs (bindSizes): from `global_shapes[i]` when given (an input this rank
// does not hold, too), else a sharded dim's global size is its local size times the number of
// shards, which holds for even shards only (an uneven symbolic size needs its global shape).
// Checks dtypes, and that every local tensor is this rank's block of its global shape
// (localBlock: uneven shards as torch.chunk cuts them), naming the input and both shapes.
// rank -1: the tensors are full (unsharded) tensors and the shardings play no part (the
// reference executor).
SymbolBindings bindLocalInputs(const Fusion& fusion, const std::vector<Tensor>& local_inputs, int64_t rank,
                               const std::vector<std::vector<int64_t>>& global_shapes = {});

// The block of the full (global) tensor that `rank` holds for `tv`'s sharding (localBlock; an
// uneven shard may be empty). A Partial axis gives the whole value to the rank at index 0 along
// that axis and zeros to the others.
Tensor shardForRank(const TensorView* tv, const Tensor& full, int64_t rank);
// The global tensor from every rank's local block (`locals[r]` for global rank r; Partial axes
// are summed, replicated copies are taken from index 0 along the axis). The global size of a
// sharded dim is the sum of its blocks; a block that is not its rank's torch.chunk block of it
// is a ShapeError.
Tensor assembleGlobal(const TensorView* tv, const std::vector<Tensor>& locals);

}  // namespace meshfuse
