// Gemm segments -> GEMM calls plus the small loop nests around them.
//
// requires: a Gemm segment: a linear, matmul or sdpa, after the permutes of its operands that
//   segment let in (swaps of the last two dims, read in place as transposed operands).
// guarantees: GEMMs read their operands in place whatever the layout BLAS can express: a
//   linear's weight [n, k] is B transposed (no copy), a transposed operand is read with the
//   opposite transpose flag (no copy), a matmul with a 2-D right operand is one
//   GEMM over all batch rows, batched matmuls and attention are strided-batch GEMMs.
//   f32 only: bf16/f16 operands are widened into f32 temporaries and the result rounded back
//   (BLAS has no 16-bit GEMM). A linear's bias is fused INTO the GEMM: C starts as the bias rows
//   and the GEMM accumulates (beta = 1).
//
//   sdpa(q, k, v):  one Attention step (the targets' tiled online-softmax kernels; no [s, skv]
//                   score matrix). With MESHFUSE_SDPA_MATERIALIZED=1 in the environment (for
//                   benchmarks only): S = scale * Q K^T (one GEMM per batch*head) -> loops: masked
//                   softmax of every row of S, in place -> O = S V, the lowering before the tiled kernel.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>

#include "codegen/kernel_graph.h"
#include "codegen/kernel_lower.h"
#include "meshfuse/ir/fusion.h"
#include "lower/segment.h"

namespace meshfuse::kir {
namespace {

class GemmLowering {
 public:
  explicit GemmLowering(Program& p) : p_(p) {}

  // An f32 view of `buffer`: itself, or a widened copy (one per buffer: sdpa(x, x, x) widens once).
  int64_t f32(int64_t buffer) {
    const Buffer b = p_.buffers[buffer];
    if (b.dtype == DataType::Float) return buffer;
    if (auto it = widened_.find(buffer); it != widened_.end()) return it->second;
    int64_t t = p_.addBuffer({Buffer::Temp, DataType::Float, b.shape, ""});
    copy(buffer, t, b.numel());
    widened_[buffer] = t;
    return t;
  }

  // The f32 buffer a result is computed in: the output itself or a temporary rounded into it
  // by finish().
  int64_t f32Result(int64_t out) {
    const Buffer b = p_.buffers[out];
    if (b.dtype == DataType::Float) return out;
    int64_t t = p_.addBuffer({Buffer::Temp, DataType::Float, b.shape, ""});
    pending_.push_back({t, out});
    return t;
  }
  void finish() {
    for (auto [from, to] : pending_) copy(from, to, p_.buffers[to].numel());
  }

  // dst[i] = src[i] (converting dtypes).
  void copy(int64_t src, int64_t dst, int64_t n) {
    Loops l(p_);
    Expr i = l.loop(n);
    l.store(dst, i, load(src, valueTypeOf(p_.buffers[src].dtype), i));
    push(l, "copy");
  }

  // c[i, j] = bias[j] for a [rows, cols] c (or `value` without a bias).
  void fillRows(int64_t c, int64_t rows, int64_t cols, int64_t bias, double value = 0) {
    Loops l(p_);
    Expr i = l.loop(rows), j = l.loop(cols);
    l.store(c, add(mul(i, index(cols)), j), bias < 0 ? constant(value, Type::F32) : load(bias, Type::F32, j));
    push(l, "fill");
  }

  void gemm(Gemm g) {
    Step s{Step::GemmCall, {}, std::move(g)};
    p_.steps.push_back(std::move(s));
  }

