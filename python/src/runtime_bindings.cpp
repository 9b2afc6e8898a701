// Bindings of the runtime: the process's communicator, MultiDeviceExecutor and what it compiled.
//
// The communicator is the process's one world (like torch's default process group): `mpi` under
// mpirun/srun, `self` otherwise (makeDefaultCommunicator). Executors share it.
//
// The hot path of a cached call is Prepared::run: the layouts (mesh, placements) are converted
// once when a call signature is first seen; each call only swaps in the local tensors and runs
// with the GIL released.
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <mutex>

#include "bindings.h"
#include "driver/backends.h"
#include "meshfuse/executor.h"
#include "lower/host_ir.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/ir/printer.h"
#include "runtime/cuda.h"
#include "runtime/environment.h"
#include "runtime/host_ir_evaluator.h"
#include "runtime/streams.h"
#include "tensor_conversion.h"
#include "lower/pipeline.h"

namespace meshfuse::python {
namespace {

using namespace pybind11::literals;

// The process's communicators: `world` runs the programs; `control` carries the front end's
// own small collectives (the ranks' input-signature check), on a communicator of its own so that
// a rank checking while a peer already runs a program can never have its message matched with
// the program's collectives (at worst it waits until the watchdog). Both are created together,
// by init() on every rank.
// Executors on a CUDA backend share a third, `cuda` (NCCL, or MPI over host-staged device
// buffers: makeCudaCommunicator), made when the first of them is.
struct Communicators {
  std::shared_ptr<Communicator> world, control, cuda;
};

Communicators& communicatorSlots() {
  static Communicators slots;
  return slots;
}

const std::shared_ptr<Communicator>& world() {
  Communicators& c = communicatorSlots();
  if (!c.world) {
    c.world = makeDefaultCommunicator();
    c.control = c.world->size() > 1 ? makeDefaultCommunicator() : c.world;
  }
  return c.world;
}

Communicator& control() {
  world();
  return *communicatorSlots().control;
}

// The communicator that moves `backend`'s buffers: the world's, or for device memory the CUDA one.
std::shared_ptr<Communicator> communicatorFor(const Backend& backend) {
  if (backend.device() != Device::Cuda) return world();
  Communicators& c = communicatorSlots();
  world();  // MPI is initialized (and the world made) first, on every rank alike
  if (!c.cuda) c.cuda = makeCudaCommunicator(makeDefaultCommunicator());
  return c.cuda;
}

// PipelineOptions from Python keyword arguments {name: value}, through the compile-option table
// (the CLI's flags come from the same table): a bool is "true"/"false", a number its digits.
PipelineOptions pipelineOptions(const py::dict& options) {
  PipelineOptions o;
  for (const auto& [key, value] : options) {
    const std::string name = py::str(key);
    std::string text;
    if (py::isinstance<py::bool_>(value)) {
      text = value.cast<bool>() ? "true" : "false";
    } else if (py::isinstance<py::int_>(value) || py::isinstance<py::str>(value)) {
      text = py::str(value);
    } else {
      userError(ErrorKind::Value, "{}={}: expected a string, a whole number or a bool", name,
                py::repr(value).cast<std::string>());
    }
    findCompileOption(name).set(o, text);
  }
  return o;
}

// A layout from Python: (mesh or None, placements, global shape, dtype).
ShardedTensor toLayout(py::handle h) {
  auto t = h.cast<py::tuple>();
  ShardedTensor s;
  if (!t[0].is_none()) s.mesh = t[0].cast<DeviceMesh>();
  s.placements = t[1].cast<std::vector<Placement>>();
  s.global_shape = t[2].cast<std::vector<int64_t>>();
  // Only the dtype matters before the real local arrives (it is part of the executor's cache key).
  s.local = Tensor::empty(t[3].cast<DataType>(), {0});
  return s;
}

struct PyExecutor {
  std::shared_ptr<Communicator> comm;
  std::unique_ptr<MultiDeviceExecutor> exec;
  // Runs drop the GIL, so two Python threads could enter one executor at once; it is not
  // reentrant (its evaluators hold per-run state). Taken after the GIL is released.
  std::mutex mu;
};

// The program compiled for one input signature; owned by its executor's cache.
struct PyProgram {
  std::shared_ptr<PyExecutor> owner;  // keeps the executor (and so the program) alive
  const CompiledProgram* compiled;
  std::vector<std::vector<int64_t>> input_shapes;  // global, for symbolic sizes

