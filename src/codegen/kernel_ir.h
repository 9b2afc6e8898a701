// Kernel IR: what one segment computes, as target-neutral loop nests and library GEMM calls
// (DESIGN.md "Data flow": segment -> kernels). Emitters turn it into code: LLVM IR for CPUs
// (src/runtime/cpu), CUDA C later. Nothing here knows a target: no vector widths, threads or
// intrinsics; a loop is a plain counted loop whose iterations an emitter may vectorize.
//
// A Program is specialized for the LOCAL shapes of one launch (a rank's shard, a stream chunk):
//
//   program kernel #3 {
//     buffer b0 in   %x : f32[128, 64]
//     buffer b1 in   %b : f32[64]
//     buffer b2 out  %y : bf16[128, 64]
//     loops k0 {
//       for i0 in [0, 128) {
//         for i1 in [0, 64) {
//           store b2[(i0 * 64) + i1] = tanh(add(b0[(i0 * 64) + i1], b1[i1]))     (bN[...]: a load)
//   ...
//
// Values are scalars of four types; loads convert the buffer's storage dtype (bf16/f16 -> f32,
// i64, bool) to the value type and stores convert back (round-to-nearest-even). Expressions
// are immutable trees shared by pointer; statements form the loop nest.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "meshfuse/ir/dtype.h"

namespace meshfuse {

class Fusion;
class TensorView;
struct Segment;

namespace kir {

// Value types. F32 holds f32/bf16/f16 data, F64 the arithmetic of i64 results (the reference
// computes in double and truncates), I64 indices and i64 data, Bool comparisons.
enum class Type { Bool, I64, F32, F64 };
const char* typeName(Type t);
// The value type a buffer of `dt` loads as.
Type valueTypeOf(DataType dt);

// clang-format off
#define MESHFUSE_KIR_OPS(X)                                                                   \
  /* leaves */                                                                                \
  X(Const, "const") X(Var, "var") X(Load, "load")                                             \
  /* unary, on the operand's type */                                                          \
  X(Neg, "neg") X(Abs, "abs") X(Exp, "exp") X(Log, "log") X(Sqrt, "sqrt") X(Rsqrt, "rsqrt")   \
  X(Recip, "recip") X(Tanh, "tanh") X(Erf, "erf") X(Trunc, "trunc")                           \
  /* round an F32 to the precision of a 16-bit storage dtype (bf16/f16), staying F32 */        \
  X(Round, "round")                                                                           \
  /* convert to `type` (to Bool: != 0) */                                                     \
  X(Cast, "cast")                                                                             \
  /* binary, operands of one type; Max/Min are (a < b ? b : a) / (b < a ? b : a) */            \
  X(Add, "add") X(Sub, "sub") X(Mul, "mul") X(Div, "div") X(Rem, "rem") X(Pow, "pow")         \
  X(Max, "max") X(Min, "min")                                                                 \
  /* comparisons: Bool */                                                                     \
  X(Eq, "eq") X(Ne, "ne") X(Lt, "lt") X(Le, "le") X(Gt, "gt") X(Ge, "ge")                     \
  /* select(cond, a, b) */                                                                    \
  X(Select, "select")
// clang-format on

enum class Op {
#define MESHFUSE_X(e, s) e,
  MESHFUSE_KIR_OPS(MESHFUSE_X)
#undef MESHFUSE_X
};
const char* opName(Op op);

struct Node;
using Expr = std::shared_ptr<const Node>;

struct Node {
  Op op;
  Type type;
  double value = 0;                     // Const
  int64_t id = -1;                      // Var: scalar id; Load: buffer id
  DataType round_to = DataType::Float;  // Round
  std::vector<Expr> args{};             // operands; Load: {index}
};

// ---- expression constructors (fold constants and trivial identities) -----------------------
Expr constant(double v, Type t);
Expr index(int64_t v);  // an I64 constant
Expr var(int64_t scalar, Type t);
Expr load(int64_t buffer, Type t, Expr flat_index);
Expr unary(Op op, Expr x);
Expr round(Expr x, DataType to);
Expr cast(Expr x, Type to);
Expr binary(Op op, Expr a, Expr b);  // comparisons give Bool, others the operands' type
Expr select(Expr cond, Expr a, Expr b);
inline Expr add(Expr a, Expr b) { return binary(Op::Add, std::move(a), std::move(b)); }
inline Expr mul(Expr a, Expr b) { return binary(Op::Mul, std::move(a), std::move(b)); }
bool isConst(const Expr& e, double v);
// The same tree (op, type, value, id, rounding and arguments, recursively), not just the same node.
bool sameExpr(const Expr& a, const Expr& b);

// ---- statements ---------------------------------------------------------------------------
struct Stmt {
  enum Kind {
    For,     // for scalar `id` in [0, extent) { body }
    Let,     // scalar `id` = value (immutable, visible in the rest of the enclosing body)
    Assign,  // accumulator `id` = value (the first Assign initializes it)
    Store,   // buffer `id`[index] = value
  } kind;
  int64_t id = -1;
  int64_t extent = 0;
  Expr value{}, index{};
  std::vector<Stmt> body{};
};

struct Scalar {
  enum Kind { Loop, Let, Accumulator } kind;
  Type type;
};

struct Buffer {
  enum Role { Input, Output, Temp } role;
  DataType dtype;
  std::vector<int64_t> shape{};
  std::string name{};  // the TensorView's display name ("" for a temporary)
  // An output written into an input's buffer (Fusion::aliasOutputToInput), and that input: the
  // emitters do not promise the compiler restrict/noalias for these two.
  bool may_alias = false;
  int64_t numel() const;
};

// A loop nest: one generated kernel (a function of the program's buffers).
struct LoopNest {
  std::string name{};
  std::vector<Stmt> body{};
};

// C[batch] = alpha * op(A[batch]) op(B[batch]) + beta * C[batch] on F32 buffers, row-major:
// element (r, c) of a matrix operand is at offset + r * ld + c (transposed: c * ld + r), and
// batch entry (j0, j1, ...) adds sum_d j_d * stride_d of that operand.
struct Gemm {
  struct Operand {
    int64_t buffer = -1;
    int64_t offset = 0;
    int64_t ld = 0;
    bool trans = false;
  };
  struct BatchDim {
    int64_t extent = 1;
    int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  };
  int64_t m = 0, n = 0, k = 0;
  Operand a, b, c;
  std::vector<BatchDim> batch{};
  double alpha = 1, beta = 0;
};

// Attention of `batch` independent (batch * head) entries, computed tile by tile with an online
// softmax, so no [s, skv] score matrix is ever stored (docs/kernels.md "Tiled attention"). F32
// buffers, row-major: q [batch, s, d], k [batch, skv, d], v [batch, skv, dv]; results o
// [batch, s, dv] = softmax(scale q k^T (+ mask)) v and lse [batch, s] = log of the row's sum of
// exp(scale q k^T) over the keys it attends (natural log, in scaled-score units), each optional
// (-1: not computed). `causal` masks key j > query i, as the reference executor does. Emitters
// choose the tiles: a target's kernel, not loops of this IR.
struct Attention {
  int64_t q = -1, k = -1, v = -1, o = -1, lse = -1;
  // The 16-bit output that o (an f32 temporary then) is rounded into, or -1: where a launch that
  // continues an earlier online softmax (AttentionLaunch::accumulate) reads the running output.
  int64_t o_rounded = -1;
  int64_t batch = 0, s = 0, skv = 0, d = 0, dv = 0;
  double scale = 1;
  bool causal = false;
  // The dtype q, k and v had before lowering widened them to f32: BFloat16 or Half when all three
  // share it (their f32 copies are then exact in that dtype, so a backend may multiply them on
  // 16-bit tensor cores without rounding them: cuda_attention_mma.cpp), else Float.
  DataType operands = DataType::Float;
  // An attention gradient (an sdpa_grad with its lse and delta operands) instead, when wrt >= 0:
  // the gradient with respect to operand `wrt` (0 query, 1 key, 2 value) into o (o_rounded as
  // above), from the output gradient g [batch, s, dv] and the forward's f32 log-sum-exp lse_in and
  // delta = rowsum(g o_forward) [batch, s]: P = exp(scale q k^T - lse_in), dV = P^T g, dS = P (g v^T
  // - delta) scale, dQ = dS k, dK = dS^T q (docs/training.md "Attention's gradient").
  int64_t wrt = -1, g = -1, lse_in = -1, delta = -1;
  // With wrt = 1 (the key's), the value's gradient too, from the same P (one segment computes
  // both: segment.h), into dv_out (dv_rounded as o_rounded), or -1.
  int64_t dv_out = -1, dv_rounded = -1;
};

struct Step {
  enum Kind { Loops, GemmCall, AttentionCall } kind;
  LoopNest loops{};
  Gemm gemm{};
  Attention attention{};
};

// What one segment launch runs: steps in order over the buffers (inputs aligned with
// Segment::inputs, outputs with Segment::outputs, then temporaries the runtime provides).
struct Program {
  std::string name;  // "kernel #3" / "gemm #2"
  std::vector<Buffer> buffers;
  std::vector<Scalar> scalars;
  std::vector<Step> steps;

