// TrainingExecutor (training_executor.h): forward-with-saves, backward and per-parameter
// optimizer fusions, each run by a MultiDeviceExecutor (so each is compiled once per layout and
// goes through the normal pipeline), chained on this rank's local blocks.
#include "meshfuse/training_executor.h"

#include <cmath>
#include <limits>
#include <set>

#include "meshfuse/error.h"
#include "meshfuse/ir/placement.h"
#include "lower/pipeline.h"
#include "runtime/backend.h"

namespace meshfuse {

struct TrainingExecutor::Programs {
  std::vector<BackwardInput> sources;  // the backward's inputs
  std::unique_ptr<MultiDeviceExecutor> forward, backward;
  OptimizerStep update;  // every parameter's update in one fusion (moved into `optimizer`)
  std::unique_ptr<MultiDeviceExecutor> optimizer;
};

namespace {

void checkTrainable(const Fusion& f, int64_t loss, const std::vector<int64_t>& params) {
  MF_USER_CHECK(loss >= 0 && loss < static_cast<int64_t>(f.outputs().size()), ErrorKind::Value,
                "TrainingExecutor: loss output {} is out of range (the definition has {} outputs)", loss,
                f.outputs().size());
  const TensorView* l = f.outputs()[loss];
  MF_USER_CHECK(isFloatingPoint(l->dtype()), ErrorKind::Dtype,
                "TrainingExecutor: the loss {} is {}, not floating-point", f.displayName(l), dtypeName(l->dtype()));
  MF_USER_CHECK(l->rank() == 0, ErrorKind::Shape,
                "TrainingExecutor: the loss {} has rank {} but must be a scalar (reduce it with sum or mean)",
                f.displayName(l), l->rank());
  MF_USER_CHECK(!params.empty(), ErrorKind::Value, "TrainingExecutor: no parameters to train");
  std::set<int64_t> seen;
  for (int64_t p : params) {
    MF_USER_CHECK(p >= 0 && p < static_cast<int64_t>(f.inputs().size()), ErrorKind::Value,
                  "TrainingExecutor: parameter {} is not an input of the definition (it has {} inputs)", p,
                  f.inputs().size());
    const TensorView* in = f.inputs()[p];
    MF_USER_CHECK(isFloatingPoint(in->dtype()), ErrorKind::Dtype,
                  "TrainingExecutor: parameter {} ({}) is {}: only floating-point inputs can be trained", p,
                  f.displayName(in), dtypeName(in->dtype()));
    MF_USER_CHECK(seen.insert(p).second, ErrorKind::Value, "TrainingExecutor: parameter {} ({}) is listed twice", p,
                  f.displayName(in));
  }
}

// An input given without a layout runs as the definition has it: on one device when the
// definition has no meshes (what compile() does), made explicit so that state can copy it.
ShardedTensor withLayout(const ShardedTensor& t) {
  if (!t.placements.empty()) return t;
  ShardedTensor s = t;
  s.mesh = DeviceMesh({0});
  s.placements = {Placement::replicate()};
  return s;
}

ShardedTensor like(const ShardedTensor& p, Tensor local) {
  return {std::move(local), p.mesh, p.placements, p.global_shape};
}

// A hyper-parameter input: a scalar replicated on the parameter's mesh.
ShardedTensor scalarInput(const ShardedTensor& p, double value) {
  return {Tensor::fromValues(DataType::Float, {}, {value}), p.mesh,
          std::vector<Placement>(p.placements.size(), Placement::replicate())};
}

Tensor castCopy(const Tensor& t, DataType dtype) {
  Tensor out(dtype, t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) out.set(i, t.get(i));
  return out;
}

}  // namespace

TrainingExecutor::TrainingExecutor(std::unique_ptr<Fusion> definition, int64_t loss, std::vector<int64_t> params,
                                   OptimizerConfig optimizer, Communicator& comm, TrainingOptions options)
    : definition_(std::move(definition)),
      loss_(loss),
      params_(std::move(params)),
      optimizer_(std::move(optimizer)),
      comm_(comm),
      options_(std::move(options)) {
  checkTrainable(*definition_, loss_, params_);
  checkOptimizerConfig(optimizer_);
}

TrainingExecutor::~TrainingExecutor() = default;

TrainingExecutor::Programs& TrainingExecutor::programsFor(const std::vector<ShardedTensor>& inputs) {
  MF_USER_CHECK(inputs.size() == definition_->inputs().size(), ErrorKind::Value,
                "TrainingExecutor: the definition takes {} inputs but {} were given", definition_->inputs().size(),
                inputs.size());
  std::string key;
  for (const ShardedTensor& in : inputs)
    key += fmt::format("{}{};", in.mesh.toString(), placementsToString(in.placements));
  auto it = programs_.find(key);
  if (it != programs_.end()) return *it->second;
  // Differentiated with the inputs' layouts applied, so that each gradient is pinned to its
  // parameter's placements (autodiff.h) and the optimizer's in-place outputs can match them.
  std::unique_ptr<Fusion> placed = placeInputs(*definition_, inputs);
  Gradients g = differentiate(*placed, {loss_}, params_, options_.autodiff);
  auto p = std::make_unique<Programs>();
  p->sources = g.backward_inputs;
  p->forward = std::make_unique<MultiDeviceExecutor>(std::move(g.forward), comm_, nullptr, options_.executor);
  p->backward = std::make_unique<MultiDeviceExecutor>(std::move(g.backward), comm_, nullptr, options_.executor);
  std::vector<ParamType> types;
  for (int64_t k : params_) types.push_back({definition_->inputs()[k]->shape(), definition_->inputs()[k]->dtype()});
  p->update = buildOptimizerStep(optimizer_, types);
  p->optimizer = std::make_unique<MultiDeviceExecutor>(std::move(p->update.fusion), comm_, nullptr, options_.executor);
  return *programs_.emplace(key, std::move(p)).first->second;
}

// Zero state (and an f32 master copy of a low-precision parameter) laid out as the parameter.
void TrainingExecutor::initState(Programs& p, const std::vector<ShardedTensor>& inputs) {
  for (size_t k = 0; k < params_.size(); ++k) {
    const ShardedTensor& param = inputs[params_[k]];
    ParameterState st;
    std::vector<int64_t> shape = param.local.defined() ? param.local.shape() : std::vector<int64_t>{};
    if (p.update.params[k].has_master) {
      st.names.push_back("master");
      st.tensors.push_back(like(param, param.local.defined() ? castCopy(param.local, DataType::Float) : Tensor()));
    }
    for (const std::string& n : p.update.state) {
      st.names.push_back(n);
      st.tensors.push_back(like(param, param.local.defined() ? Tensor(DataType::Float, shape) : Tensor()));
    }
    states_.push_back(std::move(st));
  }
}

void TrainingExecutor::update(Programs& p, const std::vector<ShardedTensor>& inputs) {
  std::vector<ShardedTensor> args;
  for (size_t k = 0; k < params_.size(); ++k) {
    const ParameterState& st = states_[k];
    const ShardedTensor& param = inputs[params_[k]];
    // The state was laid out at the first step: a parameter may not move afterwards.
    MF_USER_CHECK(
        st.tensors.empty() || (st.tensors[0].mesh == param.mesh && st.tensors[0].placements == param.placements),
        ErrorKind::Unsupported,
        "TrainingExecutor: parameter {} is now {} on {} but its optimizer state is {} on {}: a parameter "
        "keeps the layout of the first step",
        params_[k], placementsToString(param.placements), param.mesh.toString(),
        placementsToString(st.tensors[0].placements), st.tensors[0].mesh.toString());
    args.push_back(param);
    size_t next = 0;
    if (p.update.params[k].has_master) args.push_back(st.tensors[next++]);
    args.push_back(last_grads_[k]);
    for (; next < st.tensors.size(); ++next) args.push_back(st.tensors[next]);
  }
  for (double v : optimizerScalars(optimizer_, steps_ + 1)) args.push_back(scalarInput(inputs[params_[0]], v));
  p.optimizer->run(args);  // writes the parameters and their state in place
}

double TrainingExecutor::step(const std::vector<ShardedTensor>& given) {
  std::vector<ShardedTensor> inputs;
  for (const ShardedTensor& t : given) inputs.push_back(withLayout(t));
  Programs& p = programsFor(inputs);
  last_ = &p;
  if (states_.empty()) initState(p, inputs);
  std::vector<ShardedTensor> outs = p.forward->run(inputs);
  const ShardedTensor& loss = outs[loss_];
  std::vector<ShardedTensor> bwd;
  for (const BackwardInput& b : p.sources) {
    if (b.kind == BackwardInput::ForwardInput) bwd.push_back(inputs[b.index]);
    if (b.kind == BackwardInput::ForwardOutput) bwd.push_back(outs[b.index]);
    if (b.kind == BackwardInput::Seed)  // d loss / d loss = 1, laid out as the loss
      bwd.push_back({Tensor::fromValues(loss.local.defined() ? loss.local.dtype() : DataType::Float, {}, {1.0}),
                     loss.mesh, std::vector<Placement>(loss.placements.size(), Placement::replicate())});
  }
  last_grads_ = p.backward->run(bwd);
  update(p, inputs);
  ++steps_;
  return loss.local.defined() ? loss.local.get(0) : std::numeric_limits<double>::quiet_NaN();
}

std::vector<PhaseCollective> TrainingExecutor::lastCollectives() const {
  std::vector<PhaseCollective> out;
  if (last_ == nullptr) return out;
  auto add = [&](const char* phase, const MultiDeviceExecutor& e) {
    for (const CollectiveInfo& c : e.lastCollectives()) out.push_back({phase, c});
  };
  add("forward", *last_->forward);
  add("backward", *last_->backward);
  add("optimizer", *last_->optimizer);
  return out;
}

}  // namespace meshfuse