  const Fusion& fusion() const { return *compiled->fusion; }
  // The symbolic sizes the input shapes bind (all of them given, so checked against the static dims).
  SymbolBindings sizes() const {
    return bindSizes(fusion(), input_shapes, std::vector<bool>(input_shapes.size(), true));
  }
  int64_t rankOrThis(std::optional<int64_t> rank) const {
    int64_t r = rank.value_or(owner->comm->rank());
    MF_USER_CHECK(r >= 0 && r < owner->comm->size(), ErrorKind::Value, "rank {} is not in this world of {} ranks", r,
                  owner->comm->size());
    return r;
  }
};

// One call signature of an executor, ready to run with fresh local tensors. Python threads may
// call one Prepared at once: each call fills its own copy of the layouts with its tensors (with
// the GIL held), then runs under the executor's mutex with the GIL released.
struct Prepared {
  std::shared_ptr<PyExecutor> owner;
  std::vector<ShardedTensor> layouts;  // no local tensors: shared by concurrent calls, never written
  PyProgram program;
  // The executor's compiled program for these layouts: each call runs it without looking the
  // signature up (the executor falls back to the lookup for inputs it does not serve).
  MultiDeviceExecutor::Program* entry = nullptr;

  std::vector<ShardedTensor> withLocals(const py::sequence& locals) const {
    MF_USER_CHECK(static_cast<size_t>(py::len(locals)) == layouts.size(), ErrorKind::Value,
                  "the fusion takes {} inputs but {} were given", layouts.size(), py::len(locals));
    std::vector<ShardedTensor> inputs = layouts;
    for (size_t i = 0; i < inputs.size(); ++i) {
      py::handle l = locals[i];
      inputs[i].local = l.is_none() ? Tensor() : tensorFromPython(l);
    }
    return inputs;
  }

  py::list run(const py::sequence& locals) const {
    std::vector<ShardedTensor> inputs = withLocals(locals);
    std::vector<ShardedTensor> outs;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(owner->mu);
      outs = owner->exec->run(*entry, inputs);
      // Outputs in device memory come back to the host (numpy / DLPack on the CPU).
      for (ShardedTensor& o : outs)
        if (o.local.defined()) o.local = owner->exec->backend().download(o.local);
    }
    py::list result;
    for (ShardedTensor& o : outs) result.append(o.local.defined() ? py::cast(std::move(o.local)) : py::none());
    return result;  // `inputs` (the caller's memory) is released here, with the GIL held
  }

  // Seconds per run() of the executor itself, over `iterations` runs: the C++ baseline that the
  // Python overhead benchmark subtracts.
  double timeRun(const py::sequence& locals, int64_t iterations) const {
    std::vector<ShardedTensor> inputs = withLocals(locals);
    double s = 0;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(owner->mu);
      auto start = std::chrono::steady_clock::now();
      for (int64_t k = 0; k < iterations; ++k) owner->exec->run(*entry, inputs);
      s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    return s / static_cast<double>(iterations);
  }

