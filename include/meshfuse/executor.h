// The C++ API for custom trainers: run a single-device definition on this rank's shards.
//
//   Fusion def;                                   // single-device: no meshes, no placements
//   ... build it with ops:: ...
//   std::unique_ptr<Communicator> comm = makeDefaultCommunicator();   // mpi under mpirun
//   MultiDeviceExecutor exec(std::move(def), *comm);
//   DeviceMesh mesh({0, 1, 2, 3});
//   std::vector<ShardedTensor> outs = exec.run({
//       {inp_local, mesh, {Placement::replicate()}},
//       {up_w_local, mesh, {Placement::shard(0)}},
//       {down_w_local, mesh, {Placement::shard(1)}}});
//   // outs[0].local is this rank's block; outs[0].placements says how it is laid out.
//
// Compiled programs are cached per (mesh, placements) of every input; symbolic sizes are bound
// at run time from the local shapes, so a new batch size does not recompile, except for
// chunked programs (overlap, microbatches): their chunk counts are checked against (or chosen
// for) the sizes, so they are compiled per size (ExecutorOptions::pipeline.sizes also fixes sizes
// ahead of the first run).
#pragma once

#include <map>
#include <memory>
#include <set>
#include <vector>

#include "meshfuse/ir/device_mesh.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/placement.h"
#include "meshfuse/communicator.h"
#include "meshfuse/ir/collective.h"
#include "meshfuse/options.h"
#include "meshfuse/tensor.h"
#include "meshfuse/trace.h"

namespace meshfuse {

class Backend;               // src/runtime/backend.h
struct CompiledProgram;      // src/lower/pipeline.h
struct HostProgram;          // src/lower/host_ir.h

// One rank's block of a distributed tensor, with the layout that says where it belongs.
struct ShardedTensor {
  Tensor local;  // empty on a rank outside `mesh`
  DeviceMesh mesh;
  std::vector<Placement> placements;  // one per mesh axis
  // The global shape, needed only on a rank outside `mesh` (another pipeline stage) when the
  // fusion has symbolic sizes: it binds them there.
  std::vector<int64_t> global_shape = {};
};

struct ExecutorOptions {
  PipelineOptions pipeline;
  bool keep_stages = false;  // keep each stage's IR text in CompiledProgram::stages (for plan())
  bool trace = false;        // record each run's timeline (lastTrace())
  // A failure while a multi-rank program runs aborts the job (HostIrEvaluator::setAbortOnFailure):
  // turn off only where the caller can bring every rank down itself.
  bool abort_on_failure = true;
  // In a multi-rank world, the first run of each input signature (dtypes, shapes, meshes,
  // placements) first checks that every rank of the world was given the same one (one allgather
  // of 16 bytes per rank; every rank must call run()): a rank given other inputs then makes every
  // rank throw the same ValueError naming the input and which ranks had what, instead of leaving
  // the others waiting in a collective. A rank that alone moves to new inputs while the others
  // repeat a signature they agreed on is not caught (only that rank checks: it waits until
  // MESHFUSE_COMM_TIMEOUT). Off: the caller checks (Python's FusionDefinitionWrapper).
  bool check_inputs = true;
};

class MultiDeviceExecutor {
 public:
  // `definition` is the single-device fusion; its inputs' placements come with each run. Any
  // TensorView pinned with the schedule API keeps its pin. The programs run on the CPU backend.
  MultiDeviceExecutor(std::unique_ptr<Fusion> definition, Communicator& comm, ExecutorOptions options = {});
  // The same on a given backend (src/driver/backends.h: makeBackend("cuda"), ...; nullptr: CPU).
  MultiDeviceExecutor(std::unique_ptr<Fusion> definition, Communicator& comm, std::unique_ptr<Backend> backend,
                      ExecutorOptions options = {});
  ~MultiDeviceExecutor();

  // Runs this rank's program on its local blocks; returns this rank's output blocks with their
  // placements. Throws a UserError naming the input on a mismatch (count, dtype, rank, shape,
  // a mesh naming ranks the world lacks, a bad placement), identically on every rank.
  std::vector<ShardedTensor> run(const std::vector<ShardedTensor>& inputs);

