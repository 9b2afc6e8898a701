// The reference backend: each segment's ops run one at a time through the reference
// executor's loops (GEMMs through cblas_dgemm). Slow, obviously correct: the oracle.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>

#include "meshfuse/ir/fusion.h"
#include "meshfuse/reference.h"
#include "driver/backends.h"
#include "runtime/backend.h"

namespace meshfuse {
namespace {

class ReferenceBackend final : public Backend {
 public:
  std::string name() const override { return "reference"; }
  Tensor allocate(DataType dtype, const std::vector<int64_t>& shape) override { return Tensor::empty(dtype, shape); }

  void runSegment(const Segment& seg, const std::vector<const Tensor*>& inputs, const std::vector<Tensor*>& outputs,
                  const ShapeFn& shape_of) override {
    std::map<const TensorView*, Tensor> values;
    for (size_t i = 0; i < inputs.size(); ++i) values[seg.inputs[i]] = *inputs[i];
    for (const Expr* e : seg.exprs) {
      std::vector<const Tensor*> operands;
      for (const Val* v : e->inputs())
        operands.push_back(v != nullptr && v->valKind() == ValKind::TensorView
                               ? &values.at(static_cast<const TensorView*>(v))
                               : nullptr);
      values[e->output()] = evaluateExpr(e, operands, shape_of(e->output()));
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      const Tensor& v = values.at(seg.outputs[i]);
      MF_CHECK(v.shape() == outputs[i]->shape(), "segment output {} has shape {} but its buffer {}",
               i, v.shapeString(), outputs[i]->shapeString());
      std::memcpy(outputs[i]->data(), v.data(), v.nbytes());
    }
  }

  // The step in double: each row's attention over this launch's keys (positions and mask as
  // AttentionLaunch says), merged with what the outputs hold by log-sum-exp when accumulating.
  void runAttentionStep(const Segment& seg, const std::vector<const Tensor*>& inputs,
                        const std::vector<Tensor*>& outputs, const ShapeFn&, const AttentionLaunch& launch) override {
    if (seg.exprs[0]->kind() == OpKind::SdpaGrad) {  // one, or the key's and the value's (segment.h)
      for (size_t i = 0; i < seg.exprs.size(); ++i) {
        auto it = std::find(seg.outputs.begin(), seg.outputs.end(), seg.exprs[i]->output());
        gradientStep(seg, seg.exprs[i], inputs, *outputs.at(it - seg.outputs.begin()), launch);
      }
      return;
    }
    const Expr* sdpa = nullptr;
    const Expr* lse_op = nullptr;
    for (const Expr* e : seg.exprs) (e->kind() == OpKind::Sdpa ? sdpa : lse_op) = e;
    MF_CHECK(!launch.accumulate || lse_op != nullptr, "an attention step that merges needs its sdpa_lse");
    const Expr* e = sdpa != nullptr ? sdpa : lse_op;
    auto input = [&](size_t i) -> const Tensor& {
      auto it = std::find(seg.inputs.begin(), seg.inputs.end(), e->input(i));
      return *inputs.at(it - seg.inputs.begin());
    };
    auto output = [&](const Expr* op) -> Tensor* {
      if (op == nullptr) return nullptr;
      auto it = std::find(seg.outputs.begin(), seg.outputs.end(), op->output());
      return outputs.at(it - seg.outputs.begin());
    };
    const Tensor &q = input(0), &k = input(1);
    const Tensor* v = sdpa != nullptr ? &input(2) : nullptr;
    Tensor *o = output(sdpa), *lse = output(lse_op);
    const int64_t bh = q.shape()[0] * q.shape()[1], s = q.shape()[2], d = q.shape()[3];
    const int64_t skv = k.shape()[2], dv = v != nullptr ? v->shape()[3] : 0;
    double scale = e->attr<double>("scale");
    if (scale == 0) scale = 1 / std::sqrt(static_cast<double>(d));
    const bool causal = e->attr<bool>("is_causal");
    const std::vector<int64_t> qpos = positions(launch.query, s), kpos = positions(launch.key, skv);
    const double inf = std::numeric_limits<double>::infinity();
    std::vector<double> p(skv), acc(dv);
    for (int64_t g = 0; g < bh; ++g) {
      for (int64_t i = 0; i < s; ++i) {
        double mx = -inf;
        for (int64_t j = 0; j < skv; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += q.get((g * s + i) * d + c) * k.get((g * skv + j) * d + c);
          p[j] = causal && kpos[j] > qpos[i] ? -inf : dot * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < skv; ++j) sum += (p[j] = mx == -inf ? 0 : std::exp(p[j] - mx));
        const double part = sum > 0 ? mx + std::log(sum) : -inf;  // this launch's log-sum-exp
        const double prev = launch.accumulate ? lse->get(g * s + i) : -inf;
        const double total = logAddExp(prev, part);
        for (int64_t c = 0; c < dv; ++c) {
          double x = 0;
          for (int64_t j = 0; j < skv; ++j) x += p[j] * v->get((g * skv + j) * dv + c);
          const double mine = sum > 0 ? x / sum * std::exp(part - total) : 0;
          const double before = prev == -inf ? 0 : o->get((g * s + i) * dv + c) * std::exp(prev - total);
          acc[c] = mine + before;
        }
        for (int64_t c = 0; c < dv; ++c) o->set((g * s + i) * dv + c, acc[c]);
        if (lse != nullptr) lse->set(g * s + i, total);
      }
    }
  }

