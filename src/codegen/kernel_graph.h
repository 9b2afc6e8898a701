// The element graph of a kernel segment: its ops rewritten into four primitive kinds that
// loop-nest lowering (kernel_lower.cpp) knows how to schedule.
//
//   Input   a segment input, read from its buffer
//   Map     y[i] = f(x0[i'], x1[i'], ...): an elementwise formula on kir expressions, operands
//           broadcast along their size-1 dims (pointwise ops, casts, copies)
//   Index   y[i] = x[g(i)]: a pure index map (broadcast_in_dim, reshape, permute, slice, and
//           the broadcasts of reduction results back over the reduced dims)
//   Reduce  y[j] = x[i] combined over `dims` (sum or max, accumulated in f32; f64 for ints)
//   Cat     y = concatenation of operands along `dim`
//   Gather  y[(g,) i..., h] = table[(g,) indices[(g,) i...], h], 0 for a row outside the table
//           (embedding)
//   Scatter y[(g,) v, h] = sum of x[(g,) i..., h] over indices[(g,) i...] == v, in f32
//           (embedding_backward: a stage written row by row at data-dependent rows)
//
// Composite ops decompose here: mean = sum then a divide; softmax = max, exp, sum, divide
// (log_softmax: x - max - log(sum)); cross_entropy = max, sum of exp, the target's logit (a sum
// of x where the class index is the target), then the reduction; one_hot = a Map of the class
// index;
// layer_norm / rms_norm = mean and variance reductions plus an elementwise normalization. Each
// fusion op's result is rounded to its dtype (bf16/f16 precision, i64 truncation) exactly where
// the reference executor rounds, so kernels compute what the reference computes, in f32.
//
// Shapes are LOCAL (the launch's shapes); attributes that hold global sizes (reshape,
// broadcast_in_dim, slice) are reinterpreted against the local shapes.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "codegen/kernel_ir.h"

namespace meshfuse {
class Expr;
}

namespace meshfuse::kir {

struct ENode {
  enum Kind { Input, Map, Index, Reduce, Cat, Gather, Scatter } kind;
  std::vector<int64_t> shape{};
  Type type = Type::F32;             // value type (F32 for floating dtypes, F64 for i64, Bool)
  DataType dtype = DataType::Float;  // the dtype a buffer holding it has
  std::vector<ENode*> operands{};
  const TensorView* tv = nullptr;  // the fusion value it is (nullptr: internal to a decomposition)
  int64_t buffer = -1;             // Input: its buffer
  // Map: the formula on operand values (already converted to each operand's value type).
  std::function<Expr(const std::vector<Expr>&)> formula{};
  // Map: instead, a formula that also reads the element's index (one_hot: the class index).
  std::function<Expr(const std::vector<Expr>&, const std::vector<Expr>&)> indexed_formula{};
  // Index: operand index from this node's index.
  std::function<std::vector<Expr>(const std::vector<Expr>&)> index_map{};
  // Reduce: reduced dims of operand 0 (sorted); max (else sum). Cat: `dim`.
  std::vector<int64_t> dims{};
  bool is_max = false;
  int64_t dim = 0;
  // Gather (operands: table, indices) and Scatter (operands: values, indices): rows of the
  // table, and whether dim 0 is a group dim shared by table, indices and result.
  int64_t rows = 0;
  bool grouped = false;
  int64_t uses = 0;  // consumers within the graph
};

struct ElementGraph {
  std::vector<std::unique_ptr<ENode>> nodes;  // topological order
  std::vector<ENode*> outputs;                // aligned with Segment::outputs
};

// Builds the graph of a Kernel segment. Buffers 0..n-1 of `program` must be the segment's n
// inputs (Input nodes read them).
ElementGraph buildElementGraph(const Segment& seg, const LocalShapeFn& shape_of, const Program& program);

// Row-major flat index of `idx` in `shape`.
Expr linearize(const std::vector<Expr>& idx, const std::vector<int64_t>& shape);
// The value type arithmetic on `dt` uses.
Type computeType(DataType dt);

}  // namespace meshfuse::kir