  // The attention the tiled kernel replaced, kept for benchmarks only (MESHFUSE_SDPA_MATERIALIZED):
  // S = scale Q K^T as one [batch, s, skv] temporary, its masked softmax in place, O = S V.
  void materializedAttention(const Attention& a) {
    const int64_t sc = p_.addBuffer({Buffer::Temp, DataType::Float, {a.batch, a.s, a.skv}, ""});
    if (a.d == 0) {
      fillRows(sc, a.batch * a.s, a.skv, -1);
    } else {
      Gemm qk;
      qk.m = a.s, qk.n = a.skv, qk.k = a.d, qk.alpha = a.scale;
      qk.a = {a.q, 0, a.d, false};
      qk.b = {a.k, 0, a.d, true};
      qk.c = {sc, 0, a.skv, false};
      qk.batch = {{a.batch, a.s * a.d, a.skv * a.d, a.s * a.skv}};
      gemm(qk);
    }
    maskedSoftmax(sc, a.batch, a.s, a.skv, a.causal);
    Gemm pv;
    pv.m = a.s, pv.n = a.dv, pv.k = a.skv;
    pv.a = {sc, 0, a.skv, false};
    pv.b = {a.v, 0, a.dv, false};
    pv.c = {a.o, 0, a.dv, false};
    pv.batch = {{a.batch, a.s * a.skv, a.skv * a.dv, a.s * a.dv}};
    gemm(pv);
  }

  // Softmax of every row of s [rows_outer, rows, cols] in place; with `causal`, entry (i, j)
  // with j > i is masked out (as -inf before the softmax).
  void maskedSoftmax(int64_t s, int64_t batch, int64_t rows, int64_t cols, bool causal) {
    Loops l(p_);
    Expr g = l.loop(batch), i = l.loop(rows);
    Expr base = mul(add(mul(g, index(rows)), i), index(cols));
    auto masked = [&](const Expr& j) { return causal ? binary(Op::Gt, j, i) : constant(0, Type::Bool); };
    const int64_t mx = p_.addScalar(Scalar::Accumulator, Type::F32), sum = p_.addScalar(Scalar::Accumulator, Type::F32);
    l.assign(mx, constant(-INFINITY, Type::F32));
    {
      Expr j = l.loop(cols);
      Expr v = select(masked(j), constant(-INFINITY, Type::F32), load(s, Type::F32, add(base, j)));
      l.assign(mx, binary(Op::Max, var(mx, Type::F32), v));
      l.close();
    }
    l.assign(sum, constant(0, Type::F32));
    {
      Expr j = l.loop(cols);
      Expr e = unary(Op::Exp, binary(Op::Sub, load(s, Type::F32, add(base, j)), var(mx, Type::F32)));
      int64_t ev = l.let(select(masked(j), constant(0, Type::F32), e));
      l.store(s, add(base, j), var(ev, Type::F32));
      l.assign(sum, add(var(sum, Type::F32), var(ev, Type::F32)));
      l.close();
    }
    {
      Expr j = l.loop(cols);
      l.store(s, add(base, j), binary(Op::Div, load(s, Type::F32, add(base, j)), var(sum, Type::F32)));
      l.close();
    }
    push(l, "softmax");
  }

 private:
  // A loop nest written statement by statement.
  class Loops {
   public:
    explicit Loops(Program& p) : p_(p) { stack_ = {&root_}; }
    Expr loop(int64_t extent) {
      int64_t v = p_.addScalar(Scalar::Loop, Type::I64);
      stack_.back()->push_back({Stmt::For, v, extent});
      stack_.push_back(&stack_.back()->back().body);
      return var(v, Type::I64);
    }
    void close() { stack_.pop_back(); }
    void store(int64_t buffer, Expr idx, Expr v) {
      Stmt s{Stmt::Store, buffer, 0, cast(std::move(v), valueTypeOf(p_.buffers[buffer].dtype))};
      s.index = std::move(idx);
      stack_.back()->push_back(std::move(s));
    }
    void assign(int64_t acc, Expr v) { stack_.back()->push_back({Stmt::Assign, acc, 0, std::move(v)}); }
    int64_t let(Expr v) {
      int64_t id = p_.addScalar(Scalar::Let, v->type);
      stack_.back()->push_back({Stmt::Let, id, 0, std::move(v)});
      return id;
    }
    std::vector<Stmt> take() { return std::move(root_); }

   private:
    Program& p_;
    std::vector<Stmt> root_;
    std::vector<std::vector<Stmt>*> stack_;
  };

