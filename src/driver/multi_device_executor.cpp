// MultiDeviceExecutor: places the definition's inputs, compiles through the one pipeline,
// caches per input layout, and runs this rank's host program.
#include <typeinfo>

#include "meshfuse/executor.h"
#include "meshfuse/ir/parser.h"
#include "decompose/decompose_for_overlap.h"
#include "lower/check_collectives.h"
#include "lower/pipeline.h"
#include "runtime/backend.h"
#include "runtime/host_ir_evaluator.h"
#include "runtime/memory.h"

namespace meshfuse {
namespace {

// The sizes `inputs` bind in `placed` (a definition with the inputs' placements; bindSizes): from
// their global shapes where given, else from their local blocks times their shards; nullopt
// without either for some input (plan() of layouts alone), the run's to report.
std::optional<SymbolBindings> runSizes(const Fusion& placed, const std::vector<ShardedTensor>& inputs, int64_t rank) {
  if (inputs.size() != placed.inputs().size()) return std::nullopt;
  std::vector<std::vector<int64_t>> globals(inputs.size());
  std::vector<bool> stated(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorView* tv = placed.inputs()[i];
    const size_t rank_of_tv = tv->shape().size();
    stated[i] = !inputs[i].global_shape.empty();
    globals[i] = inputs[i].global_shape;
    const bool held = tv->mesh() == nullptr || tv->mesh()->contains(rank);
    if (!stated[i] && held && inputs[i].local.defined() && static_cast<size_t>(inputs[i].local.rank()) == rank_of_tv)
      globals[i] = impliedGlobalShape(tv, inputs[i].local, rank);
    if (globals[i].size() != rank_of_tv) return std::nullopt;
  }
  return bindSizes(placed, globals, stated);
}

}  // namespace

struct MultiDeviceExecutor::Layout {
  // Whether this layout's programs depend on the sizes (chunked loops over symbolic sizes: their
  // chunk counts are checked against, or chosen for, each run's sizes; decompose_for_overlap.h).
  bool sized = false;
  std::unique_ptr<Fusion> placed;  // the definition with these placements (sized layouts only)
};

struct MultiDeviceExecutor::Program {
  CompiledProgram compiled;
  HostProgram program;
  std::unique_ptr<HostIrEvaluator> evaluator;
  // The inputs' meshes and placements (no data). Dtypes are the definition's: a local tensor of
  // another dtype is an error, not another program.
  std::vector<ShardedTensor> layouts;
  // Chunked programs (overlap, microbatches) are compiled for the sizes of each run: their
  // chunk counts are checked against, or chosen for, the sizes (decompose_for_overlap.h).
  bool sized = false;
  SymbolBindings sizes;                          // what a sized entry was compiled for
  std::optional<SymbolBindings> memory_checked;  // the sizes whose buffers were found to fit the memory
  // check-collectives' proof that every rank's program matches, made before the first run (it
  // needs the run's sizes) and handed to the evaluator for its hang reports.
  std::shared_ptr<const CommunicationPlan> plan;

  bool matches(const std::vector<ShardedTensor>& inputs) const {
    if (inputs.size() != layouts.size()) return false;
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].mesh != layouts[i].mesh || inputs[i].placements != layouts[i].placements) return false;
    return true;
  }
  // Whether this program is the one for `sizes` (an unsized one is for any).
  bool fits(const SymbolBindings& run_sizes) const {
    for (const auto& [symbol, value] : run_sizes)
      if (sized && (!sizes.count(symbol) || sizes.at(symbol) != value)) return false;
    return true;
  }
};

