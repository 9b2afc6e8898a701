// The IR verifier, run between passes (always in tests and debug builds; an option otherwise).
// Violations are internal errors (a pass broke the IR) unless the IR came from a user, in which
// case the caller reports them as user errors: `verify` throws UserError(Placement/Name/...)
// because a parsed or built fusion can carry the same defects.
#pragma once

namespace meshfuse {

class Fusion;

struct VerifyOptions {
  // After propagate-shardings: every TensorView must have a mesh.
  bool require_meshes = false;
};

// Checks: def-before-use in program order; every operand belongs to the fusion; each value is
// defined once; outputs are defined; DID axes need a mesh, are within the mesh's rank, are used
// at most once per tensor and have the extent of their mesh axis. (Output types need no check:
// Fusion::apply is the only way to create an Expr and it infers them.)
void verify(const Fusion& fusion, const VerifyOptions& options = {});

}  // namespace meshfuse
