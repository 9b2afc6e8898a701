// Reference executor: one straightforward loop nest per op over row-major double arrays.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>

#include "meshfuse/ir/fusion.h"
#include "meshfuse/reference.h"
#include "runtime/host_ir_evaluator.h"

namespace meshfuse {
namespace {

struct Array {
  std::vector<int64_t> shape;
  std::vector<double> data;
};

std::vector<int64_t> stridesOf(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * shape[i + 1];
  return s;
}

// Calls f(out_flat, index) for every multi-index of `shape` in row-major order.
template <typename F>
void forEachIndex(const std::vector<int64_t>& shape, F&& f) {
  int64_t n = numel(shape);
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t flat = 0; flat < n; ++flat) {
    f(flat, idx);
    for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

double gelu(double x, bool tanh_approx) {
  if (tanh_approx) return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}

double unary(OpKind k, double x, const Expr* e) {
  static_assert(opCountOf(OpCategory::Unary) == 12, "a new unary op in ops.def: compute it here");
  switch (k) {
    case OpKind::Neg: return -x;
    case OpKind::Abs: return std::fabs(x);
    case OpKind::Exp: return std::exp(x);
    case OpKind::Log: return std::log(x);
    case OpKind::Sqrt: return std::sqrt(x);
    case OpKind::Rsqrt: return 1 / std::sqrt(x);
    case OpKind::Reciprocal: return 1 / x;
    case OpKind::Tanh: return std::tanh(x);
    case OpKind::Sigmoid: return 1 / (1 + std::exp(-x));
    case OpKind::Relu: return x > 0 ? x : 0;
    case OpKind::Gelu: return gelu(x, e->attr<std::string>("approximate") == "tanh");
    case OpKind::Silu: return x / (1 + std::exp(-x));
    default: MF_CHECK(false, "{} is not unary", opInfo(k).name);
  }
}

double binary(OpKind k, double a, double b, DataType dt) {
  static_assert(opCountOf(OpCategory::Binary) + opCountOf(OpCategory::Compare) == 13,
                "a new binary or comparison op in ops.def: compute it here");
  switch (k) {
    case OpKind::Add: return a + b;
    case OpKind::Sub: return a - b;
    case OpKind::Mul: return a * b;
    case OpKind::Div: return a / b;
    case OpKind::Pow: return std::pow(a, b);
    case OpKind::Maximum: return std::max(a, b);
    case OpKind::Minimum: return std::min(a, b);
    case OpKind::Eq: return a == b;
    case OpKind::Ne: return a != b;
    case OpKind::Lt: return a < b;
    case OpKind::Le: return a <= b;
    case OpKind::Gt: return a > b;
    case OpKind::Ge: return a >= b;
    default: MF_CHECK(false, "{} is not binary ({})", opInfo(k).name, dtypeName(dt));
  }
}

class Evaluator {
 public:
  explicit Evaluator(SymbolBindings b, bool round = true) : bindings_(std::move(b)), round_(round) {}

  void set(const Val* v, Array a) { values_[v] = std::move(a); }
  const Array& get(const Val* v) const { return values_.at(v); }

  std::vector<int64_t> shapeOf(const TensorView* tv) const { return tv->evaluateShape(bindings_); }

  // An operand broadcast to `shape` (same rank; size-1 dims and scalars repeat).
  std::function<double(const std::vector<int64_t>&)> reader(const Val* v) const {
    if (v->valKind() == ValKind::Scalar) {
      double x = static_cast<const Scalar*>(v)->value();
      return [x](const std::vector<int64_t>&) { return x; };
    }
    const Array& a = values_.at(v);
    std::vector<int64_t> st = stridesOf(a.shape);
    for (size_t d = 0; d < st.size(); ++d)
      if (a.shape[d] == 1) st[d] = 0;
    return [&a, st](const std::vector<int64_t>& idx) {
      int64_t off = 0;
      for (size_t d = 0; d < st.size(); ++d) off += idx[d] * st[d];
      return a.data[off];
    };
  }

  const Array& in(const Expr* e, size_t i) const { return values_.at(e->input(i)); }

  Array run(const Expr* e) { return run(e, shapeOf(e->output())); }

  Array run(const Expr* e, std::vector<int64_t> out_shape) {
    const TensorView* out_tv = e->output();
    Array out{std::move(out_shape), {}};
    out.data.resize(numel(out.shape));
    switch (e->info().category) {
      case OpCategory::Unary:
      case OpCategory::Binary:
      case OpCategory::Compare:
      case OpCategory::Ternary: elementwise(e, out); break;
      case OpCategory::Cast:
      case OpCategory::Set:
      case OpCategory::Reshape: out.data = in(e, 0).data; break;
      case OpCategory::Reduction: reduce(e, out); break;
      case OpCategory::Gemm: gemm(e, out); break;
      case OpCategory::BroadcastInDim:
      case OpCategory::Permute:
      case OpCategory::Slice: gatherElements(e, out); break;
      case OpCategory::Cat: cat(e, out); break;
      case OpCategory::Softmax: softmax(e, out); break;
      case OpCategory::Norm: norm(e, out); break;
      case OpCategory::Attention: attention(e, out); break;
      case OpCategory::Indexing: indexing(e, out); break;
      case OpCategory::Loss: crossEntropy(e, out); break;
    }
    if (round_)
      for (double& v : out.data) v = roundToDtype(v, out_tv->dtype());
    return out;
  }

 private:
  void elementwise(const Expr* e, Array& out) {
    const DataType dtype = e->output()->dtype();
    switch (e->info().category) {
      case OpCategory::Unary: {
        auto r = reader(e->input(size_t{0}));
        forEachIndex(out.shape, [&](int64_t flat, const auto& idx) { out.data[flat] = unary(e->kind(), r(idx), e); });
        break;
      }
      case OpCategory::Ternary: {
        auto c = reader(e->input(size_t{0}));
        auto a = reader(e->input(size_t{1}));
        auto b = reader(e->input(size_t{2}));
        forEachIndex(out.shape, [&](int64_t flat, const auto& idx) { out.data[flat] = c(idx) != 0 ? a(idx) : b(idx); });
        break;
      }
      default: {  // Binary, Compare
        auto a = reader(e->input(size_t{0}));
        auto b = reader(e->input(size_t{1}));
        forEachIndex(out.shape, [&](int64_t flat, const auto& idx) {
          out.data[flat] = binary(e->kind(), a(idx), b(idx), dtype);
        });
        break;
      }
    }
  }

  // broadcast_in_dim, permute, slice: each output element is one input element, at the offset
  // the op's index map gives.
  void gatherElements(const Expr* e, Array& out) {
    const Array& x = in(e, 0);
    const std::vector<int64_t> st = stridesOf(x.shape);
    auto gather = [&](auto&& offset) {
      forEachIndex(out.shape, [&](int64_t flat, const auto& idx) { out.data[flat] = x.data[offset(idx)]; });
    };
    if (e->info().category == OpCategory::BroadcastInDim) {
      const auto& bd = e->attr<std::vector<int64_t>>("broadcast_dims");
      gather([&](const auto& idx) {
        int64_t off = 0;
        for (size_t i = 0; i < bd.size(); ++i) off += (x.shape[i] == 1 ? 0 : idx[bd[i]]) * st[i];
        return off;
      });
    } else if (e->info().category == OpCategory::Permute) {
      const auto& perm = e->attr<std::vector<int64_t>>("dims");
      gather([&](const auto& idx) {
        int64_t off = 0;
        for (size_t d = 0; d < perm.size(); ++d) off += idx[d] * st[(perm[d] + perm.size()) % perm.size()];
        return off;
      });
    } else {
      const auto& starts = e->attr<std::vector<int64_t>>("starts");
      gather([&](const auto& idx) {
        int64_t off = 0;
        for (size_t d = 0; d < idx.size(); ++d) off += (idx[d] + starts[d]) * st[d];
        return off;
      });
    }
  }

  void cat(const Expr* e, Array& out) {
    int64_t dim = e->attr<int64_t>("dim");
    if (dim < 0) dim += static_cast<int64_t>(out.shape.size());
    const std::vector<int64_t> ost = stridesOf(out.shape);
    int64_t base = 0;
    for (size_t i = 0; i < e->inputs().size(); ++i) {
      const Array& x = in(e, i);
      forEachIndex(x.shape, [&](int64_t flat, const auto& idx) {
        int64_t off = 0;
        for (size_t d = 0; d < idx.size(); ++d) off += (idx[d] + (static_cast<int64_t>(d) == dim ? base : 0)) * ost[d];
        out.data[off] = x.data[flat];
      });
      base += x.shape[dim];
    }
  }

  void reduce(const Expr* e, Array& out) {
    const Array& x = in(e, 0);
    std::vector<int64_t> dims = e->attr<std::vector<int64_t>>("dims");
    for (int64_t& d : dims) d = d < 0 ? d + static_cast<int64_t>(x.shape.size()) : d;
    bool is_max = e->kind() == OpKind::Max;
    std::fill(out.data.begin(), out.data.end(), is_max ? -std::numeric_limits<double>::infinity() : 0.0);
    std::vector<int64_t> ost = stridesOf(out.shape);
    int64_t count = 1;
    for (int64_t d : dims) count *= x.shape[d];
    forEachIndex(x.shape, [&](int64_t flat, const auto& idx) {
      int64_t off = 0, od = 0;
      for (size_t d = 0; d < idx.size(); ++d) {
        if (std::find(dims.begin(), dims.end(), static_cast<int64_t>(d)) != dims.end()) continue;
        off += idx[d] * ost[od++];
      }
      out.data[off] = is_max ? std::max(out.data[off], x.data[flat]) : out.data[off] + x.data[flat];
    });
    if (e->kind() == OpKind::Mean)
      for (double& v : out.data) v /= static_cast<double>(count);
  }

  void gemm(const Expr* e, Array& out) {
    const Array& a = in(e, 0);
    const Array& b = in(e, 1);
    int64_t k = a.shape.back();
    if (e->kind() == OpKind::Linear) {
      int64_t n = b.shape[0];
      int64_t m = numel(a.shape) / std::max<int64_t>(k, 1);
      if (m > 0 && n > 0 && k > 0)
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0, a.data.data(), k, b.data.data(), k, 0.0,
                    out.data.data(), n);
      if (e->input("bias") != nullptr) {
        const Array& bias = values_.at(e->input("bias"));
        for (int64_t i = 0; i < m * n; ++i) out.data[i] += bias.data[i % n];
      }
      return;
    }
    int64_t m = a.shape[a.shape.size() - 2], n = b.shape.back();
    int64_t batches = numel(a.shape) / std::max<int64_t>(m * k, 1);
    bool b_batched = b.shape.size() == a.shape.size() && b.shape.size() > 2;
    for (int64_t i = 0; i < batches; ++i)
      if (m > 0 && n > 0 && k > 0)
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0, a.data.data() + i * m * k, k,
                    b.data.data() + (b_batched ? i * k * n : 0), n, 0.0, out.data.data() + i * m * n, n);
  }