std::unique_ptr<Fusion> placeInputs(const Fusion& definition, const std::vector<ShardedTensor>& layouts) {
  MF_USER_CHECK(layouts.size() == definition.inputs().size(), ErrorKind::Value,
                "the fusion takes {} inputs but {} were given", definition.inputs().size(), layouts.size());
  std::unique_ptr<Fusion> f = definition.clone();
  for (size_t i = 0; i < layouts.size(); ++i) {
    const ShardedTensor& l = layouts[i];
    if (l.mesh.size() == 0) continue;  // not distributed: keep what the definition says
    TensorView* tv = f->inputs()[i];
    if (tv->mesh() != nullptr) {
      // Pinned with the schedule API: the user's word, as in nvFuser (the definition fixes the
      // input's sharding). A tensor laid out otherwise is an error; neither side silently wins.
      std::vector<Placement> given = l.placements;
      for (Placement& p : given)
        if (p.kind == Placement::Shard && p.dim < 0) p.dim += tv->rank();
      std::vector<Placement> pinned = placementsOf(tv);
      MF_USER_CHECK(*tv->mesh() == l.mesh && pinned == given, ErrorKind::Placement,
                    "input {} ({}): pinned by the schedule API to {} on mesh {} but given a tensor laid out as {} on "
                    "mesh {}: pass it laid out as pinned (redistribute it) or remove the pin",
                    i, f->displayName(tv), placementsToString(pinned), tv->mesh()->toString(),
                    placementsToString(l.placements), l.mesh.toString());
    }
    try {
      applyPlacements(tv, l.mesh, l.placements);
    } catch (const UserError& e) {
      throw UserError(e.kind(), fmt::format("input {}: {}", i, e.message()));
    }
  }
  return f;
}

ShardedTensor distributeTensor(const Tensor& full, const DeviceMesh& mesh, const std::vector<Placement>& placements,
                               int64_t rank) {
  // A one-tensor fusion carries the layout rules (applyPlacements checks and names errors).
  Fusion f;
  std::vector<Extent> shape(full.shape().begin(), full.shape().end());
  TensorView* tv = f.defineTensor(shape, full.dtype(), "tensor");
  applyPlacements(tv, mesh, placements);
  ShardedTensor s{Tensor(), mesh, placements, full.shape()};
  if (mesh.contains(rank)) s.local = shardForRank(tv, full, rank);
  return s;
}

std::vector<ShardedTensor> inputLayouts(const Fusion& fusion) {
  std::vector<ShardedTensor> out;
  for (const TensorView* tv : fusion.inputs()) {
    ShardedTensor s;
    if (tv->mesh() != nullptr) {
      s.mesh = *tv->mesh();
      s.placements = placementsOf(tv);
    }
    out.push_back(std::move(s));
  }
  return out;
}

MultiDeviceExecutor::MultiDeviceExecutor(std::unique_ptr<Fusion> definition, Communicator& comm,
                                         std::unique_ptr<Backend> backend, ExecutorOptions options)
    : definition_(std::move(definition)), comm_(comm), backend_(std::move(backend)), options_(options) {
  MF_USER_CHECK(definition_ != nullptr, ErrorKind::Value, "MultiDeviceExecutor needs a fusion");
  if (!backend_) backend_ = makeCpuBackend();
}

MultiDeviceExecutor::MultiDeviceExecutor(std::unique_ptr<Fusion> definition, Communicator& comm,
                                         ExecutorOptions options)
    : MultiDeviceExecutor(std::move(definition), comm, nullptr, options) {}

MultiDeviceExecutor::~MultiDeviceExecutor() = default;

