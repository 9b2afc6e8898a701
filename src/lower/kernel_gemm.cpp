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
//   sdpa(q, k, v):  S = scale * Q K^T (one GEMM per batch*head)  ->  loops: masked softmax of
//                   every row of S, in place  ->  O = S V
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "lower/kernel_graph.h"
#include "lower/kernel_lower.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/segment.h"

namespace meshfuse::kir {
namespace {

class GemmLowering {
 public:
  explicit GemmLowering(Program& p) : p_(p) {}

  // An f32 view of `buffer`: itself, or a widened copy.
  int64_t f32(int64_t buffer) {
    const Buffer b = p_.buffers[buffer];
    if (b.dtype == DataType::Float) return buffer;
    int64_t t = p_.addBuffer({Buffer::Temp, DataType::Float, b.shape, ""});
    copy(buffer, t, b.numel());
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

  // c[i, j] = bias[j] for a [rows, cols] c (or 0 without a bias).
  void fillRows(int64_t c, int64_t rows, int64_t cols, int64_t bias) {
    Loops l(p_);
    Expr i = l.loop(rows), j = l.loop(cols);
    l.store(c, add(mul(i, index(cols)), j), bias < 0 ? constant(0, Type::F32) : load(bias, Type::F32, j));
    push(l, "fill");
  }

  void gemm(Gemm g) {
    Step s{Step::GemmCall, {}, std::move(g)};
    p_.steps.push_back(std::move(s));
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
};

}  // namespace

void lowerGemmSegment(const Segment& seg, const LocalShapeFn& shape_of, Program& p) {
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
      const int64_t batches = numel(as) / std::max<int64_t>(m * k, 1);
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
    case OpKind::Sdpa: {
      const std::vector<int64_t> qs = shape_of(tv(0)), ks = shape_of(tv(1)), vs = shape_of(tv(2));
      const int64_t bh = qs[0] * qs[1], s = qs[2], d = qs[3], skv = ks[2], dv = vs[3];
      if (bh * s * dv == 0) return;
      double scale = e->attr<double>("scale");
      if (scale == 0) scale = 1 / std::sqrt(static_cast<double>(d));
      const int64_t o = g.f32Result(out);
      if (skv == 0) {
        g.fillRows(o, bh * s, dv, -1);
        break;
      }
      const int64_t sc = p.addBuffer({Buffer::Temp, DataType::Float, {bh, s, skv}, ""});
      if (d == 0) {
        g.fillRows(sc, bh * s, skv, -1);
      } else {
        Gemm qk;
        qk.m = s, qk.n = skv, qk.k = d, qk.alpha = scale;
        qk.a = {g.f32(bufferOf(tv(0))), 0, d, false};
        qk.b = {g.f32(bufferOf(tv(1))), 0, d, true};
        qk.c = {sc, 0, skv, false};
        qk.batch = {{bh, s * d, skv * d, s * skv}};
        g.gemm(qk);
      }
      g.maskedSoftmax(sc, bh, s, skv, e->attr<bool>("is_causal"));
      Gemm pv;
      pv.m = s, pv.n = dv, pv.k = skv;
      pv.a = {sc, 0, skv, false};
      pv.b = {g.f32(bufferOf(tv(2))), 0, dv, false};
      pv.c = {o, 0, dv, false};
      pv.batch = {{bh, s * skv, skv * dv, s * dv}};
      g.gemm(pv);
      break;
    }
    default: MF_CHECK(false, "{} in a Gemm segment", e->name());
  }
  g.finish();
}

}  // namespace meshfuse::kir