  // Applies f(row_start, stride, length) to every 1-D line of x along `dim`.
  template <typename F>
  static void forEachLine(const std::vector<int64_t>& shape, int64_t dim, F&& f) {
    std::vector<int64_t> st = stridesOf(shape);
    std::vector<int64_t> outer = shape;
    outer[dim] = 1;
    forEachIndex(outer, [&](int64_t, const auto& idx) {
      int64_t off = 0;
      for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * st[d];
      f(off, st[dim], shape[dim]);
    });
  }

  void softmax(const Expr* e, Array& out) {
    const Array& x = in(e, 0);
    int64_t dim = e->attr<int64_t>("dim");
    if (dim < 0) dim += static_cast<int64_t>(x.shape.size());
    const bool log = e->kind() == OpKind::LogSoftmax;
    forEachLine(x.shape, dim, [&](int64_t off, int64_t st, int64_t len) {
      double mx = -std::numeric_limits<double>::infinity(), sum = 0;
      for (int64_t i = 0; i < len; ++i) mx = std::max(mx, x.data[off + i * st]);
      for (int64_t i = 0; i < len; ++i) sum += std::exp(x.data[off + i * st] - mx);
      for (int64_t i = 0; i < len; ++i)
        out.data[off + i * st] =
            log ? x.data[off + i * st] - mx - std::log(sum) : std::exp(x.data[off + i * st] - mx) / sum;
    });
  }

