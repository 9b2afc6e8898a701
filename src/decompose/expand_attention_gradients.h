// expand-attention-gradients: rewrites every sdpa_grad (the gradient of sdpa, a first-class op so
// that propagation shards it as attention: batch and heads pass through, Ulysses applies) that
// has no lse and delta operands (text written by hand: autodiff writes both, and those run the
// backends' attention-gradient kernel) into the ops that compute it, once it is placed
// (docs/training.md "Attention's gradient").
//
// requires: propagate-shardings; an sdpa_grad's output is Shard(0), Shard(1) or Replicate on each
//   mesh axis, or (one with its lse and delta operands, whose rows are independent) Shard(2) on
//   some: never Partial, never an embedding dim.
// guarantees: no sdpa_grad is left but those with lse and delta operands (autodiff's; the only
//   ones that may be split along a sequence), which stay for the attention-gradient kernel of
//   both backends, on whole sequences or on blocks of rows (ring attention rotates the other
//   side's blocks: decompose-ring-attention); the expanded sdpa_grad ops of one attention (same
//   operands, attributes and sharding) share one recomputation of P = softmax(scale q k^T (+ mask)); every
//   value the expansion creates is on the op's mesh with the op's batch/heads sharding, so the new
//   ops compute locally and decompose-reshardings moves their operands exactly as it would have
//   moved the sdpa_grad's (one move per operand, shared); the values and the f32 numerics are
//   autodiff::attentionGradients' (the reference executor's sdpa_grad, in f64).
//
//   before: %dv = sdpa_grad(%q, %k, %v, %g, wrt="value") : f32[2, 4, 16, 8] @m {split(1, 2), parallelize(1, DIDx)}
//   after:  %0 = permute(%k, dims=[0, 1, 3, 2]) : f32[2, 4, 8, 16] @m {split(1, 2), parallelize(1, DIDx)}
//           %1 = matmul(%q, %0) : f32[2, 4, 16, 16, r8] @m {split(1, 2), parallelize(1, DIDx)}
//           %2 = mul(%1, 0.353...)  ...  %3 = softmax(%2, dim=3)  ...  %4 = permute(%3, dims=[0, 1, 3, 2])
//           %dv = matmul(%4, %g) : f32[2, 4, 16, 8, r16] @m {split(1, 2), parallelize(1, DIDx)}
#pragma once

namespace meshfuse {
class Fusion;
void expandAttentionGradients(Fusion& fusion);
}  // namespace meshfuse