  int64_t addBuffer(Buffer b);
  int64_t addScalar(Scalar::Kind k, Type t);
};

std::string printProgram(const Program& p);

// Lowers a Kernel or Gemm segment of `fusion` to a Program for the local shapes `shape_of`
// gives (every TensorView the segment touches). Deterministic: equal segments and shapes give
// equal programs.
using LocalShapeFn = std::function<std::vector<int64_t>(const TensorView*)>;
Program lowerSegment(const Fusion& fusion, const Segment& segment, const LocalShapeFn& shape_of,
                     const std::string& name);

}  // namespace kir

// The CPU emitter's LLVM IR for a program (after optimization), for `meshfuse dump --stage=llvm`.
// Implemented by the CPU backend (src/codegen/llvm/llvm_emitter.cpp).
std::string cpuLlvmIr(const kir::Program& program);

// The CUDA emitter's source for a program, for `meshfuse dump --stage=cuda`: each kernel headed by
// its launch geometry on a GPU of `sm_count` SMs (132: an H100), kernel names prefixed by
// `prefix`; with `with_prelude` the prelude and helpers every program's source starts with too.
// Implemented by the CUDA backend (src/codegen/cuda/cuda_emitter.cpp); a build without it throws
// RuntimeError "no CUDA device: meshfuse was built without CUDA ...".
std::string cudaSource(const kir::Program& program, const std::string& prefix, int sm_count, bool with_prelude);

}  // namespace meshfuse