  // An index value as a row of a table of `rows` rows, or -1 outside it.
  static int64_t rowOf(double v, int64_t rows) {
    return v >= 0 && v < static_cast<double>(rows) ? static_cast<int64_t>(v) : -1;
  }

  void indexing(const Expr* e, Array& out) {
    if (e->kind() == OpKind::OneHot) {  // out [n, C]: n indices, C classes
      const Array& idx = in(e, 0);
      const int64_t c = e->attr<int64_t>("num_classes");
      std::fill(out.data.begin(), out.data.end(), 0.0);
      for (size_t i = 0; i < idx.data.size(); ++i)
        if (int64_t r = rowOf(idx.data[i], c); r >= 0) out.data[i * c + r] = 1;
      return;
    }
    if (e->kind() == OpKind::Embedding) {  // weight [G, V, H] (G = 1 ungrouped), indices [G, n]
      const Array& w = in(e, 0);
      const Array& idx = in(e, 1);
      const int64_t h = w.shape.back(), v = w.shape[w.shape.size() - 2];
      const int64_t groups = w.shape.size() == 3 ? w.shape[0] : 1;
      const int64_t n = static_cast<int64_t>(idx.data.size()) / std::max<int64_t>(groups, 1);
      for (int64_t g = 0; g < groups; ++g)
        for (int64_t i = 0; i < n; ++i) {
          const int64_t r = rowOf(idx.data[g * n + i], v);
          for (int64_t j = 0; j < h; ++j) out.data[(g * n + i) * h + j] = r < 0 ? 0.0 : w.data[(g * v + r) * h + j];
        }
      return;
    }
    // embedding_backward: grad [G, n, H], indices [G, n] -> out [G, V, H]
    const Array& gr = in(e, 0);
    const Array& idx = in(e, 1);
    const int64_t h = gr.shape.back(), v = e->attr<int64_t>("num_weights");
    const int64_t groups = e->attr<bool>("grouped") ? idx.shape[0] : 1;
    const int64_t n = static_cast<int64_t>(idx.data.size()) / std::max<int64_t>(groups, 1);
    std::fill(out.data.begin(), out.data.end(), 0.0);
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t i = 0; i < n; ++i)
        if (int64_t r = rowOf(idx.data[g * n + i], v); r >= 0)
          for (int64_t j = 0; j < h; ++j) out.data[(g * v + r) * h + j] += gr.data[(g * n + i) * h + j];
  }

