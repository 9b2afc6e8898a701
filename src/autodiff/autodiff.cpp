// differentiate(): the forward fusion with saves and the backward fusion of vector-Jacobian
// products (include/meshfuse/autodiff.h). Rules live in grad_rules.cpp, one per op.
//
// The backward fusion is built twice: the first build discovers which forward tensors backward
// reads (saved), the second declares them as inputs first, in forward program order, then the
// seeds -- so the backward's inputs are ordered and named deterministically.
#include "meshfuse/autodiff.h"

#include <algorithm>
#include <map>
#include <set>

#include "autodiff/grad_context.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/ir/placement.h"
#include "meshfuse/ir/verifier.h"
#include "meshfuse/ops.h"

namespace meshfuse {
namespace {

using autodiff::GradContext;

// Copies `from`'s mesh and placements onto `to` (pinned), Partial read as Replicate (a gradient
// or seed is a full value). Nothing when `from` has no mesh yet.
void copyPlacements(const TensorView* from, TensorView* to) {
  if (from->mesh() == nullptr) return;
  std::vector<Placement> ps = placementsOf(from);
  for (Placement& p : ps)
    if (p.kind == Placement::Partial) p = Placement::replicate();
  applyPlacements(to, *from->mesh(), ps);
}

// "grad_<name>", or "grad_<fallback><index>" for an unnamed tensor.
std::string gradName(const TensorView* tv, const char* fallback, int64_t index) {
  if (!tv->name().empty()) return "grad_" + tv->name();
  return fmt::format("grad_{}{}", fallback, index);
}

class Builder : public GradContext {
 public:
  Builder(Fusion& fwd, const AutodiffOptions& opt, const std::vector<TensorView*>& saved_order)
      : fwd_(fwd), opt_(opt), saved_order_(saved_order) {}

  Fusion& backward() override { return *bwd_; }
  bool wants(size_t i) const override {
    Val* v = current_->input(i);
    return v != nullptr && needs_.count(v) > 0;
  }

  TensorView* primal(Val* v) override {
    MF_CHECK(v->valKind() == ValKind::TensorView, "primal of a scalar");
    auto* tv = static_cast<TensorView*>(v);
    if (auto it = primal_.find(tv); it != primal_.end()) return it->second;
    TensorView* out = nullptr;
    if (isSaved(tv)) {
      out = declareSaved(tv);
    } else {  // recompute from its operands
      Expr* e = tv->definition();
      std::vector<Val*> in;
      for (Val* x : e->inputs()) {
        if (x == nullptr)
          in.push_back(nullptr);
        else if (x->valKind() == ValKind::Scalar)
          in.push_back(bwd_->scalar(static_cast<Scalar*>(x)->value(), x->dtype()));
        else
          in.push_back(primal(x));
      }
      out = bwd_->apply(e->kind(), in, e->attrs());
      recomputed_.push_back(fmt::format("{} = {}", fwd_.displayName(tv), e->name()));
    }
    primal_[tv] = out;
    return out;
  }

  // Builds the backward fusion of the differentiated outputs `outs` w.r.t. `wrt`.
  void build(const std::vector<TensorView*>& outs, const std::vector<TensorView*>& wrt) {
    bwd_ = std::make_unique<Fusion>();
    for (int64_t m = 0; m < fwd_.numMeshes(); ++m) bwd_->addMesh(fwd_.mesh(m), fwd_.meshName(m));  // names kept
    for (TensorView* s : saved_order_) declareSaved(s);
    std::map<TensorView*, TensorView*> grad;
    for (size_t i = 0; i < outs.size(); ++i) {
      TensorView* o = outs[i];
      TensorView* seed = bwd_->defineTensor(o->shape(), o->dtype(), gradName(o, "out", static_cast<int64_t>(i)));
      copyPlacements(o, seed);
      accumulate(grad, o, seed);
    }
    needs_ = needsGradient(wrt);
    const std::set<const Val*>& needs = needs_;
    const auto& exprs = fwd_.exprs();
    for (auto it = exprs.rbegin(); it != exprs.rend(); ++it) {
      Expr* e = *it;
      if (!grad.count(e->output())) continue;
      bool any = std::any_of(e->inputs().begin(), e->inputs().end(), [&](Val* v) { return v && needs.count(v); });
      if (!any) continue;
      current_ = e;
      std::vector<TensorView*> gs = autodiff::gradRuleOf(e->kind())(*this, e, gradientOf(grad, e->output()));
      MF_CHECK(gs.size() == e->inputs().size(), "gradient rule of {} returned {} gradients for {} operands", e->name(),
               gs.size(), e->inputs().size());
      for (size_t i = 0; i < gs.size(); ++i) {
        Val* x = e->input(i);
        if (gs[i] == nullptr || x == nullptr || !needs.count(x)) continue;
        accumulate(grad, static_cast<TensorView*>(x), autodiff::fitGradient(gs[i], static_cast<TensorView*>(x)));
      }
    }
    for (size_t i = 0; i < wrt.size(); ++i) {
      TensorView* x = wrt[i];
      TensorView* gx = gradientOf(grad, x);
      if (gx == nullptr) gx = autodiff::filledLike(primal(x), 0.0, x->dtype());
      // An output is a computed tensor of its own (not an input or another output). A contraction
      // (GEMM, reduction) is not pinned itself but through a `set`, where its collective lands (DDP's
      // weight gradients; an embedding table's scatter-add contracts the batch likewise). This began
      // as a workaround: a linear's output pinned to Replicate used to all-gather its contracted
      // operands instead of reducing its Partial result; propagation reduces it now
      // (docs/training.md, "Known issues"), and the set costs no copy.
      bool contraction = gx->definition() != nullptr && (gx->definition()->info().category == OpCategory::Gemm ||
                                                         gx->definition()->info().category == OpCategory::Reduction ||
                                                         gx->definition()->kind() == OpKind::EmbeddingBackward);
      if (bwd_->isInput(gx) || bwd_->isOutput(gx) || (contraction && x->mesh() != nullptr)) gx = ops::set(gx);
      bwd_->rename(gx, gradName(x, "in", static_cast<int64_t>(i)));
      copyPlacements(x, gx);
      bwd_->addOutput(gx);
    }
    // Rules build only wanted gradients, but a shared intermediate can still end unused (an
    // operand's gradient that fitGradient replaced): drop what no output reads.
    std::vector<Expr*> exprs_now = bwd_->exprs();
    for (auto it = exprs_now.rbegin(); it != exprs_now.rend(); ++it)
      if ((*it)->output()->uses().empty() && !bwd_->isOutput((*it)->output())) bwd_->removeExpr(*it);
  }

