// `meshfuse run` (except --reference): every rank runs its host program on its shard of the
// seeded inputs (a fusion without meshes: one rank, the whole inputs); rank 0 gathers the outputs
// and, with --check, compares them with single-device execution of the same definition.
//
// Two communicators: the programs run on the *data* communicator, which moves the backend's
// buffers (on a GPU: NCCL, which takes device memory only, or MPI over host-staged device
// buffers); the CLI's own messages -- outputs downloaded to the host and gathered on rank 0, the
// timelines, the exit code -- go over the *control* communicator (MPI or self, host memory). With
// a CPU backend both are one.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>

#include "cli_common.h"
#include "meshfuse/executor.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/npy.h"
#include "meshfuse/reference.h"
#include "meshfuse/trace.h"
#include "meshfuse/communicator.h"
#include "runtime/cuda.h"
#include "runtime/host_ir_evaluator.h"
#include "runtime/memory.h"

namespace meshfuse::cli {
namespace {

// Rank 0 receives every rank's block of `tv` (ranks outside its mesh hold none) and assembles
// the global tensor; other ranks send theirs and get an empty tensor back.
Tensor gatherGlobal(Communicator& comm, const TensorView* tv, const Tensor& local, const SymbolBindings& bindings) {
  const DeviceMesh* mesh = tv->mesh();
  if (mesh == nullptr) return comm.rank() == 0 ? local : Tensor();
  if (comm.rank() != 0) {
    if (mesh->contains(comm.rank())) comm.send(local.data(), local.numel(), local.dtype(), 0, /*tag=*/7)->wait();
    return Tensor();
  }
  std::vector<Tensor> blocks(comm.size());
  for (int64_t r : mesh->devices()) {
    if (r == 0) {
      blocks[r] = local;
      continue;
    }
    blocks[r] = Tensor(tv->dtype(), localShape(tv, bindings, r));
    comm.recv(blocks[r].data(), blocks[r].numel(), tv->dtype(), r, /*tag=*/7)->wait();
  }
  return assembleGlobal(tv, blocks);
}

Team everyone(int64_t world) {
  Team t(world);
  for (int64_t r = 0; r < world; ++r) t[r] = r;
  return t;
}

// Ranks 0..max device id of every mesh (input placements and pins alike, e.g. a pipeline stage
// reached through a `set`) must exist, and no more. A fusion without meshes runs on one.
void checkWorldSize(const Fusion& definition, int64_t world) {
  const bool single_device = definition.numMeshes() == 0;
  const int64_t covered = single_device ? 1 : definition.worldSizeNeeded();  // inputs' meshes included
  MF_USER_CHECK(world == covered || !single_device, ErrorKind::Mesh,
                "world size {}, but the fusion has no mesh: it runs on one device (without mpirun)", world);
  MF_USER_CHECK(world == covered, ErrorKind::Mesh,
                "world size {} but the meshes of {} name ranks up to {}: launch with mpirun -np {}", world,
                definition.numMeshes() == 1 ? "the fusion" : "its tensors", covered - 1, covered);
}

// Memory is each machine's own: what cannot be allocated here is reported by every rank, naming
// the tensor, before anything is allocated or run (memory.h). mpirun ends the job when the first
// rank exits non-zero, so the ranks agree first: true when every rank can allocate its part (and
// a rank whose machine has room learns that another has not).
bool everyRankCanAllocate(const Fusion& definition, const ShardedRunOptions& o, const SymbolBindings& sizes,
                          const CompiledProgram& compiled, const Backend& backend, Communicator& control) {
  const int64_t rank = control.rank(), world = control.size();
  std::string too_large;
  try {
    if (o.npy_inputs.empty())  // (.npy inputs are read whole: their size is the file's)
      for (size_t i = 0; i < definition.inputs().size(); ++i) {
        const TensorView* tv = definition.inputs()[i];
        checkAllocation(fmt::format("input {} ({}) whole (it is made on every rank, then sharded)", i,
                                    definition.displayName(tv)),
                        tv->dtype(), tv->evaluateShape(sizes), hostMemoryLimit());
      }
    checkProgramAllocations(compiled.host, sizes, backend.memoryLimit());
  } catch (const UserError& e) {
    too_large = fmt::format("{}: {}", errorKindName(e.kind()), e.message());
    // One write per line: mpirun forwards the ranks' output as it comes, in pieces.
    std::cerr << (world > 1 ? fmt::format("meshfuse: rank {} of {}: {}\n", rank, world, too_large)
                            : fmt::format("meshfuse: {}\n", too_large))
              << std::flush;
  }
  if (world == 1) return too_large.empty();
  int64_t mine = too_large.empty() ? 0 : 1, any = 0;
  control.allreduce(&mine, &any, 1, DataType::Int64, ReduceOp::Max, everyone(world))->wait();
  if (any != 0 && too_large.empty())
    std::cerr << fmt::format(
        "meshfuse: rank {} of {}: stops: another rank cannot allocate a tensor of this program (its message "
        "says which)\n",
        rank, world);
  return any == 0;
}

// --trace: every rank's timeline of the last run, gathered on rank 0, written as one Chrome trace,
// and each rank's hidden fraction of communication printed.
void writeTimelines(Communicator& control, const MultiDeviceExecutor& exec, const std::string& trace_file) {
  std::vector<std::vector<TraceEvent>> traces = gatherTraces(control, exec.lastTrace());
  if (control.rank() != 0) return;
  std::ofstream(trace_file) << chromeTraceJson(traces);
  std::cout << fmt::format(
      "== timeline of every rank (a warm run, after one warm-up run) written to {} (open it in "
      "https://ui.perfetto.dev)\n",
      trace_file);
  for (size_t r = 0; r < traces.size(); ++r) {
    OverlapSummary sum = summarizeOverlap(traces[r]);
    std::cout << fmt::format(
        "  rank {}: compute {:.0f} us, communication {:.0f} us, {:.0f}% of it hidden "
        "behind compute",
        r, sum.compute_us, sum.communication_us, 100 * sum.hiddenFraction());
    // Causal ring attention: its rotation apart from the balance exchanges nothing can hide.
    if (std::any_of(traces[r].begin(), traces[r].end(), isCausalBalanceExchange)) {
      OverlapSummary rest = summarizeOverlap(traces[r], [](const TraceEvent& e) { return !isCausalBalanceExchange(e); });
      std::cout << fmt::format("; without causal balance's exchanges ({:.0f} us): {:.0f} us, {:.0f}% hidden",
                               sum.communication_us - rest.communication_us, rest.communication_us,
                               100 * rest.hiddenFraction());
    }
    std::cout << "\n";
  }
}

// Gathers every output on rank 0, prints it (and saves it with --save), and with --check compares
// it with single-device execution. Rank 0's verdict; true on the other ranks.
bool reportOutputs(const Fusion& definition, const Fusion& compiled, const ShardedRunOptions& o,
                   const std::vector<Tensor>& full, const SymbolBindings& sizes, MultiDeviceExecutor& exec,
                   const std::vector<ShardedTensor>& outs, Communicator& control) {
  const bool rank0 = control.rank() == 0, single_device = definition.numMeshes() == 0;
  std::vector<Tensor> reference;
  if (o.check && rank0) reference = evaluateReference(definition, full);
  if (!o.save_dir.empty() && rank0) createOutputDirectory(o.save_dir);
  bool ok = true;
  for (size_t i = 0; i < outs.size(); ++i) {
    const TensorView* tv = compiled.outputs()[i];
    Tensor local = outs[i].local.defined() ? exec.backend().download(outs[i].local) : outs[i].local;
    Tensor global = gatherGlobal(control, tv, local, sizes);
    if (!rank0) continue;
    // (A fusion without meshes has no placements to show: its outputs are whole on the device.)
    std::cout << fmt::format("output {} {}: {}{}{}  {}\n", i, compiled.displayName(tv), dtypeName(tv->dtype()),
                             global.shapeString(), single_device ? "" : " " + placementsToString(outs[i].placements),
                             summary(global));
    if (!o.save_dir.empty()) writeNpy(fmt::format("{}/output{}.npy", o.save_dir, i), global);
    if (!o.check) continue;
    ReferenceComparison c = compareWithReference(global, reference[i]);
    std::cout << fmt::format(
        "  vs single device: max abs err {:.3g} (max rel err {:.3g}); allowed per element "
        "{:g} eps x (max|ref| + |ref|) with eps({}) = {:.3g}, max|ref| = {:.3g}: {:.3g} + {:.3g} "
        "x |ref|: {}\n",
        c.max_abs_err, c.max_rel_err, kReferenceToleranceEps, dtypeName(tv->dtype()), dtypeEpsilon(tv->dtype()),
        c.max_ref, c.allowed_abs, kReferenceToleranceEps * dtypeEpsilon(tv->dtype()), c.pass ? "OK" : "MISMATCH");
    ok &= c.pass;
  }
  if (o.check && rank0) std::cout << (ok ? "check passed\n" : "check FAILED\n") << std::flush;
  return ok;
}

}  // namespace

RunEnvironment defaultRunEnvironment() {
  RunEnvironment env;
  env.control = [] { return makeDefaultCommunicator(); };
  env.backend = [](const std::string& device) { return makeBackend(device); };
  env.data = [](const Backend& backend) -> std::unique_ptr<Communicator> {
    if (backend.device() != Device::Cuda) return nullptr;
    // Device buffers travel by NCCL, or through pinned host memory when ranks share a GPU; over a
    // world communicator of their own, so that no program message can match a control one.
    return makeCudaCommunicator(makeDefaultCommunicator());
  };
  return env;
}

int runSharded(const Fusion& definition, const ShardedRunOptions& o) {
  return runSharded(definition, o, defaultRunEnvironment());
}

int runSharded(const Fusion& definition, const ShardedRunOptions& o, const RunEnvironment& env) {
  std::unique_ptr<Communicator> control = env.control();
  std::unique_ptr<Communicator> data;  // null: the programs run on `control`
  Communicator* comm = control.get();  // what the programs run on
  const int64_t rank = control->rank(), world = control->size();
  std::vector<ShardedTensor> inputs = inputLayouts(definition);
  std::unique_ptr<MultiDeviceExecutor> exec;
  std::vector<Tensor> full;
  SymbolBindings sizes;
  // Compile-time problems are found identically on every rank: rank 0 reports, all exit 1.
  try {
    checkWorldSize(definition, world);
    sizes = completeBindings(definition, o.sizes, rank == 0);
    ExecutorOptions options{.pipeline = o.pipeline, .trace = !o.trace_file.empty()};
    options.pipeline.sizes = sizes;  // chunk counts checked (or chosen) here, on every rank alike
    std::unique_ptr<Backend> backend = env.backend(o.device);
    data = env.data(*backend);
    if (data) comm = data.get();
    exec = std::make_unique<MultiDeviceExecutor>(definition.clone(), *comm, std::move(backend), options);
    if (!everyRankCanAllocate(definition, o, sizes, exec->plan(inputs), exec->backend(), *control)) return 1;
    full = makeInputs(definition, o.npy_inputs, sizes, o.seed);
  } catch (const UserError& e) {
    if (rank == 0) std::cerr << "meshfuse: " << errorKindName(e.kind()) << ": " << e.message() << "\n";
    return 1;
  }
  // From here on, a rank that fails would leave the others waiting in a collective: it aborts
  // them all (MPI_Abort) with its message instead.
  try {
    const CompiledProgram& compiled = exec->plan(inputs);
    if (o.print_hostir && rank == 0) std::cout << "== host IR of rank 0\n" << exec->programFor(inputs).toString();
    for (size_t i = 0; i < full.size(); ++i) {
      const TensorView* tv = compiled.fusion->inputs()[i];
      inputs[i].global_shape = full[i].shape();  // binds symbolic sizes on other stages' ranks
      if (tv->mesh() == nullptr || tv->mesh()->contains(rank)) inputs[i].local = shardForRank(tv, full[i], rank);
    }
    MF_USER_CHECK(rank != o.fail_on_rank, ErrorKind::Runtime, "rank {} fails on purpose (--inject-failure-on-rank)",
                  rank);
    // With --trace, a warm-up run first whose timeline is dropped: the first run JIT-compiles the
    // kernels inside its first tasks, which would dominate the timeline and the hidden fraction.
    if (!o.trace_file.empty()) exec->run(inputs);
    std::vector<ShardedTensor> outs = exec->run(inputs);
    if (rank == 0) {
      std::cout << fmt::format(
          "== ran on {} rank{} ({} communicator, {} backend); collectives executed by rank 0: {}\n", world,
          world == 1 ? "" : "s", comm->name(), exec->backend().name(), exec->lastCollectives().size());
      for (const CollectiveInfo& c : exec->lastCollectives()) std::cout << "  " << formatCollective(c) << "\n";
    }
    if (!o.trace_file.empty()) writeTimelines(*control, *exec, o.trace_file);
    // Every rank exits with rank 0's verdict.
    int64_t code = reportOutputs(definition, *compiled.fusion, o, full, sizes, *exec, outs, *control) ? 0 : 1;
    control->broadcast(&code, 1, DataType::Int64, 0, everyone(world))->wait();
    return static_cast<int>(code);
  } catch (const std::exception& e) {
    if (world == 1) throw;
    comm->abort(e.what());  // the data communicator's abort also ends its NCCL communicators
  }
  return 1;  // not reached: abort() does not return (gcc ignores [[noreturn]] on virtual calls)
}

}  // namespace meshfuse::cli