  // Per element: logsumexp over the class dim minus the target's logit (0 where the target is
  // ignore_index; a target outside [0, C) picks 0); then the reduction.
  void crossEntropy(const Expr* e, Array& out) {
    const Array& x = in(e, 0);
    const Array& t = in(e, 1);
    const int64_t ignore = e->attr<int64_t>("ignore_index");
    const std::string& reduction = e->attr<std::string>("reduction");
    const int64_t class_dim = x.shape.size() >= 2 ? 1 : 0;
    const int64_t c = x.shape[class_dim];
    const int64_t outer = class_dim == 1 ? x.shape[0] : 1;
    const int64_t inner = static_cast<int64_t>(t.data.size()) / std::max<int64_t>(outer, 1);  // the d... dims
    std::vector<double> losses(t.data.size(), 0.0);
    double total = 0, count = 0;
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t elem = o * inner + i;
        if (t.data[elem] == static_cast<double>(ignore)) continue;
        auto at = [&](int64_t k) { return x.data[(o * c + k) * inner + i]; };
        double mx = -std::numeric_limits<double>::infinity(), sum = 0;
        for (int64_t k = 0; k < c; ++k) mx = std::max(mx, at(k));
        for (int64_t k = 0; k < c; ++k) sum += std::exp(at(k) - mx);
        const int64_t r = rowOf(t.data[elem], c);
        losses[elem] = std::log(sum) + mx - (r < 0 ? 0.0 : at(r));
        total += losses[elem];
        count += 1;
      }
    if (reduction == "none") {
      out.data = losses;
    } else {
      out.data.assign(1, reduction == "sum" ? total : total / count);
    }
  }

  void norm(const Expr* e, Array& out) {
    const Array& x = in(e, 0);
    bool layer = e->kind() == OpKind::LayerNorm;
    double eps = e->attr<double>("eps");
    const Val* w = e->input("weight");
    const Val* b = layer ? e->input("bias") : nullptr;
    int64_t dim = static_cast<int64_t>(x.shape.size()) - 1;
    forEachLine(x.shape, dim, [&](int64_t off, int64_t, int64_t len) {
      double mean = 0, var = 0;
      for (int64_t i = 0; i < len; ++i) mean += x.data[off + i];
      mean = layer ? mean / len : 0.0;
      for (int64_t i = 0; i < len; ++i) var += (x.data[off + i] - mean) * (x.data[off + i] - mean);
      double inv = 1 / std::sqrt(var / len + eps);
      for (int64_t i = 0; i < len; ++i) {
        double y = (x.data[off + i] - mean) * inv;
        if (w) y *= values_.at(w).data[i];
        if (b) y += values_.at(b).data[i];
        out.data[off + i] = y;
      }
    });
  }

  // Row i of attention entry g (a batch * head index): p[j] = exp(s_ij - max) for the scores
  // s_ij = scale q_i . k_j (0 where the causal mask hides key j); returns {max, sum of p}, so that
  // p / sum is row i of P and max + log(sum) its log-sum-exp.
  std::pair<double, double> expScores(const Expr* e, const Array& q, const Array& k, int64_t g, int64_t i,
                                      std::vector<double>& p) const {
    const int64_t s = q.shape[2], d = q.shape[3], skv = k.shape[2];
    double scale = e->attr<double>("scale");
    if (scale == 0) scale = 1 / std::sqrt(static_cast<double>(d));
    const bool causal = e->attr<bool>("is_causal");
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < skv; ++j) {
      double acc = 0;
      for (int64_t c = 0; c < d; ++c) acc += q.data[(g * s + i) * d + c] * k.data[(g * skv + j) * d + c];
      p[j] = (causal && j > i) ? -std::numeric_limits<double>::infinity() : acc * scale;
      mx = std::max(mx, p[j]);
    }
    double sum = 0;
    for (int64_t j = 0; j < skv; ++j) sum += (p[j] = std::exp(p[j] - mx));
    return {mx, sum};
  }

  // sdpa, or sdpa_lse (no value operand: the row's log-sum-exp instead of its output).
  void attention(const Expr* e, Array& out) {
    if (e->kind() == OpKind::SdpaGrad) return attentionGradient(e, out);
    const Array& q = in(e, 0);
    const Array& k = in(e, 1);
    const bool lse = e->kind() == OpKind::SdpaLse;
    const Array& v = lse ? k : in(e, 2);
    int64_t bh = q.shape[0] * q.shape[1], s = q.shape[2], skv = k.shape[2], dv = v.shape[3];
    std::vector<double> p(skv);
    for (int64_t g = 0; g < bh; ++g) {
      for (int64_t i = 0; i < s; ++i) {
        auto [mx, sum] = expScores(e, q, k, g, i, p);
        if (lse) {
          out.data[g * s + i] = mx + std::log(sum);  // no key (skv = 0): -inf
          continue;
        }
        for (int64_t c = 0; c < dv; ++c) {
          double acc = 0;
          for (int64_t j = 0; j < skv; ++j) acc += p[j] / sum * v.data[(g * skv + j) * dv + c];
          out.data[(g * s + i) * dv + c] = acc;
        }
      }
    }
  }

  // sdpa_grad: with P the attention probabilities and G the output gradient of entry g,
  // dV = P^T G; dS = P o (G V^T - rowsum(P o G V^T)) scale; dQ = dS K; dK = dS^T Q. With the lse
  // and delta operands, P = exp(scale Q K^T - lse) and rowsum(P o G V^T) = delta.
  void attentionGradient(const Expr* e, Array& out) {
    const Array &q = in(e, 0), &k = in(e, 1), &v = in(e, 2), &gr = in(e, 3);
    const Array* lse = e->input("lse") != nullptr ? &in(e, 4) : nullptr;
    const Array* delta = e->input("delta") != nullptr ? &in(e, 5) : nullptr;
    const std::string& wrt = e->attr<std::string>("wrt");
    const int64_t bh = q.shape[0] * q.shape[1], s = q.shape[2], d = q.shape[3], skv = k.shape[2], dv = v.shape[3];
    double scale = e->attr<double>("scale");
    if (scale == 0) scale = 1 / std::sqrt(static_cast<double>(d));
    std::fill(out.data.begin(), out.data.end(), 0.0);
    std::vector<double> p(skv), ds(skv);
    for (int64_t g = 0; g < bh; ++g) {
      for (int64_t i = 0; i < s; ++i) {
        auto [mx, sum] = expScores(e, q, k, g, i, p);
        // P = p / sum, or with the forward's lse exp(score - lse) = p exp(mx - lse): the same
        // probabilities, which a block of the keys alone gives too.
        const double norm = lse == nullptr ? 1 / sum : mx == -INFINITY ? 0 : std::exp(mx - lse->data[g * s + i]);
        const double* gi = &gr.data[(g * s + i) * dv];
        if (wrt == "value") {
          for (int64_t j = 0; j < skv; ++j)
            for (int64_t c = 0; c < dv; ++c) out.data[(g * skv + j) * dv + c] += p[j] * norm * gi[c];
          continue;
        }
        double dot = 0;  // rowsum(P o dP) = rowsum(G o O): the delta operand, when given
        for (int64_t j = 0; j < skv; ++j) {
          double dp = 0;
          for (int64_t c = 0; c < dv; ++c) dp += gi[c] * v.data[(g * skv + j) * dv + c];
          ds[j] = dp;
          dot += p[j] * norm * dp;
        }
        if (delta != nullptr) dot = delta->data[g * s + i];
        for (int64_t j = 0; j < skv; ++j) {
          const double dsij = p[j] * norm * (ds[j] - dot) * scale;
          for (int64_t c = 0; c < d; ++c) {
            if (wrt == "query")
              out.data[(g * s + i) * d + c] += dsij * k.data[(g * skv + j) * d + c];
            else
              out.data[(g * skv + j) * d + c] += dsij * q.data[(g * s + i) * d + c];
          }
        }
      }
    }
  }

  SymbolBindings bindings_;
  std::map<const Val*, Array> values_;
  bool round_ = true;  // to each op's output dtype; false: all in f64 (evaluateReferenceF64)
};

}  // namespace

