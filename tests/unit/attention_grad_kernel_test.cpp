// The tiled attention-gradient kernel (an Attention step with wrt >= 0:
// src/runtime/cpu/attention_grad_kernel.cpp) and the reference backend's step, on blocks of rows
// at global positions: what ring attention's backward and gathered context parallelism run. The
// steps of a split sequence, added up, must give the whole sequence's gradient as the reference
// executor computes it (f64), for sizes across the 64 x 128 tiles, causal or not, f32 and bf16,
// the key's and the value's gradient as one kernel.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>

#include "codegen/kernel_ir.h"
#include "codegen/kernel_lower.h"
#include "driver/backends.h"
#include "lower/segment.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ops.h"
#include "meshfuse/reference.h"
#include "runtime/backend.h"

namespace meshfuse {
namespace {

struct Case {
  int64_t heads, s, d, dv;
  bool causal;
  DataType dtype;
};

std::string name(const Case& c) {
  return fmt::format("h{} s{} d{} dv{} {}{}", c.heads, c.s, c.d, c.dv, dtypeName(c.dtype), c.causal ? " causal" : "");
}

// The whole attention and its gradients, on one device: the oracle, and the operands of the steps
// (lse and delta from the forward, as autodiff writes them).
struct Problem {
  Fusion f;
  TensorView *q, *k, *v, *g, *lse, *delta, *dq, *dk, *dv;
  std::vector<Tensor> inputs;  // q, k, v, g
  std::vector<Tensor> values;  // lse, delta, dq, dk, dv (reference)