 private:
  // An attention gradient (an sdpa_grad with its lse and delta) on rows at `launch`'s positions,
  // in double, added into what `out` holds when accumulating: P = exp(scale q k^T - lse) masked
  // by global positions, dV = P^T g, dS = P (g v^T - delta) scale, dQ = dS k, dK = dS^T q.
  static void gradientStep(const Segment& seg, const Expr* e, const std::vector<const Tensor*>& inputs, Tensor& out,
                           const AttentionLaunch& launch) {
    MF_CHECK(e->input("lse") != nullptr && e->input("delta") != nullptr,
             "{}: an attention gradient step needs its lse and delta operands", e->name());
    auto input = [&](size_t i) -> const Tensor& {
      auto it = std::find(seg.inputs.begin(), seg.inputs.end(), e->input(i));
      return *inputs.at(it - seg.inputs.begin());
    };
    const Tensor &q = input(0), &k = input(1), &v = input(2), &g = input(3), &lse = input(4), &delta = input(5);
    const std::string& wrt = e->attr<std::string>("wrt");
    const int64_t bh = q.shape()[0] * q.shape()[1], s = q.shape()[2], d = q.shape()[3];
    const int64_t skv = k.shape()[2], dv = v.shape()[3];
    double scale = e->attr<double>("scale");
    if (scale == 0) scale = 1 / std::sqrt(static_cast<double>(d));
    const bool causal = e->attr<bool>("is_causal");
    const std::vector<int64_t> qpos = positions(launch.query, s), kpos = positions(launch.key, skv);
    std::vector<double> acc(static_cast<size_t>(out.numel()), 0.0);
    if (launch.accumulate)
      for (int64_t x = 0; x < out.numel(); ++x) acc[x] = out.get(x);
    const int64_t width = wrt == "value" ? dv : d;
    for (int64_t b = 0; b < bh; ++b)
      for (int64_t i = 0; i < s; ++i) {
        const double row_lse = lse.get(b * s + i);
        if (row_lse == -INFINITY) continue;
        for (int64_t j = 0; j < skv; ++j) {
          if (causal && kpos[j] > qpos[i]) continue;
          double dot = 0, dp = 0;
          for (int64_t c = 0; c < d; ++c) dot += q.get((b * s + i) * d + c) * k.get((b * skv + j) * d + c);
          const double p = std::exp(dot * scale - row_lse);
          if (wrt == "value") {
            for (int64_t c = 0; c < dv; ++c) acc[(b * skv + j) * width + c] += p * g.get((b * s + i) * dv + c);
            continue;
          }
          for (int64_t c = 0; c < dv; ++c) dp += g.get((b * s + i) * dv + c) * v.get((b * skv + j) * dv + c);
          const double ds = p * (dp - delta.get(b * s + i)) * scale;
          for (int64_t c = 0; c < d; ++c) {
            if (wrt == "query")
              acc[(b * s + i) * width + c] += ds * k.get((b * skv + j) * d + c);
            else
              acc[(b * skv + j) * width + c] += ds * q.get((b * s + i) * d + c);
          }
        }
      }
    for (int64_t x = 0; x < out.numel(); ++x) out.set(x, acc[x]);
  }

  static double logAddExp(double a, double b) {
    const double m = std::max(a, b);
    return m == -std::numeric_limits<double>::infinity() ? m : m + std::log(std::exp(a - m) + std::exp(b - m));
  }
  // The global position of each of `n` local rows.
  static std::vector<int64_t> positions(const std::vector<AttentionLaunch::Rows>& blocks, int64_t n) {
    std::vector<int64_t> out;
    for (const AttentionLaunch::Rows& b : blocks)
      for (int64_t r = 0; r < b.count; ++r) out.push_back(b.start + r);
    if (blocks.empty())
      for (int64_t r = 0; r < n; ++r) out.push_back(r);
    MF_CHECK(static_cast<int64_t>(out.size()) == n, "an attention step's blocks cover {} rows of {}", out.size(), n);
    return out;
  }
};

}  // namespace

std::unique_ptr<Backend> makeReferenceBackend() { return std::make_unique<ReferenceBackend>(); }

}  // namespace meshfuse
