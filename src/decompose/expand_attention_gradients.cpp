// expand-attention-gradients (contract in expand_attention_gradients.h).
#include "decompose/expand_attention_gradients.h"

#include <algorithm>
#include <set>

#include "autodiff/attention_gradients.h"
#include "meshfuse/ir/fusion.h"
#include "propagation/sharding.h"

namespace meshfuse {
namespace {

bool isSdpaGrad(const Expr* e) { return e->kind() == OpKind::SdpaGrad; }

// Whether a and b are gradients of the same attention, placed alike: one expansion serves both.
bool sameAttention(const Expr* a, const Expr* b) {
  if (a->inputs().size() != b->inputs().size()) return false;
  for (size_t i = 0; i < a->inputs().size(); ++i)
    if (a->input(i) != b->input(i)) return false;
  return a->attr<bool>("is_causal") == b->attr<bool>("is_causal") &&
         a->attr<double>("scale") == b->attr<double>("scale") && readSharding(a->output()) == readSharding(b->output());
}

// Makes every reader of `old` (and the output list) read `now`, which takes over its name, its
// sharding (pinned or not) and its provenance; removes old's op.
void replaceWith(Fusion& f, TensorView* old, TensorView* now) {
  f.replaceAllUses(old, now);
  writeSharding(now, readSharding(old));
  now->setPinned(old->pinned());
  now->setProvenance(old->provenanceNote());
  std::string name = old->name();
  f.rename(old, "");
  f.rename(now, name);
  f.removeExpr(old->definition());
}

// Expands the sdpa_grad ops of `group` (one attention's, `group[0]` first in program order).
void expandGroup(Fusion& f, const std::vector<Expr*>& group) {
  const Expr* first = group[0];
  const Sharding sharding = readSharding(first->output());
  for (const AxisState& st : sharding.axes)
    MF_CHECK(st.kind == Placement::Replicate || (st.kind == Placement::Shard && st.dim < 2),
             "expand-attention-gradients: {} is {} on a mesh axis: attention's rule keeps the sequences whole",
             f.displayName(first->output()), st.toString());
  auto find = [&](const char* wrt) -> Expr* {
    for (Expr* e : group)
      if (e->attr<std::string>("wrt") == wrt) return e;
    return nullptr;
  };
  Expr *dq = find("query"), *dk = find("key"), *dv = find("value");
  auto operand = [&](size_t i) { return static_cast<TensorView*>(first->input(i)); };
  const std::vector<TensorView*> before = f.tensorViews();
  const std::set<TensorView*> old(before.begin(), before.end());
  f.setInsertionPoint(group[0]);
  auto optional = [&](const char* name) { return static_cast<TensorView*>(first->input(name)); };
  autodiff::AttentionGradients r =
      autodiff::attentionGradients(first, operand(0), operand(1), operand(2), operand(3), optional("lse"),
                                   optional("delta"), dq != nullptr, dk != nullptr, dv != nullptr);
  f.setInsertionPoint(nullptr);
  // The note names the value that takes the place of the first op's output (its name too).
  TensorView* named = first == dq ? r.dq : first == dk ? r.dk : r.dv;
  const Provenance why{fmt::format("{}: batch and heads as {{}} (an sdpa_grad, expanded)", toString(sharding)),
                       {named}};
  for (TensorView* tv : f.tensorViews()) {
    if (old.count(tv) > 0) continue;
    writeSharding(tv, sharding);
    tv->setPinned(false);  // derived, as propagation's values are (printed with their provenance)
    tv->setProvenance(why);
  }
  for (auto [op, grad] : {std::pair{dq, r.dq}, std::pair{dk, r.dk}, std::pair{dv, r.dv}})
    if (op != nullptr) replaceWith(f, op->output(), grad);
}

// With its lse and delta (as autodiff writes it) an sdpa_grad runs the attention-gradient kernel
// of both backends, on whole sequences or on blocks of rows: no [s, s] P is materialized. (Only
// such a one has its rows split: sharding_rule.cpp; shape inference gives both or neither.)
bool tiled(const Expr* e) { return e->input("lse") != nullptr && e->input("delta") != nullptr; }

}  // namespace

void expandAttentionGradients(Fusion& f) {
  std::vector<Expr*> pending;
  std::copy_if(f.exprs().begin(), f.exprs().end(), std::back_inserter(pending),
               [](const Expr* e) { return isSdpaGrad(e) && !tiled(e); });
  while (!pending.empty()) {
    std::vector<Expr*> group;
    for (Expr* e : pending)
      if (sameAttention(e, pending[0])) group.push_back(e);
    std::erase_if(pending, [&](Expr* e) { return std::find(group.begin(), group.end(), e) != group.end(); });
    expandGroup(f, group);
  }
}

}  // namespace meshfuse
