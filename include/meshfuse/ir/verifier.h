// The IR verifier, run between passes (always in tests and debug builds; an option otherwise).
// Structural and type violations are internal errors: only a pass can cause them (the parser
// and Fusion::apply infer every type). Mesh and DID violations and a fusion without outputs are
// UserErrors (Placement/Value), because a parsed or built fusion can carry them.
#pragma once

#include <string_view>

namespace meshfuse {

class Fusion;

struct VerifyOptions {
  // After propagate-shardings: every TensorView must have a mesh.
  bool require_meshes = false;
};

// Checks: def-before-use in program order; every operand belongs to the fusion; each value is
// defined once; outputs are defined; each op's
// output has the dtype and logical domain (extents and iter types, not counting trailing Partial
// dims) that shape inference gives for its current operands -- a pass that replaced an operand by
// one of another type broke the op; DID axes need a mesh, are within the mesh's rank, are used at
// most once per tensor and have the extent of their mesh axis.
void verify(const Fusion& fusion, const VerifyOptions& options = {});

// A fusion to compile or run needs at least one output: ValueError "<where>the fusion has no
// outputs: ..." otherwise. (Not part of verify: a definition may be empty while it is built.)
void requireOutputs(const Fusion& fusion, std::string_view where = "");

}  // namespace meshfuse