  std::unique_ptr<Fusion> takeBackward() { return std::move(bwd_); }
  const std::vector<TensorView*>& savedRequested() const { return saved_requested_; }
  const std::vector<std::string>& recomputed() const { return recomputed_; }

 private:
  bool isSaved(const TensorView* tv) const {
    if (fwd_.isInput(tv)) return true;
    if (opt_.policy == SavePolicy::All) return true;
    OpCategory cat = tv->definition()->info().category;
    return cat == OpCategory::Gemm || cat == OpCategory::Attention;
  }

  TensorView* declareSaved(TensorView* tv) {
    if (auto it = primal_.find(tv); it != primal_.end()) return it->second;
    if (std::find(saved_requested_.begin(), saved_requested_.end(), tv) == saved_requested_.end())
      saved_requested_.push_back(tv);
    std::string name = tv->name().empty() ? fmt::format("saved{}", saved_requested_.size() - 1) : tv->name();
    TensorView* in = bwd_->defineTensor(tv->shape(), tv->dtype(), name);
    copyPlacements(tv, in);
    primal_[tv] = in;
    return in;
  }

  // Sums the contributions to x's gradient; a bf16/f16 gradient with several contributions is
  // summed in f32 (gradientOf casts it back once).
  void accumulate(std::map<TensorView*, TensorView*>& grad, TensorView* x, TensorView* g) {
    auto [it, fresh] = grad.emplace(x, g);
    if (fresh) return;
    auto f32 = [](TensorView* t) { return t->dtype() == DataType::Float ? t : ops::cast(t, DataType::Float); };
    it->second = x->dtype() == DataType::Float ? ops::add(it->second, g) : ops::add(f32(it->second), f32(g));
  }
  // x's accumulated gradient in x's dtype (nullptr: none).
  static TensorView* gradientOf(const std::map<TensorView*, TensorView*>& grad, TensorView* x) {
    auto it = grad.find(x);
    if (it == grad.end()) return nullptr;
    return it->second->dtype() == x->dtype() ? it->second : ops::cast(it->second, x->dtype());
  }

  // The values on a path from a wrt input (forward-reachable).
  std::set<const Val*> needsGradient(const std::vector<TensorView*>& wrt) const {
    std::set<const Val*> needs(wrt.begin(), wrt.end());
    for (Expr* e : fwd_.exprs()) {
      bool any = std::any_of(e->inputs().begin(), e->inputs().end(), [&](Val* v) { return v && needs.count(v); });
      if (any && isFloatingPoint(e->output()->dtype())) needs.insert(e->output());
    }
    return needs;
  }

