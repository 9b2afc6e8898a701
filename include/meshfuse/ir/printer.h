// The textual form of a Fusion (`.mf`). print -> parse -> print is the identity.
//
//   fusion {
//     mesh @tp = [0, 1, 2, 3]
//     %inp = input f32[?t, 64] @tp {}
//     %up_w = input f32[256, 64] @tp {split(0, 4), parallelize(0, DIDx)}
//     %2 = linear(%inp, %up_w) : f32[?t, 256, r64] @tp {split(1, 4), parallelize(1, DIDx)} from "..."
//     %3 = gelu(%2, approximate="tanh") : f32[?t, 256]
//     output %3
//   }
//
// A TensorView's annotation is `dtype[dims]`, then (once it has a mesh) `@mesh {schedule}`;
// a sharding decided by propagation (not pinned by the user) ends with `from "<provenance>"`.
// Dims: `64`, `?t` (symbolic), `r64` (reduction), `1` (broadcast).
#pragma once

#include <string>

namespace meshfuse {

class Fusion;
class TensorView;

std::string printFusion(const Fusion& fusion);
// "f32[?t, 256, r64] @tp {split(1, 4), parallelize(1, DIDx)}" (no provenance).
std::string printTensorType(const TensorView* tv);
class Expr;
// "linear(%x, %w, bias=%b)": an op application as the printer writes it.
std::string printExprCall(const Fusion& fusion, const Expr* e);

}  // namespace meshfuse