SymbolBindings bindInputs(const Fusion& f, const std::vector<Tensor>& inputs) {
  return bindLocalInputs(f, inputs, /*rank=*/-1);  // full tensors: shardings play no part
}

Tensor evaluateExpr(const Expr* e, const std::vector<const Tensor*>& operands, const std::vector<int64_t>& out_shape) {
  MF_CHECK(operands.size() == e->inputs().size(), "{}: {} operand tensors for {} operands", e->name(), operands.size(),
           e->inputs().size());
  Evaluator ev{SymbolBindings{}};
  for (size_t i = 0; i < operands.size(); ++i)
    if (operands[i] != nullptr) ev.set(e->inputs()[i], {operands[i]->shape(), operands[i]->toValues()});
  Array a = ev.run(e, out_shape);
  return Tensor::fromValues(e->output()->dtype(), a.shape, a.data);
}

std::vector<Tensor> evaluateReference(const Fusion& f, const std::vector<Tensor>& inputs) {
  Evaluator ev(bindInputs(f, inputs));
  for (size_t i = 0; i < inputs.size(); ++i) ev.set(f.inputs()[i], {inputs[i].shape(), inputs[i].toValues()});
  for (const Expr* e : f.exprs()) ev.set(e->output(), ev.run(e));
  std::vector<Tensor> outs;
  for (const TensorView* o : f.outputs()) {
    const Array& a = ev.get(o);
    outs.push_back(Tensor::fromValues(o->dtype(), a.shape, a.data));
  }
  return outs;
}

