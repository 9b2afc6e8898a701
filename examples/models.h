// Model blocks written once, for one device, through the C++ API: the programs the examples,
// the multi-rank tests and the benchmarks all run.
#pragma once

#include <cstdint>

#include "meshfuse/ir/fusion.h"

namespace meshfuse::models {

// GPT-style MLP: out = linear(gelu(linear(inp, up_w), tanh), down_w) [+ inp with `residual`].
// Inputs, in order: inp [?t, h], up_w [4h, h], down_w [h, 4h].
void buildMlp(Fusion& f, int64_t hidden, bool residual = false);

// How a decoder layer's activations carry the batch, and so how its heads are made:
//   Batched:    x [b, s, h]; heads: reshape [b, s, nh, hd] -> permute -> [b, nh, s, hd].
//   LeadingOne: x [s, h] (Megatron's and Thunder's layer, `batch` unused); heads: reshape
//               [s, nh, hd] -> permute [nh, s, hd] -> reshape [1, nh, s, hd] for sdpa, and
//               back through reshape [nh, s, hd] -> permute -> reshape [s, h].
enum class BatchLayout { Batched, LeadingOne };

struct DecoderShape {
  int64_t batch = 2, seq = 8, hidden = 32, heads = 4;
  BatchLayout layout = BatchLayout::Batched;
  DataType dtype = DataType::Float;  // of every input (and so of the layer's arithmetic's storage)
};
// A pre-norm decoder layer: x + attn(ln1(x)), then x2 + mlp(ln2(x2)), causal attention.
// Inputs, in order: x [b, s, h] (LeadingOne: [s, h]), ln1_w [h], ln1_b [h], wq [h, h],
// wk [h, h], wv [h, h], wo [h, h], ln2_w [h], ln2_b [h], up_w [4h, h], down_w [h, 4h].
void buildDecoderLayer(Fusion& f, const DecoderShape& shape);

}  // namespace meshfuse::models
