// SGD and AdamW steps as fusions of pointwise ops with in-place outputs (optimizer.h). Each
// formula follows torch.optim's, operation for operation, so that f32 results agree to rounding.
#include "meshfuse/optimizer.h"

#include <cmath>

#include "meshfuse/error.h"
#include "meshfuse/ops.h"

namespace meshfuse {

namespace {

// One parameter's inputs inside the group's fusion, in f32, with the scalars broadcast to it.
struct ParamVals {
  TensorView* param = nullptr;  // f32: the master, or the parameter itself
  TensorView* grad = nullptr;   // f32
  std::vector<TensorView*> state, scalars;
};

class GroupBuilder {
 public:
  GroupBuilder(const std::vector<std::string>& state, const std::vector<std::string>& scalars) {
    step_.fusion = std::make_unique<Fusion>();
    step_.state = state;
    step_.scalars = scalars;
  }

  ParamVals addParam(const ParamType& t, size_t k) {
    Fusion& f = *step_.fusion;
    OptimizerStep::Param p;
    p.has_master = t.dtype != DataType::Float;
    p.first_input = static_cast<int64_t>(f.inputs().size());
    ParamVals v;
    TensorView* param = f.defineTensor(t.shape, t.dtype, fmt::format("param{}", k));
    v.param = p.has_master ? f.defineTensor(t.shape, DataType::Float, fmt::format("master{}", k)) : param;
    TensorView* g = f.defineTensor(t.shape, t.dtype, fmt::format("grad{}", k));
    v.grad = t.dtype == DataType::Float ? g : ops::cast(g, DataType::Float);
    for (const std::string& s : step_.state)
      v.state.push_back(f.defineTensor(t.shape, DataType::Float, fmt::format("{}{}", s, k)));
    step_.params.push_back(p);
    ranks_.push_back(static_cast<int64_t>(t.shape.size()));
    return v;
  }

  // The scalar inputs (defined after every parameter's), broadcast to each parameter's rank.
  void addScalars(std::vector<ParamVals>& vals) {
    std::vector<TensorView*> scalars;
    for (const std::string& s : step_.scalars) scalars.push_back(step_.fusion->defineTensor({}, DataType::Float, s));
    for (size_t k = 0; k < vals.size(); ++k)
      for (TensorView* s : scalars)
        vals[k].scalars.push_back(ranks_[k] == 0 ? s : ops::broadcastInDim(s, std::vector<int64_t>(ranks_[k], 1), {}));
  }

  // Outputs of parameter k in input order (param, master, state), each updating its input.
  void finish(size_t k, TensorView* new_param, const std::vector<TensorView*>& new_state) {
    Fusion& f = *step_.fusion;
    OptimizerStep::Param& p = step_.params[k];
    p.first_output = static_cast<int64_t>(f.outputs().size());
    std::vector<std::pair<TensorView*, int64_t>> outs;  // (value, the input it updates)
    if (p.has_master) outs.push_back({ops::cast(new_param, f.inputs()[p.first_input]->dtype()), p.first_input});
    outs.push_back({new_param, p.first_input + (p.has_master ? 1 : 0)});
    for (size_t s = 0; s < new_state.size(); ++s) outs.push_back({new_state[s], p.stateInput(s)});
    for (auto& [value, input] : outs) {
      f.addOutput(value);
      f.aliasOutputToInput(static_cast<int64_t>(f.outputs().size()) - 1, input);
    }
  }

  OptimizerStep take() { return std::move(step_); }