  void push(Loops& l, const std::string& what) {
    p_.steps.push_back({Step::Loops, {fmt::format("k{}_{}", p_.steps.size(), what), l.take()}, {}});
  }

  Program& p_;
  std::vector<std::pair<int64_t, int64_t>> pending_;
  std::map<int64_t, int64_t> widened_;  // input buffer -> its f32 copy
};

// -1: not decided yet (the environment decides on first use).
std::atomic<int> materialized_attention{-1};

bool materializedAttentionForBenchmarks() {
  int on = materialized_attention.load();
  if (on < 0) {
    const char* v = std::getenv("MESHFUSE_SDPA_MATERIALIZED");
    on = v != nullptr && std::string(v) == "1" ? 1 : 0;
    materialized_attention.store(on);
  }
  return on == 1;
}

// An sdpa_grad with its lse and delta operands (one whose sequences are split: others are expanded
// into GEMMs by expand-attention-gradients), or the key's and the value's of one attention
// (segment.h) -> one attention-gradient step (wrt >= 0; both: wrt = key with dv_out).
void lowerAttentionGradient(const Segment& seg, const LocalShapeFn& shape_of, Program& p) {
  MF_CHECK(seg.exprs.size() <= 2, "an attention gradient segment of {} ops", seg.exprs.size());
  const meshfuse::Expr* e = seg.exprs[0];
  const meshfuse::Expr* value = nullptr;  // the value's gradient beside the key's
  if (seg.exprs.size() == 2) {
    value = seg.exprs[1];
    if (e->attr<std::string>("wrt") == "value") std::swap(e, value);
  }
  MF_CHECK(e->input("lse") != nullptr && e->input("delta") != nullptr,
           "{} reached lowering without its lse and delta operands: expand-attention-gradients rewrites it first",
           e->name());
  GemmLowering g(p);
  auto bufferOf = [&](const Val* v) {
    auto it = std::find(seg.inputs.begin(), seg.inputs.end(), v);
    MF_CHECK(it != seg.inputs.end(), "an attention gradient operand that is not a segment input");
    return static_cast<int64_t>(it - seg.inputs.begin());
  };
  auto tv = [&](size_t i) { return static_cast<const TensorView*>(e->input(i)); };
  const std::vector<int64_t> qs = shape_of(tv(0)), ks = shape_of(tv(1)), vs = shape_of(tv(2));
  Attention a;
  a.batch = qs[0] * qs[1], a.s = qs[2], a.d = qs[3], a.skv = ks[2], a.dv = vs[3];
  a.causal = e->attr<bool>("is_causal");
  a.scale = e->attr<double>("scale");
  if (a.scale == 0) a.scale = 1 / std::sqrt(static_cast<double>(a.d));
  const std::string& wrt = e->attr<std::string>("wrt");
  a.wrt = wrt == "query" ? 0 : wrt == "key" ? 1 : 2;
  auto outputOf = [&](const meshfuse::Expr* x) {
    auto it = std::find(seg.outputs.begin(), seg.outputs.end(), x->output());
    MF_CHECK(it != seg.outputs.end(), "{} of an attention gradient segment is not one of its outputs", x->name());
    return static_cast<int64_t>(seg.inputs.size() + (it - seg.outputs.begin()));
  };
  const int64_t out = outputOf(e);
  if (a.batch == 0) return;
  a.o = g.f32Result(out);
  if (a.o != out) a.o_rounded = out;
  if (value != nullptr) {
    const int64_t dv = outputOf(value);
    a.dv_out = g.f32Result(dv);
    if (a.dv_out != dv) a.dv_rounded = dv;
  }
  a.q = g.f32(bufferOf(tv(0))), a.k = g.f32(bufferOf(tv(1))), a.v = g.f32(bufferOf(tv(2)));
  a.g = g.f32(bufferOf(tv(3)));
  a.lse_in = bufferOf(e->input("lse")), a.delta = bufferOf(e->input("delta"));  // f32 (shape inference)
  p.steps.push_back({Step::AttentionCall, {}, {}, a});
  g.finish();
}

// An attention segment: an sdpa, an sdpa_lse, or one of each on the same query and key (segment.cpp)
// -> one Attention step computing the output and/or the log-sum-exp.
void lowerAttentionSegment(const Segment& seg, const LocalShapeFn& shape_of, Program& p) {
  GemmLowering g(p);
  auto bufferOf = [&](const Val* v) {
    auto it = std::find(seg.inputs.begin(), seg.inputs.end(), v);
    MF_CHECK(it != seg.inputs.end(), "an attention operand that is not a segment input");
    return static_cast<int64_t>(it - seg.inputs.begin());
  };
  auto outputOf = [&](const meshfuse::Expr* e) {
    auto it = std::find(seg.outputs.begin(), seg.outputs.end(), e->output());
    MF_CHECK(it != seg.outputs.end(), "{} of an attention segment is not one of its outputs", e->name());
    return static_cast<int64_t>(seg.inputs.size() + (it - seg.outputs.begin()));
  };
  if (seg.exprs[0]->kind() == OpKind::SdpaGrad) return lowerAttentionGradient(seg, shape_of, p);
  const meshfuse::Expr* sdpa = nullptr;
  const meshfuse::Expr* lse = nullptr;
  for (const meshfuse::Expr* e : seg.exprs) (e->kind() == OpKind::Sdpa ? sdpa : lse) = e;
  const meshfuse::Expr* e = sdpa ? sdpa : lse;
  MF_CHECK(e != nullptr && seg.exprs.size() == size_t{sdpa != nullptr} + size_t{lse != nullptr},
           "an attention segment of {} ops", seg.exprs.size());
  auto tv = [&](size_t i) { return static_cast<const TensorView*>(e->input(i)); };
  const std::vector<int64_t> qs = shape_of(tv(0)), ks = shape_of(tv(1));
  Attention a;
  a.batch = qs[0] * qs[1], a.s = qs[2], a.d = qs[3], a.skv = ks[2];
  a.dv = sdpa ? shape_of(tv(2))[3] : 0;
  a.causal = e->attr<bool>("is_causal");
  a.scale = e->attr<double>("scale");
  if (a.scale == 0) a.scale = 1 / std::sqrt(static_cast<double>(a.d));
  if (a.batch * a.s == 0) return;
  if (sdpa && a.dv > 0) {
    a.o = g.f32Result(outputOf(sdpa));
    if (a.o != outputOf(sdpa)) a.o_rounded = outputOf(sdpa);
  }
  if (lse) a.lse = outputOf(lse);  // f32 already
  if (a.skv == 0) {  // no key: output 0 (as the reference), log-sum-exp -inf
    if (a.o >= 0) g.fillRows(a.o, a.batch * a.s, a.dv, -1);
    if (a.lse >= 0) g.fillRows(a.lse, a.batch, a.s, -1, -INFINITY);
  } else {
    const DataType qt = tv(0)->dtype();
    if ((qt == DataType::BFloat16 || qt == DataType::Half) && tv(1)->dtype() == qt && (a.o < 0 || tv(2)->dtype() == qt))
      a.operands = qt;
    a.q = g.f32(bufferOf(tv(0))), a.k = g.f32(bufferOf(tv(1)));
    if (a.o >= 0) a.v = g.f32(bufferOf(tv(2)));
    if (a.o < 0) a.dv = 0;
    if (materializedAttentionForBenchmarks() && a.lse < 0 && a.o >= 0) {
      g.materializedAttention(a);
    } else if (a.o >= 0 || a.lse >= 0) {
      p.steps.push_back({Step::AttentionCall, {}, {}, a});
    }
  }
  g.finish();
}

}  // namespace

void setMaterializedAttentionForBenchmarks(bool on) { materialized_attention.store(on ? 1 : 0); }

void lowerGemmSegment(const Segment& seg, const LocalShapeFn& shape_of, Program& p) {
  if (seg.exprs.back()->info().category == OpCategory::Attention) return lowerAttentionSegment(seg, shape_of, p);
  MF_CHECK(seg.outputs.size() == 1, "a Gemm segment has one output");
  const int64_t out = static_cast<int64_t>(seg.inputs.size());  // the output buffer
  GemmLowering g(p);
  auto g_f32 = [&](int64_t buffer) { return g.f32(buffer); };
  const meshfuse::Expr* e = seg.exprs.back();  // after the transposes it reads in place
  auto tv = [&](size_t i) { return static_cast<const TensorView*>(e->input(i)); };
  auto bufferOf = [&](const Val* v) {
    auto it = std::find(seg.inputs.begin(), seg.inputs.end(), v);
    MF_CHECK(it != seg.inputs.end(), "a GEMM operand that is not a segment input");
    return static_cast<int64_t>(it - seg.inputs.begin());
  };
  // Operand i as a GEMM operand: its buffer, read transposed when the segment's permute swapped
  // its last two dims (the segmenter only lets such permutes in).
  auto operand = [&](size_t i, int64_t ld, bool trans, int64_t transposed_ld) {
    const meshfuse::Expr* d = tv(i)->definition();
    if (d == nullptr || std::find(seg.exprs.begin(), seg.exprs.end(), d) == seg.exprs.end())
      return Gemm::Operand{g_f32(bufferOf(tv(i))), 0, ld, trans};
    MF_CHECK(d->kind() == OpKind::Permute, "{} in a Gemm segment", d->name());
    return Gemm::Operand{g_f32(bufferOf(d->input(size_t{0}))), 0, transposed_ld, !trans};
  };
  switch (e->kind()) {
    case OpKind::Linear: {
      const std::vector<int64_t> xs = shape_of(tv(0)), ws = shape_of(tv(1));
      const int64_t k = xs.back(), n = ws[0];
      const int64_t m = numel(shape_of(e->output())) / std::max<int64_t>(n, 1);
      if (m * n == 0) return;
      const int64_t c = g.f32Result(out);
      const Val* bias = e->input("bias");
      if (bias != nullptr || k == 0) g.fillRows(c, m, n, bias ? g.f32(bufferOf(bias)) : -1);
      if (k > 0) {
        Gemm gm;
        gm.m = m, gm.n = n, gm.k = k;
        gm.a = operand(0, k, false, m);  // x [m, k], or stored as [k, m]
        gm.b = operand(1, k, true, n);   // w [n, k] read transposed, or stored as [k, n]
        gm.c = {c, 0, n, false};
        gm.beta = bias != nullptr ? 1 : 0;
        g.gemm(gm);
      }
      break;
    }
    case OpKind::Matmul: {
      const std::vector<int64_t> as = shape_of(tv(0)), bs = shape_of(tv(1));
      const int64_t r = static_cast<int64_t>(as.size());
      const int64_t m = as[r - 2], k = as[r - 1], n = bs.back();
      const int64_t batches = numel({as.begin(), as.end() - 2});  // (not numel / (m * k): k may be 0)
      if (m * n * batches == 0) return;
      const int64_t c = g.f32Result(out);
      if (k == 0) {
        g.fillRows(c, batches * m, n, -1);
        break;
      }
      Gemm gm;
      gm.k = k, gm.n = n;
      gm.a = operand(0, k, false, m);  // a [.., m, k], or stored as [.., k, m]
      gm.b = operand(1, n, false, k);  // b [.., k, n], or stored as [.., n, k]
      gm.c = {c, 0, n, false};
      if (bs.size() == 2 && !gm.a.trans) {
        gm.m = batches * m;  // the shared right operand: all batch rows in one GEMM
      } else {
        gm.m = m;
        gm.batch = {{batches, m * k, bs.size() == 2 ? 0 : k * n, m * n}};
      }
      g.gemm(gm);
      break;
    }
    default: MF_CHECK(false, "{} in a Gemm segment", e->name());
  }
  g.finish();
}

}  // namespace meshfuse::kir