void MultiDeviceExecutor::checkWorld(const std::vector<ShardedTensor>& inputs) const {
  // Every check below fails identically on every rank (they all compile the same program).
  // The world needs ranks up to the largest device id of every mesh: the inputs' and those the
  // definition pins tensors to (a pipeline stage reached through a `set`).
  int64_t needed = definition_->worldSizeNeeded();
  for (const ShardedTensor& in : inputs)
    for (int64_t d : in.mesh.devices()) needed = std::max(needed, d + 1);
  for (size_t i = 0; i < inputs.size(); ++i)
    for (int64_t d : inputs[i].mesh.devices())
      MF_USER_CHECK(d < comm_.size(), ErrorKind::Mesh,
                    "input {}: mesh {} names device {} but the world has {} ranks (launch with mpirun -np {})", i,
                    inputs[i].mesh.toString(), d, comm_.size(), needed);
  for (int64_t m = 0; m < definition_->numMeshes(); ++m)
    for (int64_t d : definition_->mesh(m).devices())
      MF_USER_CHECK(d < comm_.size(), ErrorKind::Mesh,
                    "mesh @{} {} of the fusion names device {} but the world has {} ranks (launch with mpirun -np "
                    "{})",
                    definition_->meshName(m), definition_->mesh(m).toString(), d, comm_.size(), needed);
}

bool MultiDeviceExecutor::serves(const Entry& e, const std::vector<ShardedTensor>& inputs) const {
  if (!e.matches(inputs)) return false;
  if (!e.sized) return true;
  std::optional<SymbolBindings> sizes = runSizes(*e.compiled.fusion, inputs, comm_.rank());
  return !sizes || e.fits(*sizes);
}

MultiDeviceExecutor::Entry& MultiDeviceExecutor::entryFor(const std::vector<ShardedTensor>& inputs) {
  // Training loops call with the same layouts (and sizes) every step: check the last entry first.
  if (last_ != nullptr && serves(*last_, inputs)) return *last_;
  std::string key;
  for (const ShardedTensor& in : inputs)
    key += fmt::format("{}{};", in.mesh.toString(), placementsToString(in.placements));
  // Whether this layout's programs depend on the sizes is known from the placed definition,
  // before anything is compiled (a sized program is compiled once, for the run's sizes).
  auto [layout, fresh] = layouts_.try_emplace(key);
  if (fresh) {
    try {
      checkWorld(inputs);
      std::unique_ptr<Fusion> placed = placeInputs(*definition_, inputs);
      layout->second.sized = compileDependsOnSizes(*placed, options_.pipeline.overlap);
      if (layout->second.sized) layout->second.placed = std::move(placed);
    } catch (...) {
      layouts_.erase(layout);  // bad inputs leave nothing behind
      throw;
    }
  }
  if (!layout->second.sized) return entryFor(inputs, key, options_.pipeline.sizes, false);
  std::optional<SymbolBindings> sizes = runSizes(*layout->second.placed, inputs, comm_.rank());
  // Layouts alone (plan() without data): the program for the sizes known so far.
  if (!sizes) return entryFor(inputs, key, options_.pipeline.sizes, true);
  std::string sized_key = key;
  for (const auto& [symbol, value] : *sizes) sized_key += fmt::format(" {}={}", symbol, value);
  SymbolBindings all = options_.pipeline.sizes;
  all.insert(sizes->begin(), sizes->end());
  return entryFor(inputs, sized_key, all, true);
}

MultiDeviceExecutor::Entry& MultiDeviceExecutor::entryFor(const std::vector<ShardedTensor>& inputs,
                                                          const std::string& key, const SymbolBindings& sizes,
                                                          bool sized) {
  auto it = cache_.find(key);
  if (it != cache_.end()) return *(last_ = it->second.get());
  checkWorld(inputs);
  auto e = std::make_unique<Entry>();
  PipelineOptions pipeline = options_.pipeline;
  pipeline.sizes = sizes;
  std::unique_ptr<Fusion> placed = placeInputs(*definition_, inputs);
  e->sized = sized;
  e->sizes = sizes;
  e->compiled = compile(std::move(placed), pipeline, options_.keep_stages);
  e->program = programForRank(e->compiled, comm_.rank());
  e->evaluator = std::make_unique<HostIrEvaluator>(e->program, *backend_, comm_);
  e->evaluator->setTracing(options_.trace);
  e->evaluator->setAbortOnFailure(options_.abort_on_failure);
  for (const ShardedTensor& in : inputs) e->layouts.push_back({Tensor(), in.mesh, in.placements});
  return *(last_ = cache_.emplace(key, std::move(e)).first->second.get());
}