 private:
  OptimizerStep step_;
  std::vector<int64_t> ranks_;
};

// torch.optim.SGD with dampening 0; scalars: lr.
void sgd(const SgdOptions& o, GroupBuilder& b, size_t k, const ParamVals& v) {
  TensorView* d = v.grad;
  if (o.weight_decay != 0) d = ops::add(d, ops::mul(v.param, o.weight_decay));
  std::vector<TensorView*> new_state;
  if (o.momentum != 0) {
    // torch starts the buffer at the first gradient; a zero buffer gives exactly that (m*0 + g = g).
    TensorView* buf = ops::add(ops::mul(v.state[0], o.momentum), d);
    new_state.push_back(buf);
    d = o.nesterov ? ops::add(d, ops::mul(buf, o.momentum)) : buf;
  }
  b.finish(k, ops::sub(v.param, ops::mul(d, v.scalars[0])), new_state);
}

// torch.optim.AdamW; scalars: decay = 1 - lr*wd, step_size = lr / (1 - beta1^t),
// bc2_sqrt = sqrt(1 - beta2^t).
void adamw(const AdamWOptions& o, GroupBuilder& b, size_t k, const ParamVals& v) {
  TensorView* p = ops::mul(v.param, v.scalars[0]);
  TensorView* m = ops::add(v.state[0], ops::mul(ops::sub(v.grad, v.state[0]), 1.0 - o.beta1));  // lerp
  TensorView* sq = ops::add(ops::mul(v.state[1], o.beta2), ops::mul(ops::mul(v.grad, v.grad), 1.0 - o.beta2));
  TensorView* denom = ops::add(ops::div(ops::sqrt(sq), v.scalars[2]), o.eps);
  b.finish(k, ops::sub(p, ops::mul(ops::div(m, denom), v.scalars[1])), {m, sq});
}

}  // namespace

int64_t OptimizerStep::numParamInputs() const {
  int64_t n = 0;
  for (const Param& p : params) n += (p.has_master ? 3 : 2) + static_cast<int64_t>(state.size());
  return n;
}

void checkOptimizerConfig(const OptimizerConfig& config) {
  if (const auto* s = std::get_if<SgdOptions>(&config)) {
    MF_USER_CHECK(s->lr >= 0, ErrorKind::Value, "SGD: invalid learning rate {} (must be >= 0)", s->lr);
    MF_USER_CHECK(s->momentum >= 0, ErrorKind::Value, "SGD: invalid momentum {} (must be >= 0)", s->momentum);
    MF_USER_CHECK(s->weight_decay >= 0, ErrorKind::Value, "SGD: invalid weight_decay {} (must be >= 0)",
                  s->weight_decay);
    MF_USER_CHECK(!s->nesterov || s->momentum > 0, ErrorKind::Value, "SGD: nesterov momentum needs momentum > 0");
    return;
  }
  const auto& a = std::get<AdamWOptions>(config);
  MF_USER_CHECK(a.lr >= 0, ErrorKind::Value, "AdamW: invalid learning rate {} (must be >= 0)", a.lr);
  MF_USER_CHECK(a.eps >= 0, ErrorKind::Value, "AdamW: invalid eps {} (must be >= 0)", a.eps);
  MF_USER_CHECK(a.beta1 >= 0 && a.beta1 < 1 && a.beta2 >= 0 && a.beta2 < 1, ErrorKind::Value,
                "AdamW: invalid betas ({}, {}) (each must be in [0, 1))", a.beta1, a.beta2);
  MF_USER_CHECK(a.weight_decay >= 0, ErrorKind::Value, "AdamW: invalid weight_decay {} (must be >= 0)", a.weight_decay);
}

std::string optimizerName(const OptimizerConfig& config) {
  return std::holds_alternative<SgdOptions>(config) ? "sgd" : "adamw";
}

OptimizerStep buildOptimizerStep(const OptimizerConfig& config, const std::vector<ParamType>& params) {
  checkOptimizerConfig(config);
  MF_USER_CHECK(!params.empty(), ErrorKind::Value, "{}: no parameters to update", optimizerName(config));
  for (size_t k = 0; k < params.size(); ++k)
    MF_USER_CHECK(isFloatingPoint(params[k].dtype), ErrorKind::Dtype,
                  "{}: parameter {} is {}: only floating-point tensors can be optimized", optimizerName(config), k,
                  dtypeName(params[k].dtype));
  const auto* s = std::get_if<SgdOptions>(&config);
  GroupBuilder b(s ? (s->momentum != 0 ? std::vector<std::string>{"momentum_buffer"} : std::vector<std::string>{})
                   : std::vector<std::string>{"exp_avg", "exp_avg_sq"},
                 s ? std::vector<std::string>{"lr"} : std::vector<std::string>{"decay", "step_size", "bc2_sqrt"});
  std::vector<ParamVals> vals;
  for (size_t k = 0; k < params.size(); ++k) vals.push_back(b.addParam(params[k], k));
  b.addScalars(vals);
  for (size_t k = 0; k < params.size(); ++k) {
    if (s)
      sgd(*s, b, k, vals[k]);
    else
      adamw(std::get<AdamWOptions>(config), b, k, vals[k]);
  }
  return b.take();
}

std::vector<double> optimizerScalars(const OptimizerConfig& config, int64_t step) {
  MF_USER_CHECK(step >= 1, ErrorKind::Value, "optimizer step {}: steps count from 1", step);
  if (const auto* s = std::get_if<SgdOptions>(&config)) return {s->lr};
  const auto& a = std::get<AdamWOptions>(config);
  double bc1 = 1 - std::pow(a.beta1, static_cast<double>(step));
  double bc2 = 1 - std::pow(a.beta2, static_cast<double>(step));
  return {1 - a.lr * a.weight_decay, a.lr / bc1, std::sqrt(bc2)};
}

}  // namespace meshfuse