  Fusion& fwd_;
  const AutodiffOptions& opt_;
  std::set<const Val*> needs_;
  const Expr* current_ = nullptr;  // whose rule runs
  std::vector<TensorView*> saved_order_;
  std::unique_ptr<Fusion> bwd_;
  std::map<const TensorView*, TensorView*> primal_;
  std::vector<TensorView*> saved_requested_;
  std::vector<std::string> recomputed_;
};

std::string savedReason(const Fusion& fwd, const TensorView* tv) {
  if (fwd.isInput(tv)) return "input";
  const Expr* e = tv->definition();
  OpCategory cat = e->info().category;
  if (cat == OpCategory::Gemm) return fmt::format("GEMM output ({})", e->name());
  if (cat == OpCategory::Attention) return fmt::format("attention output ({})", e->name());
  return fmt::format("{} output (save-all policy)", e->name());
}

}  // namespace

Gradients differentiate(const Fusion& fusion, const std::vector<int64_t>& outputs, const std::vector<int64_t>& wrt,
                        const AutodiffOptions& options) {
  Gradients result;
  result.forward = fusion.clone();
  Fusion& fwd = *result.forward;
  MF_USER_CHECK(!outputs.empty(), ErrorKind::Value, "differentiate: no outputs to differentiate");
  MF_USER_CHECK(!wrt.empty(), ErrorKind::Value, "differentiate: no inputs to differentiate with respect to");
  auto pick = [](const auto& list, const std::vector<int64_t>& idx, const char* what) {
    std::vector<TensorView*> out;
    for (int64_t i : idx) {
      MF_USER_CHECK(i >= 0 && i < static_cast<int64_t>(list.size()), ErrorKind::Value,
                    "differentiate: {} index {} is out of range (the fusion has {})", what, i, list.size());
      MF_USER_CHECK(std::find(out.begin(), out.end(), list[i]) == out.end(), ErrorKind::Value,
                    "differentiate: {} {} is listed twice", what, i);
      out.push_back(list[i]);
    }
    return out;
  };
  std::vector<TensorView*> outs = pick(fwd.outputs(), outputs, "output");
  std::vector<TensorView*> xs = pick(fwd.inputs(), wrt, "input");
  for (size_t i = 0; i < xs.size(); ++i)
    MF_USER_CHECK(isFloatingPoint(xs[i]->dtype()), ErrorKind::Dtype,
                  "differentiate: cannot differentiate with respect to input {} ({}) of dtype {}: only "
                  "floating-point (f32, bf16, f16) inputs have gradients",
                  wrt[i], fwd.displayName(xs[i]), dtypeName(xs[i]->dtype()));
  for (size_t i = 0; i < outs.size(); ++i)
    MF_USER_CHECK(isFloatingPoint(outs[i]->dtype()), ErrorKind::Dtype,
                  "differentiate: cannot differentiate output {} ({}) of dtype {}: only floating-point outputs",
                  outputs[i], fwd.displayName(outs[i]), dtypeName(outs[i]->dtype()));

  Builder discover(fwd, options, {});
  discover.build(outs, xs);
  // Saved tensors in forward program order (inputs first).
  std::vector<TensorView*> saved;
  for (TensorView* tv : fwd.tensorViews())
    if (std::count(discover.savedRequested().begin(), discover.savedRequested().end(), tv)) saved.push_back(tv);
  Builder builder(fwd, options, saved);
  builder.build(outs, xs);
  MF_CHECK(builder.savedRequested().size() == saved.size(), "the second backward build saved other tensors");
  result.backward = builder.takeBackward();
  result.recomputed = builder.recomputed();
  result.num_original_outputs = static_cast<int64_t>(fwd.outputs().size());
  for (TensorView* tv : saved) {
    std::string why = savedReason(fwd, tv);
    if (fwd.isInput(tv)) {
      auto pos = std::find(fwd.inputs().begin(), fwd.inputs().end(), tv) - fwd.inputs().begin();
      result.backward_inputs.push_back({BackwardInput::ForwardInput, static_cast<int64_t>(pos), why});
      continue;
    }
    if (!fwd.isOutput(tv)) fwd.addOutput(tv);
    auto pos = std::find(fwd.outputs().begin(), fwd.outputs().end(), tv) - fwd.outputs().begin();
    result.backward_inputs.push_back({BackwardInput::ForwardOutput, static_cast<int64_t>(pos), why});
  }
  for (size_t i = 0; i < outs.size(); ++i)
    result.backward_inputs.push_back(
        {BackwardInput::Seed, static_cast<int64_t>(i), fmt::format("seed of output {}", outputs[i])});
  verify(*result.forward);  // a rule that builds ill-typed IR is caught here, not at run time
  verify(*result.backward);
  return result;
}

std::string describeSaves(const Gradients& g) {
  std::string s = "# backward inputs:";
  const Fusion& b = *g.backward;
  for (size_t i = 0; i < g.backward_inputs.size(); ++i) {
    const BackwardInput& in = g.backward_inputs[i];
    const char* from = in.kind == BackwardInput::ForwardInput    ? "forward input"
                       : in.kind == BackwardInput::ForwardOutput ? "forward output"
                                                                 : "seed";
    s += fmt::format("\n#   {} <- {} {}: {}", b.displayName(b.inputs()[i]), from, in.index, in.reason);
  }
  s += "\n# recomputed in backward:";
  if (g.recomputed.empty()) s += " nothing";
  for (const std::string& r : g.recomputed) s += "\n#   " + r;
  return s + "\n";
}

}  // namespace meshfuse
