// The model blocks of models.h.
#include "models.h"

#include "meshfuse/ops.h"

namespace meshfuse::models {

namespace {
TensorView* mlp(TensorView* x, TensorView* up_w, TensorView* down_w) {
  return ops::linear(ops::gelu(ops::linear(x, up_w), "tanh"), down_w);
}
}  // namespace

void buildMlp(Fusion& f, int64_t h, bool residual) {
  TensorView* inp = f.defineTensor({-1, h}, DataType::Float, "inp");
  TensorView* up_w = f.defineTensor({4 * h, h}, DataType::Float, "up_w");
  TensorView* down_w = f.defineTensor({h, 4 * h}, DataType::Float, "down_w");
  TensorView* out = mlp(inp, up_w, down_w);
  f.addOutput(residual ? ops::add(out, inp) : out);
}

void buildDecoderLayer(Fusion& f, const DecoderShape& s) {
  const int64_t h = s.hidden, hd = s.hidden / s.heads;
  auto param = [&](std::vector<Extent> shape, const char* name) { return f.defineTensor(shape, s.dtype, name); };
  const bool leading_one = s.layout == BatchLayout::LeadingOne;
  TensorView* x = leading_one ? param({s.seq, h}, "x") : param({s.batch, s.seq, h}, "x");
  TensorView* ln1_w = param({h}, "ln1_w");
  TensorView* ln1_b = param({h}, "ln1_b");
  TensorView* wq = param({h, h}, "wq");
  TensorView* wk = param({h, h}, "wk");
  TensorView* wv = param({h, h}, "wv");
  TensorView* wo = param({h, h}, "wo");
  TensorView* ln2_w = param({h}, "ln2_w");
  TensorView* ln2_b = param({h}, "ln2_b");
  TensorView* up_w = param({4 * h, h}, "up_w");
  TensorView* down_w = param({h, 4 * h}, "down_w");

  // [b, s, h] -> [b, heads, s, hd] and back; [s, h] -> [1, heads, s, hd] and back.
  auto toHeads = [&](TensorView* t) {
    if (leading_one)
      return ops::reshape(ops::permute(ops::reshape(t, {s.seq, s.heads, hd}), {1, 0, 2}), {1, s.heads, s.seq, hd});
    return ops::permute(ops::reshape(t, {s.batch, s.seq, s.heads, hd}), {0, 2, 1, 3});
  };
  auto fromHeads = [&](TensorView* t) {
    if (leading_one) return ops::reshape(ops::permute(ops::reshape(t, {s.heads, s.seq, hd}), {1, 0, 2}), {s.seq, h});
    return ops::reshape(ops::permute(t, {0, 2, 1, 3}), {s.batch, s.seq, h});
  };
  TensorView* n1 = ops::layerNorm(x, ln1_w, ln1_b);
  TensorView* attn = ops::sdpa(toHeads(ops::linear(n1, wq)), toHeads(ops::linear(n1, wk)),
                               toHeads(ops::linear(n1, wv)), /*is_causal=*/true);
  TensorView* merged = fromHeads(attn);
  TensorView* x2 = ops::add(x, ops::linear(merged, wo));
  TensorView* out = ops::add(x2, mlp(ops::layerNorm(x2, ln2_w, ln2_b), up_w, down_w));
  f.addOutput(out);
}

}  // namespace meshfuse::models