  // A compiled program of the cache, for one input layout (opaque; it lives as long as the
  // executor). prepare() compiles it (or finds it) once; run(program, inputs) then skips the
  // lookup of the inputs' signature, as a front end that keeps one handle per call signature
  // does (Python's Prepared). Inputs the program was not compiled for (other placements, or other
  // sizes where the program depends on them) fall back to the lookup: a handle is never wrong.
  struct Program;
  Program& prepare(const std::vector<ShardedTensor>& inputs);
  std::vector<ShardedTensor> run(Program& program, const std::vector<ShardedTensor>& inputs);

  // Compiles (or finds in the cache) the program for inputs with these layouts, without running
  // (CompiledProgram and HostProgram are internals: src/lower/pipeline.h, src/lower/host_ir.h).
  const CompiledProgram& plan(const std::vector<ShardedTensor>& inputs);
  // This rank's host program for the given layouts.
  const HostProgram& programFor(const std::vector<ShardedTensor>& inputs);

  // The collectives of the last run(), in execution order.
  const std::vector<CollectiveInfo>& lastCollectives() const { return last_collectives_; }
  // The last run's timeline, with ExecutorOptions::trace (per stream: kernels, GEMMs,
  // collectives, waits).
  const std::vector<TraceEvent>& lastTrace() const { return last_trace_; }
  int64_t cacheSize() const { return static_cast<int64_t>(cache_.size()); }
  // The backend the programs run on (outputs live in its memory: download() them to the host).
  Backend& backend() { return *backend_; }
  const Fusion& definition() const { return *definition_; }

 private:
  using Entry = Program;
  struct Layout;
  Entry& entryFor(const std::vector<ShardedTensor>& inputs);
  // Whether `e` is the program for `inputs` (their placements, and sizes where they matter).
  bool serves(const Entry& e, const std::vector<ShardedTensor>& inputs) const;
  // The world has every rank the inputs' and the definition's meshes name (a MeshError if not).
  void checkWorld(const std::vector<ShardedTensor>& inputs) const;
  Entry& entryFor(const std::vector<ShardedTensor>& inputs, const std::string& key, const SymbolBindings& sizes,
                  bool sized);
  // run() with a program that may serve the inputs (nullptr: look it up); raw std:: exceptions
  // from inside become InternalErrors.
  std::vector<ShardedTensor> runGuarded(Entry* hint, const std::vector<ShardedTensor>& inputs);
  std::vector<ShardedTensor> runChecked(Entry* hint, const std::vector<ShardedTensor>& inputs);
  // ExecutorOptions::check_inputs (input_agreement.cpp).
  void agreeOnInputs(const std::vector<ShardedTensor>& inputs);

  std::unique_ptr<Fusion> definition_;
  Communicator& comm_;
  std::unique_ptr<Backend> backend_;
  ExecutorOptions options_;
  std::map<std::string, std::unique_ptr<Entry>> cache_;
  std::map<std::string, Layout> layouts_;  // per input layout (meshes + placements)
  Entry* last_ = nullptr;                  // the entry the last call used
  std::vector<CollectiveInfo> last_collectives_;
  std::vector<TraceEvent> last_trace_;
  std::set<uint64_t> agreed_;  // input signatures every rank agreed on (check_inputs)
};

// A definition whose inputs are placed by `layouts` (mesh + placements; a layout with an empty
// placements list leaves that input as the definition has it): a clone, ready for compile().
std::unique_ptr<Fusion> placeInputs(const Fusion& definition, const std::vector<ShardedTensor>& layouts);

// Rank `rank`'s block of the full tensor `full` laid out on `mesh` by `placements` (as
// torch.distributed.tensor.distribute_tensor: every rank passes the same full tensor). A rank
// outside the mesh gets an empty local tensor; a Partial axis gives the whole value to index 0.
ShardedTensor distributeTensor(const Tensor& full, const DeviceMesh& mesh, const std::vector<Placement>& placements,
                               int64_t rank);

// The layouts the inputs of `fusion` carry (mesh and placements), for fusions read from text.
std::vector<ShardedTensor> inputLayouts(const Fusion& fusion);

}  // namespace meshfuse
