// Segments: the units the host program launches (DESIGN.md "Data flow": segment).
//
// A decomposed fusion is cut into segments, each run by one runtime call:
//   Kernel         a chain of pointwise / broadcast / reduction / normalization ops, fused into
//                  one generated kernel (LLVM-JIT on CPUs, NVRTC on GPUs)
//   Gemm           a linear or matmul as a library GEMM (BLAS / cuBLASLt), possibly with
//                  fused epilogue ops (bias, activation) listed after it in `exprs`
//   Communication  one `set` that is a collective (or a local slice) on some mesh axis
//
// Each segment reads `inputs` (fusion inputs or other segments' outputs) and writes `outputs`
// (the values read by later segments or returned); values internal to a segment never reach
// host memory management.
#pragma once

#include <string>
#include <vector>

namespace meshfuse {

class Expr;
class Fusion;
class TensorView;

struct Segment {
  enum class Kind { Kernel, Gemm, Communication } kind = Kind::Kernel;
  std::vector<const Expr*> exprs;         // in program order
  std::vector<const TensorView*> inputs;  // read from outside the segment, in first-use order
  std::vector<const TensorView*> outputs; // used outside the segment or fusion outputs
};

const char* segmentKindName(Segment::Kind k);  // "kernel", "gemm", "comm"

// Cuts a decomposed fusion into segments, in an order that respects every dependency.
// requires: decompose-reshardings (each `set` that changes a sharding is its own segment).
std::vector<Segment> segmentFusion(const Fusion& fusion);

// "kernel #0 (%a, %b) -> (%c): add, gelu" per line, for `meshfuse dump --stage=segmented`.
std::string printSegments(const Fusion& fusion, const std::vector<Segment>& segments);

}  // namespace meshfuse