const CompiledProgram& MultiDeviceExecutor::plan(const std::vector<ShardedTensor>& inputs) {
  return entryFor(inputs).compiled;
}

const HostProgram& MultiDeviceExecutor::programFor(const std::vector<ShardedTensor>& inputs) {
  return entryFor(inputs).program;
}

MultiDeviceExecutor::Program& MultiDeviceExecutor::prepare(const std::vector<ShardedTensor>& inputs) {
  return entryFor(inputs);
}

std::vector<ShardedTensor> MultiDeviceExecutor::run(const std::vector<ShardedTensor>& inputs) {
  return runGuarded(nullptr, inputs);
}

std::vector<ShardedTensor> MultiDeviceExecutor::run(Program& program, const std::vector<ShardedTensor>& inputs) {
  return runGuarded(&program, inputs);
}

std::vector<ShardedTensor> MultiDeviceExecutor::runGuarded(Entry* hint, const std::vector<ShardedTensor>& inputs) {
  try {
    return runChecked(hint, inputs);
  } catch (const UserError&) {
    throw;
  } catch (const InternalError&) {
    throw;
  } catch (const std::exception& e) {  // a raw std:: exception from inside is a bug, said as one
    throw InternalError(fmt::format("unexpected {} while running: {}", typeid(e).name(), e.what()));
  }
}

std::vector<ShardedTensor> MultiDeviceExecutor::runChecked(Entry* hint, const std::vector<ShardedTensor>& inputs) {
  if (options_.check_inputs && comm_.size() > 1) agreeOnInputs(inputs);
  Entry& e = hint != nullptr && serves(*hint, inputs) ? *(last_ = hint) : entryFor(inputs);
  // Once per sizes, before anything runs and identically on every rank: a buffer larger than
  // the backend's memory is refused naming the tensor (memory.h), and check-collectives proves
  // that every rank's program matches the others' (its plan serves the watchdog's reports).
  if (std::optional<SymbolBindings> sizes = runSizes(*e.compiled.fusion, inputs, comm_.rank())) {
    sizes->insert(options_.pipeline.sizes.begin(), options_.pipeline.sizes.end());
    if (e.memory_checked != sizes) {
      checkProgramAllocations(e.compiled.host, *sizes, backend_->memoryLimit());
      e.memory_checked = sizes;
    }
    if (e.plan == nullptr) {
      SymbolBindings all = e.sizes;
      all.insert(sizes->begin(), sizes->end());
      try {
        e.plan = std::make_shared<const CommunicationPlan>(checkCollectives(e.compiled, all));
        e.evaluator->setCommunicationPlan(e.plan);
      } catch (const UserError&) {
        // The inputs do not bind the sizes (a wrong shape): the run below reports that, naming
        // the input; the check runs on the next call with good inputs.
      }
    }
  }
  std::vector<Tensor> locals;
  locals.reserve(inputs.size());
  for (const ShardedTensor& in : inputs) locals.push_back(in.local);
  std::vector<std::vector<int64_t>> global_shapes;
  for (const ShardedTensor& in : inputs) global_shapes.push_back(in.global_shape);
  std::vector<Tensor> outs = e.evaluator->run(locals, global_shapes);
  last_collectives_ = e.evaluator->executed();
  if (options_.trace) last_trace_ = e.evaluator->takeTrace();
  std::vector<ShardedTensor> result;
  const Fusion& f = *e.compiled.fusion;
  for (size_t i = 0; i < outs.size(); ++i) {
    const TensorView* tv = f.outputs()[i];
    ShardedTensor s;
    s.local = std::move(outs[i]);
    if (tv->mesh() != nullptr) {
      s.mesh = *tv->mesh();
      s.placements = placementsOf(tv);
    }
    result.push_back(std::move(s));
  }
  return result;
}

}  // namespace meshfuse