  explicit Problem(const Case& c) {
    q = f.defineTensor({1, c.heads, c.s, c.d}, c.dtype, "q");
    k = f.defineTensor({1, c.heads, c.s, c.d}, c.dtype, "k");
    v = f.defineTensor({1, c.heads, c.s, c.dv}, c.dtype, "v");
    g = f.defineTensor({1, c.heads, c.s, c.dv}, c.dtype, "g");
    TensorView* o = ops::sdpa(q, k, v, c.causal);
    lse = ops::sdpaLse(q, k, c.causal);
    delta = ops::sum(ops::mul(ops::cast(o, DataType::Float), ops::cast(g, DataType::Float)), {3});
    dq = ops::sdpaGrad(q, k, v, g, "query", c.causal, std::nullopt, lse, delta);
    dk = ops::sdpaGrad(q, k, v, g, "key", c.causal, std::nullopt, lse, delta);
    dv = ops::sdpaGrad(q, k, v, g, "value", c.causal, std::nullopt, lse, delta);
    for (TensorView* t : {lse, delta, dq, dk, dv}) f.addOutput(t);
    for (TensorView* t : {q, k, v, g})
      inputs.push_back(Tensor::random(c.dtype, t->evaluateShape({}), 31 + inputs.size()));
    values = evaluateReference(f, inputs);
  }
};

// Rows [start, start + count) of a [1, h, s, e] (or [1, h, s]) tensor, contiguous.
Tensor rows(const Tensor& t, int64_t start, int64_t count) {
  std::vector<int64_t> shape = t.shape();
  const int64_t s = shape[2], inner = shape.size() > 3 ? shape[3] : 1;
  shape[2] = count;
  Tensor out = Tensor::empty(t.dtype(), shape);
  for (int64_t h = 0; h < shape[1]; ++h)
    for (int64_t r = 0; r < count; ++r)
      for (int64_t e = 0; e < inner; ++e) out.set((h * count + r) * inner + e, t.get((h * s + start + r) * inner + e));
  return out;
}

// Runs the segment of `exprs` (the gradients of `p`: dq, or dk and dv) on `backend` once per block
// of the other side's rows, as ring attention's steps do: dq against blocks of the keys (k, v),
// dk and dv against blocks of the queries (q, the output's gradient, lse and delta), each step
// after the first adding into what the outputs hold.
std::vector<Tensor> runByBlocks(Backend& backend, const Problem& p, const std::vector<const Expr*>& exprs,
                                int64_t blocks) {
  Segment seg{Segment::Kind::Gemm, exprs, {p.q, p.k, p.v, p.g, p.lse, p.delta}, {}};
  std::vector<Tensor> out;
  for (const Expr* e : exprs) {
    seg.outputs.push_back(e->output());
    out.push_back(Tensor::empty(e->output()->dtype(), e->output()->evaluateShape({})));
  }
  const bool keys_split = exprs[0]->attr<std::string>("wrt") == "query";
  const int64_t block = p.inputs[0].shape()[2] / blocks;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t start = b * block;
    std::vector<Tensor> in = {p.inputs[0], p.inputs[1], p.inputs[2], p.inputs[3], p.values[0], p.values[1]};
    for (size_t i : keys_split ? std::vector<size_t>{1, 2} : std::vector<size_t>{0, 3, 4, 5})
      in[i] = rows(in[i], start, block);
    std::vector<const Tensor*> ins;
    std::vector<Tensor*> outs;
    for (const Tensor& t : in) ins.push_back(&t);
    for (Tensor& t : out) outs.push_back(&t);
    ShapeFn shape_of = [&](const TensorView* tv) -> std::vector<int64_t> {
      for (size_t i = 0; i < seg.inputs.size(); ++i)
        if (seg.inputs[i] == tv) return in[i].shape();
      for (size_t i = 0; i < seg.outputs.size(); ++i)
        if (seg.outputs[i] == tv) return out[i].shape();
      return {};
    };
    AttentionLaunch launch;
    (keys_split ? launch.key : launch.query).push_back({start, block});
    launch.accumulate = b > 0;
    backend.runAttentionStep(seg, ins, outs, shape_of, launch);
  }
  return out;
}

class AttentionGradientSteps : public ::testing::TestWithParam<std::tuple<DataType, bool>> {};

TEST_P(AttentionGradientSteps, BlocksAddUpToTheWholeGradient) {
  const auto [dt, causal] = GetParam();
  for (Case c : {Case{1, 8, 4, 4}, Case{2, 64, 8, 6}, Case{1, 256, 16, 16}, Case{2, 300, 8, 12}}) {
    c.causal = causal, c.dtype = dt;
    SCOPED_TRACE(name(c));
    Problem p(c);
    const Expr *dq = p.dq->definition(), *dk = p.dk->definition(), *dv = p.dv->definition();
    for (int64_t blocks : {int64_t{1}, int64_t{2}, int64_t{4}}) {
      SCOPED_TRACE(fmt::format("{} blocks", blocks));
      for (const char* backend : {"cpu", "reference"}) {
        SCOPED_TRACE(backend);
        std::unique_ptr<Backend> b = std::string(backend) == "cpu" ? makeCpuBackend() : makeReferenceBackend();
        // dq alone (accumulating over the blocks), dk and dv together (one kernel).
        std::vector<Tensor> got = runByBlocks(*b, p, {dq}, blocks);
        std::vector<Tensor> kv = runByBlocks(*b, p, {dk, dv}, blocks);
        got.insert(got.end(), kv.begin(), kv.end());
        for (size_t i = 0; i < 3; ++i) {
          ReferenceComparison r = compareWithReference(got[i], p.values[2 + i]);
          // A bf16 gradient is rounded after each block it accumulates (its running value is bf16).
          const double slack = dt == DataType::BFloat16 ? 2 * blocks : 1;
          EXPECT_LE(r.max_abs_err, r.allowed_abs * slack) << "d"
                                                          << "qkv"[i];
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(DtypesAndMasks, AttentionGradientSteps,
                         ::testing::Combine(::testing::Values(DataType::Float, DataType::BFloat16), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(dtypeName(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_causal" : "_full");
                         });

// The lowering: one sdpa_grad, or the key's and the value's as one step; printed as such.
TEST(AttentionGradientSteps, LowerToOneStep) {
  Problem p(Case{1, 8, 4, 4, true, DataType::Float});
  Segment seg{Segment::Kind::Gemm,
              {p.dk->definition(), p.dv->definition()},
              {p.q, p.k, p.v, p.g, p.lse, p.delta},
              {p.dk, p.dv}};
  kir::Program prog = kir::lowerSegment(
      p.f, seg, [](const TensorView* tv) { return tv->evaluateShape({}); }, "gemm #0");
  ASSERT_EQ(prog.steps.size(), 1u);
  EXPECT_EQ(prog.steps[0].attention.wrt, 1);
  EXPECT_GE(prog.steps[0].attention.dv_out, 0);
  EXPECT_NE(kir::printProgram(prog).find("attention_grad wrt=key,value batch=1 s=8 skv=8 d=4 dv=4"), std::string::npos)
      << kir::printProgram(prog);
}

}  // namespace
}  // namespace meshfuse