  // A copy of what the executor recorded about its last run, taken under its mutex (another
  // thread may be running it).
  template <typename T>
  T lastOf(T (*get)(const MultiDeviceExecutor&)) const {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(owner->mu);
    return get(*owner->exec);
  }
};

py::object layoutOf(const TensorView* tv) {
  if (tv->mesh() == nullptr) return py::make_tuple(py::none(), py::list());
  return py::make_tuple(*tv->mesh(), placementsOf(tv));
}

void bindCommunicator(py::module_& m) {
  m.def(
      "init", [] { return world()->name(); }, "Creates the process's communicator (idempotent); returns its name.");
  m.def("is_initialized", [] { return communicatorSlots().world != nullptr; });
  m.def(
      "launched_by_mpi", [] { return readRuntimeEnvironment().launched_by_mpi; },
      "Whether mpirun/srun started this process (the variables runtime/environment.h reads).");
  m.def("cuda_available", &cudaDeviceAvailable,
        "Whether a CUDA device is usable here (and the CUDA backend was built): what device='auto' picks.");
  m.def("rank", [] { return world()->rank(); });
  m.def("world_size", [] { return world()->size(); });
  m.def("communicator_name", [] { return world()->name(); });
  m.def("barrier", [] {
    py::gil_scoped_release release;
    world()->barrier();
  });
  m.def(
      "allgather_int64",
      [](const std::vector<int64_t>& mine, std::optional<Team> team) {
        Communicator& comm = control();
        Team t = team.value_or(Team{});
        if (!team)
          for (int64_t r = 0; r < comm.size(); ++r) t.push_back(r);
        MF_USER_CHECK(std::find(t.begin(), t.end(), comm.rank()) != t.end(), ErrorKind::Value,
                      "allgather_int64: rank {} is not in the team [{}]", comm.rank(), fmt::join(t, ", "));
        auto count = static_cast<int64_t>(mine.size());
        std::vector<int64_t> all(mine.size() * t.size());
        {
          py::gil_scoped_release release;
          comm.allgather(mine.data(), all.data(), count, DataType::Int64, t)->wait();
        }
        std::vector<std::vector<int64_t>> out;
        for (size_t i = 0; i < t.size(); ++i) out.emplace_back(all.begin() + i * count, all.begin() + (i + 1) * count);
        return out;
      },
      "values"_a, "team"_a = py::none(),
      "Every rank of `team` (default: the world) passes the same number of int64s; each gets every member's, in "
      "team order (collective; for small control messages such as the input-signature check).");
  m.def(
      "abort", [](const std::string& why) { world()->abort(why); }, "reason"_a,
      "Makes every rank fail now (MPI_Abort under mpirun) instead of leaving peers waiting.");
  m.def(
      "shard_for_rank",
      [](const Tensor& full, const DeviceMesh& mesh, const std::vector<Placement>& placements,
         int64_t rank) -> std::optional<Tensor> {
        Fusion f;
        TensorView* tv =
            f.defineTensor(std::vector<Extent>(full.shape().begin(), full.shape().end()), full.dtype(), "x");
        applyPlacements(tv, mesh, placements);
        if (!mesh.contains(rank)) return std::nullopt;  // holds nothing, as torch gives it an empty shard
        return shardForRank(tv, full, rank);
      },
      "full"_a, "mesh"_a, "placements"_a, "rank"_a, "The block of `full` that `rank` holds (None outside the mesh).");
  m.def(
      "local_shape",
      [](const std::vector<int64_t>& shape, const DeviceMesh& mesh, const std::vector<Placement>& placements,
         int64_t rank) {
        Fusion f;
        TensorView* tv = f.defineTensor(std::vector<Extent>(shape.begin(), shape.end()), DataType::Float, "x");
        applyPlacements(tv, mesh, placements);
        return localShape(tv, {}, rank);
      },
      "shape"_a, "mesh"_a, "placements"_a, "rank"_a,
      "The shape of the block of a tensor of global `shape` that `rank` holds: torch.chunk's blocks (uneven shards: "
      "leading ranks ceil(n / D), trailing ones less, possibly empty; several mesh axes on one dim nest in axis "
      "order). A rank outside the mesh gets the largest block.");
}

void bindCollectiveInfo(py::module_& m) {
  py::class_<CollectiveInfo>(m, "CollectiveInfo", "One communication of a rank's host program.")
      .def_property_readonly("kind", [](const CollectiveInfo& c) { return std::string(commKindName(c.kind)); })
      .def_readonly("mesh_axis", &CollectiveInfo::mesh_axis)
      .def_readonly("team", &CollectiveInfo::team)
      .def_readonly("bytes", &CollectiveInfo::bytes)
      .def_readonly("padded_bytes", &CollectiveInfo::padded_bytes,
                    "An allgather or reduce-scatter of blocks of different sizes (uneven shards): the bytes this rank "
                    "sends where the backend pads every block to the largest (NCCL); 0 when the blocks are equal.")
      .def_readonly("tensor", &CollectiveInfo::tensor)
      .def_readonly("source", &CollectiveInfo::source)
      .def_readonly("provenance", &CollectiveInfo::provenance)
      .def_property_readonly(
          "root", [](const CollectiveInfo& c) { return c.root >= 0 ? py::object(py::int_(c.root)) : py::none(); },
          "The root's global rank (broadcast, scatter, gather, reduce), else None.")
      .def("__repr__", [](const CollectiveInfo& c) {
        return fmt::format("Collective({} {} -> {}, mesh_axis={}, team=[{}]{}, bytes={}, provenance={:?})",
                           commKindName(c.kind), c.source, c.tensor, c.mesh_axis, fmt::join(c.team, ", "),
                           c.root >= 0 ? fmt::format(", root={}", c.root) : "", c.bytes, c.provenance);
      });

  py::class_<AttentionBlocks>(m, "AttentionBlocks",
                              "The causal work of one ring attention on a rank: (query chunk, key chunk) pairs of "
                              "`chunk` rows attended and skipped over its `steps` steps, counted for one of its "
                              "`head_groups` (rings run one after the other, one per group of heads, which all "
                              "attend the same pairs).")
      .def_readonly("tensor", &AttentionBlocks::tensor)
      .def_readonly("head_groups", &AttentionBlocks::head_groups)
      .def_readonly("steps", &AttentionBlocks::steps)
      .def_readonly("chunk", &AttentionBlocks::chunk)
      .def_readonly("attended", &AttentionBlocks::attended)
      .def_readonly("skipped", &AttentionBlocks::skipped)
      .def("__repr__", [](const AttentionBlocks& a) {
        return fmt::format("AttentionBlocks({}, head_groups={}, steps={}, chunk={}, attended={}, skipped={})", a.tensor,
                           a.head_groups, a.steps, a.chunk, a.attended, a.skipped);
      });
}

void bindCompiledPrograms(py::module_& m) {
  py::class_<PyProgram>(m, "CompiledProgram", "What meshfuse compiled for one input signature.")
      .def(
          "host_ir",
          [](const PyProgram& p, std::optional<int64_t> rank) {
            return programForRank(*p.compiled, p.rankOrThis(rank)).toString();
          },
          "rank"_a = py::none())
      .def(
          "collectives",
          [](const PyProgram& p, std::optional<int64_t> rank) {
            HostProgram h = programForRank(*p.compiled, p.rankOrThis(rank));
            return collectives(h, p.sizes());
          },
          "rank"_a = py::none())
      .def(
          "peak_memory",
          [](const PyProgram& p, std::optional<int64_t> rank) {
            HostProgram h = programForRank(*p.compiled, p.rankOrThis(rank));
            return peakMemoryBytes(h, p.sizes());
          },
          "rank"_a = py::none())
      .def(
          "attention_blocks",
          [](const PyProgram& p, std::optional<int64_t> rank) {
            HostProgram h = programForRank(*p.compiled, p.rankOrThis(rank));
            return attentionBlocks(h, p.sizes());
          },
          "rank"_a = py::none())
      .def(
          "stage",
          [](const PyProgram& p, const std::string& name) {
            auto it = p.compiled->stages.find(name);
            MF_USER_CHECK(!p.compiled->stages.empty(), ErrorKind::Value,
                          "this program was compiled without keeping its stages (Executor(keep_stages=False))");
            MF_USER_CHECK(it != p.compiled->stages.end(), ErrorKind::Value, "unknown stage '{}'; the stages are: {}",
                          name, fmt::join(pipelineStages(), ", "));
            return it->second;
          },
          "name"_a)
      .def_property_readonly_static("stage_names", [](py::object) { return pipelineStages(); })
      .def_property_readonly("fusion_text", [](const PyProgram& p) { return printFusion(p.fusion()); })
      .def_property_readonly("output_layouts",
                             [](const PyProgram& p) {
                               py::list out;
                               for (const TensorView* tv : p.fusion().outputs()) out.append(layoutOf(tv));
                               return out;
                             })
      .def_property_readonly("output_dtypes",
                             [](const PyProgram& p) {
                               std::vector<DataType> out;
                               for (const TensorView* tv : p.fusion().outputs()) out.push_back(tv->dtype());
                               return out;
                             })
      .def_property_readonly("output_shapes", [](const PyProgram& p) {
        SymbolBindings b = p.sizes();
        std::vector<std::vector<int64_t>> out;
        for (const TensorView* tv : p.fusion().outputs()) {
          std::vector<int64_t> s;
          for (const Extent& e : tv->shape()) s.push_back(e.evaluate(b));
          out.push_back(std::move(s));
        }
        return out;
      });

  py::class_<Prepared>(m, "Prepared", "One input signature of an executor, compiled and ready to run.")
      .def("run", &Prepared::run, "locals"_a, "Runs on this rank's local tensors; returns its local outputs.")
      .def("time_run", &Prepared::timeRun, "locals"_a, "iterations"_a)
      .def_property_readonly("program", [](const Prepared& p) { return p.program; })
      .def_property_readonly("last_collectives",
                             [](const Prepared& p) {
                               return p.lastOf<std::vector<CollectiveInfo>>(
                                   [](const MultiDeviceExecutor& e) { return e.lastCollectives(); });
                             })
      .def_property_readonly("last_trace", [](const Prepared& p) {
        return p.lastOf<std::vector<TraceEvent>>([](const MultiDeviceExecutor& e) { return e.lastTrace(); });
      });

}

void bindTraces(py::module_& m) {
  py::class_<TraceEvent>(m, "TraceEvent", "One task of a timeline: what ran, on which stream, when (us).")
      .def_readonly("name", &TraceEvent::name)
      .def_property_readonly("kind", [](const TraceEvent& e) { return std::string(taskKindName(e.kind)); })
      .def_readonly("stream", &TraceEvent::stream)
      .def_readonly("begin_us", &TraceEvent::begin_us)
      .def_readonly("end_us", &TraceEvent::end_us)
      .def("__repr__", [](const TraceEvent& e) {
        return fmt::format("TraceEvent({} {} on stream {}, {:.1f}-{:.1f} us)", taskKindName(e.kind), e.name, e.stream,
                           e.begin_us, e.end_us);
      });
  m.def(
      "write_trace",
      [](const std::string& path, const std::vector<TraceEvent>& mine) {
        std::vector<std::vector<TraceEvent>> all;
        {
          py::gil_scoped_release release;
          all = gatherTraces(*world(), mine);
        }
        if (world()->rank() != 0) return py::object(py::none());
        std::ofstream out(path);
        MF_USER_CHECK(out.good(), ErrorKind::Runtime, "cannot write the trace to {}", path);
        out << chromeTraceJson(all);
        py::list fractions;
        for (const auto& events : all) fractions.append(summarizeOverlap(events).hiddenFraction());
        return py::object(fractions);
      },
      "path"_a, "events"_a,
      "Gathers every rank's timeline on rank 0 and writes it as Chrome/Perfetto trace JSON (every rank must call "
      "it); returns, on rank 0, each rank's fraction of communication time hidden behind compute.");
  m.def(
      "overlap_summary",
      [](const std::vector<TraceEvent>& events) {
        OverlapSummary s = summarizeOverlap(events);
        return py::dict("compute_us"_a = s.compute_us, "communication_us"_a = s.communication_us,
                        "hidden_us"_a = s.hidden_us, "hidden_fraction"_a = s.hiddenFraction());
      },
      "events"_a, "How much of a timeline's communication time ran while compute was running.");

}

// The compile-option table (meshfuse/options.h), as the wrapper reads it.
void bindCompileOptions(py::module_& m) {
  m.def(
      "compile_options",
      [] {
        const PipelineOptions defaults;
        py::list out;
        for (const CompileOption& o : compileOptions()) {
          const char* type = o.type == CompileOption::Type::Flag    ? "flag"
                             : o.type == CompileOption::Type::Count ? "count"
                                                                    : "choice";
          out.append(py::dict("name"_a = o.name, "type"_a = type, "choices"_a = o.choices,
                              "default"_a = o.get(defaults), "help"_a = o.help));
        }
        return out;
      },
      "The compile options (meshfuse/options.h's table): name, type, choices, default and help of each; "
      "FusionDefinitionWrapper takes them as keyword arguments, the CLI as --NAME.");
  m.def(
      "check_compile_options", [](const py::dict& options) { (void)pipelineOptions(options); }, "options"_a,
      "Raises meshfuse.ValueError when a value is not one the option takes.");

}

void bindExecutor(py::module_& m) {
  py::class_<PyExecutor, std::shared_ptr<PyExecutor>>(m, "Executor")
      .def(py::init([](const Fusion& definition, const py::dict& compile_options, bool keep_stages, bool trace,
                       bool abort_on_failure, const std::string& device) {
             auto e = std::make_shared<PyExecutor>();
             ExecutorOptions options;
             options.pipeline = pipelineOptions(compile_options);
             options.keep_stages = keep_stages;
             options.trace = trace;
             options.abort_on_failure = abort_on_failure;
             options.check_inputs = false;  // the wrapper's own check (check_inputs=, _agreement.py)
             std::unique_ptr<Backend> backend = makeBackend(device);
             e->comm = communicatorFor(*backend);
             e->exec = std::make_unique<MultiDeviceExecutor>(definition.clone(), *e->comm, std::move(backend),
                                                             options);
             return e;
           }),
           "definition"_a, "compile_options"_a = py::dict(), "keep_stages"_a = true, "trace"_a = false,
           "abort_on_failure"_a = true, "device"_a = "auto",
           "compile_options: {name: value} of compile_options() (overlap, chunks, streams, fsdp, cp); trace: "
           "record each run's timeline; abort_on_failure: a failure while a multi-rank program runs ends the job "
           "(MPI_Abort) instead of raising on this rank while the others wait; device: cpu, cuda or auto (cuda "
           "when a GPU is present): where the programs run (inputs and outputs stay host arrays)")
      .def_property_readonly(
          "device", [](const PyExecutor& e) { return e.exec->backend().device() == Device::Cuda ? "cuda" : "cpu"; })
      .def(
          "prepare",
          [](const std::shared_ptr<PyExecutor>& self, const py::sequence& layouts) {
            Prepared p{self, {}, {self, nullptr, {}}};
            for (py::handle l : layouts) {
              p.layouts.push_back(toLayout(l));
              p.program.input_shapes.push_back(p.layouts.back().global_shape);
            }
            std::lock_guard<std::mutex> lock(self->mu);  // a run in another thread may be using the cache
            p.entry = &self->exec->prepare(p.layouts);
            p.program.compiled = &self->exec->plan(p.layouts);
            return p;
          },
          "layouts"_a,
          "Compiles (or finds) the program for inputs laid out as (mesh, placements, global shape, dtype).")
      .def_property_readonly("cache_size", [](const PyExecutor& e) { return e.exec->cacheSize(); });
}

}  // namespace

void bindRuntime(py::module_& m) {
  bindCommunicator(m);
  bindCollectiveInfo(m);
  bindCompiledPrograms(m);
  bindTraces(m);
  bindCompileOptions(m);
  bindExecutor(m);
}

}  // namespace meshfuse::python
