// How a Gemm segment maps onto one cuBLASLt matmul: pure host logic, unit-tested without a GPU.
//
// cuBLASLt is column-major and meshfuse row-major. A row-major Y[M, N] read as column-major is
// Y^T [N x M], so each product is computed transposed:
//   linear  Y = X W^T (+ bias):  Y^T = W X^T  ->  A = W (stored K x N, op T), B = X (K x M, op N)
//   matmul  Y = A B           :  Y^T = B^T A^T ->  A = B (stored N x K, op N), B = A (K x M, op N)
// so cuBLASLt's m is the output features N, n the rows M, and a bias of length N is cuBLASLt's
// per-row bias. A matmul with a rank-2 right operand folds the batch into M; batched operands of
// equal rank become a strided batch.
//
// Epilogues: the ops that may follow the GEMM in the segment and cuBLASLt applies in its
// epilogue: add of a length-N bias (or linear's own bias), then gelu(approximate="tanh") or
// relu. Anything else is an UnsupportedError naming the op: the segmenter must leave it to a
// kernel.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshfuse/ir/dtype.h"
#include "codegen/kernel_ir.h"
#include "lower/segment.h"

namespace meshfuse::cuda {

enum class GemmEpilogue { None, Bias, Gelu, GeluBias, Relu, ReluBias };
const char* gemmEpilogueName(GemmEpilogue e);

struct GemmPlan {
  DataType dtype = DataType::Float;      // of A, B, D and the bias
  int64_t m = 0, n = 0, k = 0;           // column-major D[m x n] = op(A)[m x k] op(B)[k x n]
  bool trans_a = false, trans_b = false;
  int64_t lda = 0, ldb = 0, ldd = 0;
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_d = 0;  // elements between batches
  int a_input = -1, b_input = -1;        // the segment inputs that are cuBLASLt's A and B
  int bias_input = -1;                   // segment input of the bias, -1 without one
  GemmEpilogue epilogue = GemmEpilogue::None;
  double alpha = 1, beta = 0;            // D = alpha * product + beta * D (D holds C)
  std::string describe() const;          // for error messages and the cache key
};

// `input_shapes` align with seg.inputs (the local shapes of this launch); the segment's single
// output must be the last expr's.
GemmPlan planGemm(const Segment& seg, const std::vector<std::vector<int64_t>>& input_shapes);

// A kernel IR GEMM call (f32 buffers, row-major, any batch dims) as cuBLASLt calls: one per
// entry of the batch dims before the last, which is cuBLASLt's strided batch. Offsets are in
// elements from the operands' buffers; a_input/b_input name kir::Gemm's b and a operands (the
// product is computed transposed, as above).
struct KirGemmCall {
  GemmPlan plan;
  int64_t a_offset = 0, b_offset = 0, d_offset = 0;
};
std::vector<KirGemmCall> planKirGemm(const kir::Gemm& g);

}  // namespace meshfuse::cuda
