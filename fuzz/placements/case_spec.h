// A placement-fuzzer case: a small random program over f32 tensors, its inputs' placements, its
// outputs' pins and the mesh, in a form that is easy to generate, shrink, print and rebuild.
//
// Every dim is a product of "size slots" (named sizes shared between tensors), so that the
// shrinker can make shapes smaller by lowering one slot while every op stays well formed
// (a linear's contracted dim and its weight's dim are the same slot). A dim with no slots is 1.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/placement.h"

namespace meshfuse::placement_fuzz {

using Dim = std::vector<int>;  // slot ids whose values multiply to the extent; empty: extent 1
using Shape = std::vector<Dim>;

// The ops the fuzzer draws from (a subset of ops.def chosen to cover every sharding rule family).
#define MESHFUSE_FUZZ_OPS(X) \
  X(Exp, "exp")              \
  X(Tanh, "tanh")            \
  X(Relu, "relu")            \
  X(Neg, "neg")              \
  X(Add, "add")              \
  X(Mul, "mul")              \
  X(Sum, "sum")              \
  X(Mean, "mean")            \
  X(Max, "max")              \
  X(Linear, "linear")        \
  X(Matmul, "matmul")        \
  X(Permute, "permute")      \
  X(Reshape, "reshape")      \
  X(Softmax, "softmax")      \
  X(LayerNorm, "layer_norm") \
  X(RmsNorm, "rms_norm")     \
  X(Sdpa, "sdpa")

enum class FuzzOp {
#define MESHFUSE_X(name, text) name,
  MESHFUSE_FUZZ_OPS(MESHFUSE_X)
#undef MESHFUSE_X
};
const char* fuzzOpName(FuzzOp op);

struct OpSpec {
  FuzzOp kind = FuzzOp::Exp;
  std::vector<int> operands;      // tensor ids (inputs first, then op results in order)
  int64_t axis = 0;               // reductions, softmax
  std::vector<int64_t> perm;      // permute
  Shape new_shape;                // reshape
};

struct CaseSpec {
  std::string name;                  // "s<seed>-w<world>-c<index>", kept through shrinking
  std::vector<int64_t> mesh_shape;   // {n} or {2, 2}; devices 0..size-1
  std::vector<int64_t> slots;        // slot values
  std::vector<Shape> input_shapes;
  std::vector<std::vector<Placement>> input_placements;  // one per mesh axis
  std::vector<OpSpec> ops;           // op i defines tensor input_shapes.size() + i
  std::vector<int> outputs;          // tensor ids
  std::vector<std::vector<Placement>> output_pins;  // per output; empty: not pinned

  int numTensors() const { return static_cast<int>(input_shapes.size() + ops.size()); }
  int64_t meshSize() const;
};

// The shape of every tensor of `c` (inputs, then op results).
std::vector<Shape> shapesOf(const CaseSpec& c);
std::vector<int64_t> extents(const CaseSpec& c, const Shape& s);

// A deterministic random case for a world of `world` ranks (seed and index name it); `uneven`:
// the percent of shard draws that may split a dim the mesh axis does not divide.
CaseSpec generateCase(uint64_t seed, int64_t index, int64_t world, int max_ops, int uneven = 0);

// The single-device definition (no meshes), with the outputs' pins applied on the mesh. Throws
// the builder's UserError when the case is not well formed (the shrinker relies on that).
std::unique_ptr<Fusion> buildDefinition(const CaseSpec& c);
DeviceMesh meshOf(const CaseSpec& c);
// Whether every input placement and output pin shards only dims it divides evenly (the oracle
// then searches even blocks only; in an uneven case, torch.chunk's blocks of any dim).
bool evenlyPlaced(const CaseSpec& c);

// One-line text form of the case (written into reproducers, read back by --replay).
std::string serializeCase(const CaseSpec& c);
CaseSpec parseCase(const std::string& text);  // throws ValueError on malformed text
// Human-readable: the program with shapes and placements, one tensor per line.
std::string describeCase(const CaseSpec& c);

}  // namespace meshfuse::placement_fuzz
