// Attention's gradients as existing ops: what an sdpa_grad op computes, built by
// expand-attention-gradients once propagation has placed the sdpa_grad ops (the rules' helpers it
// shares live in grad_rules_nn.cpp, which defines it).
#pragma once

#include "meshfuse/ir/fusion.h"

namespace meshfuse::autodiff {

// nullptr where not asked for.
struct AttentionGradients {
  TensorView* dq = nullptr;
  TensorView* dk = nullptr;
  TensorView* dv = nullptr;
};

// dQ, dK and dV of sdpa(q, k, v) for output gradient g, with the is_causal and scale attributes of
// `sdpa_grad` (an sdpa_grad op of these operands), appended at the fusion's insertion point: P =
// softmax(scale q k^T (+ causal mask)) recomputed once, in f32; dV = P^T g, dS = P o (dP -
// rowsum(dP o P)) scale with dP = g v^T, dQ = dS k, dK = dS^T q; each cast to q's dtype. Every
// value it creates keeps q's leading [batch, heads] dims.
// With `lse` and `delta` (the sdpa_grad's operands, or nullptr), P = exp(scale q k^T - lse) and
// rowsum(dP o P) = delta instead, as the op defines it.
AttentionGradients attentionGradients(const Expr* sdpa_grad, TensorView* q, TensorView* k, TensorView* v, TensorView* g,
                                      TensorView* lse, TensorView* delta, bool want_q, bool want_k, bool want_v);

}  // namespace meshfuse::autodiff