std::vector<ReferenceArray> evaluateReferenceF64(const Fusion& f, const std::vector<ReferenceArray>& inputs) {
  MF_USER_CHECK(inputs.size() == f.inputs().size(), ErrorKind::Value, "the fusion has {} inputs but {} were given",
                f.inputs().size(), inputs.size());
  std::vector<Tensor> shapes;  // binds the symbolic sizes (and checks ranks and sizes, with names)
  for (size_t i = 0; i < inputs.size(); ++i) shapes.push_back(Tensor::empty(f.inputs()[i]->dtype(), inputs[i].shape));
  Evaluator ev(bindInputs(f, shapes), /*round=*/false);
  for (size_t i = 0; i < inputs.size(); ++i) ev.set(f.inputs()[i], {inputs[i].shape, inputs[i].data});
  for (const Expr* e : f.exprs()) ev.set(e->output(), ev.run(e));
  std::vector<ReferenceArray> outs;
  for (const TensorView* o : f.outputs()) {
    const Array& a = ev.get(o);
    outs.push_back({a.shape, a.data});
  }
  return outs;
}

ReferenceComparison compareWithReference(const Tensor& actual, const Tensor& reference) {
  ReferenceComparison c;
  std::vector<double> a = actual.toValues(), r = reference.toValues();
  for (double x : r)
    if (std::isfinite(x)) c.max_ref = std::max(c.max_ref, std::fabs(x));
  const double eps = dtypeEpsilon(reference.dtype());
  c.allowed_abs = kReferenceToleranceEps * eps * c.max_ref;
  c.pass = actual.shape() == reference.shape();
  for (size_t k = 0; k < a.size() && k < r.size(); ++k) {
    // Equal values (infinities included) and NaN against NaN agree; any other NaN or infinity
    // is an infinite error.
    double err = a[k] == r[k] || (std::isnan(a[k]) && std::isnan(r[k])) ? 0 : std::fabs(a[k] - r[k]);
    if (std::isnan(err)) err = INFINITY;
    c.max_abs_err = std::max(c.max_abs_err, err);
    c.max_rel_err = std::max(c.max_rel_err, err / std::max(std::fabs(r[k]), 1e-30));
    c.pass &= err <= c.allowed_abs + kReferenceToleranceEps * eps * (std::isfinite(r[k]) ? std::fabs(r[k]) : 0);
  }
  return c;
}

}  // namespace meshfuse
