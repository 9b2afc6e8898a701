// Sharding rules of every op category.
#include "propagation/sharding_rule.h"

#include <algorithm>
#include <numeric>
#include <optional>

#include "meshfuse/ir/fusion.h"

namespace meshfuse {
namespace {

const TensorView* tensorOperand(const Expr* e, size_t i) {
  const Val* v = e->inputs()[i];
  return v != nullptr && v->valKind() == ValKind::TensorView ? static_cast<const TensorView*>(v) : nullptr;
}

std::vector<int64_t> identity(int64_t rank) {
  std::vector<int64_t> m(rank);
  std::iota(m.begin(), m.end(), 0);
  return m;
}

// Reshape: input and output dims in groups of equal element count. A group's outermost input
// dim maps to its outermost output dim (sharding it keeps each shard contiguous); the other
// dims of a group that really splits or merges cannot be sharded. The mapped pair holds for an
// n-way split only when n divides both dims ([2, 16] -> [32] carries a 2-way split, not a 4-way
// one); propagation checks that per mesh axis, as the map does not know the mesh.
// A size-1 dim holds no elements of its own: one inserted or removed anywhere ([s, h] ->
// [1, s, h], [s, h] -> [s, 1, h] and back) is skipped, so it never becomes the outermost dim of
// a group and the dims beside it keep their shards. Two size-1 dims facing each other pair up.
std::vector<int64_t> reshapeMap(const TensorView* in, const TensorView* out) {
  std::vector<Extent> a = in->shape(), b = out->shape();
  std::vector<int64_t> m(a.size(), -1);
  auto one = [](const Extent& e) { return e.isStatic() && e.value() == 1; };
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i] == b[j]) {
      m[i++] = static_cast<int64_t>(j++);
      continue;
    }
    if (one(a[i])) {  // removed
      ++i;
      continue;
    }
    if (one(b[j])) {  // inserted
      ++j;
      continue;
    }
    if (!a[i].isStatic() || !b[j].isStatic()) {
      // A symbolic size that is split or merged: map the outer pair, stop matching after it.
      m[i] = static_cast<int64_t>(j);
      break;
    }
    size_t gi = i, gj = j;
    int64_t pa = a[i++].value(), pb = b[j++].value();
    while (pa != pb) {
      if (pa < pb) {
        if (i >= a.size() || !a[i].isStatic()) return m;
        pa *= a[i++].value();
      } else {
        if (j >= b.size() || !b[j].isStatic()) return m;
        pb *= b[j++].value();
      }
    }
    m[gi] = static_cast<int64_t>(gj);
  }
  return m;
}

// embedding(weight [(G,) V, H], indices [(G,) i...]) -> [(G,) i..., H]: the indices' dims and the
// hidden dim pass through, a group dim too (weight, indices and output together); the table's
// rows (V) stay whole: a row-sharded table is the grouped form (docs/training.md). Linear in
// the weight.
// embedding_backward(grad [(G,) i..., H], indices) -> [(G,) V, H, r{i...}]: a contraction over
// the indices' dims (sharded: a Partial table gradient, as a GEMM's); H passes through; the rows
// come from no operand. Linear in grad.
// one_hot(indices [i...]) -> [i..., C]: the indices' dims pass through; the classes are whole.
void indexingRule(const Expr* e, ShardingRule& r) {
  if (e->kind() == OpKind::OneHot) {
    r.operand_maps[0] = identity(tensorOperand(e, 0)->rank());
    return;
  }
  if (e->kind() == OpKind::Embedding) {
    const TensorView* w = tensorOperand(e, 0);
    const TensorView* idx = tensorOperand(e, 1);
    const int64_t out_h = idx->rank();
    r.operand_maps[1] = identity(idx->rank());
    r.operand_maps[0] = w->rank() == 3 ? std::vector<int64_t>{0, -1, out_h} : std::vector<int64_t>{-1, out_h};
    r.partial_mode = ShardingRule::PartialMode::AnyOne;
    r.linear_in[0] = true;
    r.weight_operand = 0;
    return;
  }
  const TensorView* idx = tensorOperand(e, 1);
  const bool grouped = e->attr<bool>("grouped");
  const int64_t lead = grouped ? 1 : 0;  // output dims before the rows
  // Output logical: [(G,) V, H, r{idx dims after the group}].
  std::vector<int64_t> m(idx->rank());
  for (int64_t d = 0; d < idx->rank(); ++d) m[d] = d < lead ? d : lead + 2 + (d - lead);
  r.operand_maps[1] = m;
  m.push_back(lead + 1);  // grad's hidden dim
  r.operand_maps[0] = m;
  r.partial_mode = ShardingRule::PartialMode::AnyOne;
  r.linear_in[0] = true;
}

// cross_entropy(logits [N, C, d...], target [N, d...]): the batch dims pass through (to the
// output's dims, or for "sum"/"mean" to its reduction dims); the class dim stays whole (a
// vocab-sharded logits tensor is gathered: docs/training.md). "sum" and "none" are linear in
// the per-element losses, so a sharded batch dim gives a Partial sum; "mean" divides by a count
// over the whole batch and is not: compile's expand-for-sharding pass rewrites it as a "sum"
// over the count before propagation.
void lossRule(const Expr* e, ShardingRule& r) {
  const TensorView* x = tensorOperand(e, 0);
  const int64_t class_dim = x->rank() >= 2 ? 1 : 0;
  std::vector<int64_t> mx(x->rank());
  for (int64_t d = 0; d < x->rank(); ++d) mx[d] = d == class_dim ? -1 : (d < class_dim ? d : d - 1);
  r.operand_maps[0] = mx;
  r.operand_maps[1] = identity(tensorOperand(e, 1)->rank());
  r.contraction_ok = e->attr<std::string>("reduction") == "sum";
}

}  // namespace

bool ShardingRule::fromOperands(int64_t out_logical) const {
  for (const std::vector<int64_t>& m : operand_maps)
    if (std::find(m.begin(), m.end(), out_logical) != m.end()) return true;
  return false;
}

bool expands(const Expr* e, const ShardingRule& rule, size_t operand, int64_t dim) {
  const int64_t out_logical = rule.operand_maps.at(operand).at(dim);
  const IterDomain* id = tensorOperand(e, operand)->dims().at(dim);
  return out_logical >= 0 && id->isBroadcast() && id->extent() != e->output()->logical().at(out_logical)->extent();
}

namespace {

// Whether cutting `a` (elements `pa` each) and `b` (elements `pb` each) by torch.chunk over the
// nested `devices` gives every rank the same elements.
bool chunksLineUp(int64_t a, int64_t pa, int64_t b, int64_t pb, const std::vector<int64_t>& devices, size_t level) {
  if (level == devices.size()) return true;
  for (int64_t r = 0; r < devices[level]; ++r) {
    const Span x = chunkSpan(a, devices[level], r), y = chunkSpan(b, devices[level], r);
    if (x.begin * pa != y.begin * pb || x.size * pa != y.size * pb) return false;
    if (!chunksLineUp(x.size, pa, y.size, pb, devices, level + 1)) return false;
  }
  return true;
}

// The product of `dims` from `from` on, under `sizes`; nullopt when one is an unbound symbol.
std::optional<int64_t> elementsFrom(const std::vector<Extent>& dims, size_t from, const SymbolBindings& sizes) {
  int64_t n = 1;
  for (size_t d = from; d < dims.size(); ++d) {
    if (!dims[d].isStatic() && !sizes.count(dims[d].symbol())) return std::nullopt;
    n *= dims[d].evaluate(sizes);
  }
  return n;
}

}  // namespace

bool carriesShard(const Expr* e, const ShardingRule& rule, size_t operand, int64_t dim,
                  const std::vector<int64_t>& devices, const SymbolBindings& sizes) {
  const int64_t ol = rule.operand_maps.at(operand).at(dim);
  if (ol < 0) return false;
  const TensorView* in = tensorOperand(e, operand);
  const IterDomain* out_id = e->output()->logical().at(ol);
  const Extent& a = in->dims().at(dim)->extent();
  const Extent& b = out_id->extent();
  if (a == b || out_id->isReduction()) return true;
  int64_t all = 1;
  for (int64_t n : devices) all *= n;
  if (e->info().category != OpCategory::Reshape) return a.divisible(all) && b.divisible(all);
  // A reshape keeps elements in order: dim `dim` and the dims after it hold the same elements as
  // output dim `ol` and those after it (the dims before are whole groups of equal size).
  const std::vector<Extent> ins = in->shape(), outs = e->output()->shape();
  int64_t od = 0;  // the dims() index of output dim `ol`
  for (int64_t l = 0; l < ol; ++l) od += e->output()->logical()[l]->isReduction() ? 0 : 1;
  std::optional<int64_t> pa = elementsFrom(ins, dim + 1, sizes), pb = elementsFrom(outs, od + 1, sizes),
                         ea = elementsFrom({a}, 0, sizes), eb = elementsFrom({b}, 0, sizes);
  if (!pa || !pb || !ea || !eb) return false;
  return chunksLineUp(*ea, *pa, *eb, *pb, devices, 0);
}

namespace {

// Every tensor operand i gets per_operand(i, operand) as its map.
template <class F>
void mapOperands(const Expr* e, ShardingRule& r, F&& per_operand) {
  for (size_t i = 0; i < e->inputs().size(); ++i)
    if (const TensorView* t = tensorOperand(e, i)) r.operand_maps[i] = per_operand(i, t);
}

// Unary, cast, set, binary, compare, ternary: every dim passes through. Which operands a pending
// sum may pass through follows linearity: -x and x+y distribute over a sum, x*y in one factor,
// x/y in the numerator only.
void elementwiseRule(const Expr* e, ShardingRule& r) {
  mapOperands(e, r, [](size_t, const TensorView* t) { return identity(t->rank()); });
  switch (e->kind()) {
    case OpKind::Neg:
    case OpKind::Set:
      r.partial_mode = ShardingRule::PartialMode::AnyOne;
      r.linear_in[0] = true;
      break;
    case OpKind::Add:
    case OpKind::Sub: r.partial_mode = ShardingRule::PartialMode::All; break;
    case OpKind::Mul:
      r.partial_mode = ShardingRule::PartialMode::AnyOne;
      r.linear_in = {true, true};
      break;
    case OpKind::Div:
      r.partial_mode = ShardingRule::PartialMode::AnyOne;
      r.linear_in = {true, false};
      break;
    default: break;
  }
}

// Reduced dims stay in place as r-dims, so a sharded reduced dim is a contraction (a Partial
// output) for sum; the other reductions keep the reduced dims whole. Max is not linear.
void reductionRule(const Expr* e, ShardingRule& r) {
  const auto& dims = e->attr<std::vector<int64_t>>("dims");
  const TensorView* x = tensorOperand(e, 0);
  r.operand_maps[0] = identity(x->rank());
  if (e->kind() != OpKind::Sum) {
    for (int64_t d : dims) r.operand_maps[0][d < 0 ? d + x->rank() : d] = -1;
  }
  if (e->kind() != OpKind::Max) {
    r.partial_mode = ShardingRule::PartialMode::AnyOne;
    r.linear_in[0] = true;
  }
}

// linear(a [..., k], w [n, k] (, bias [n])) and matmul(a [..., m, k], b [..., k, n]): batch and
// row dims pass through, k is the contraction, n comes from the weight.
void gemmRule(const Expr* e, ShardingRule& r) {
  const TensorView* out = e->output();
  const TensorView* a = tensorOperand(e, 0);
  const TensorView* b = tensorOperand(e, 1);
  // The contracted dim: the last logical dim before any Partial dims a pending sum passing
  // through (linear(x Partial, w)) added.
  const int64_t k_pos = static_cast<int64_t>(out->logical().size()) - 1 - out->numPartialDims();
  const int64_t batch = out->rank() - (e->kind() == OpKind::Linear ? 1 : 2);  // output dims before n (and m)
  r.partial_mode = ShardingRule::PartialMode::AnyOne;
  r.linear_in[0] = r.linear_in[1] = true;
  r.weight_operand = 1;
  r.operand_maps[0] = identity(a->rank());
  r.operand_maps[0].back() = k_pos;
  if (e->kind() == OpKind::Linear) {
    r.operand_maps[1] = {batch, k_pos};
    if (tensorOperand(e, 2) != nullptr) {
      r.operand_maps[2] = {batch};
      r.contraction_ok = false;
      r.partial_mode = ShardingRule::PartialMode::None;
    }
    return;
  }
  std::vector<int64_t> mb(b->rank());
  for (int64_t d = 0; d + 2 < b->rank(); ++d) mb[d] = d;
  mb[b->rank() - 2] = k_pos;
  mb[b->rank() - 1] = batch + 1;
  r.operand_maps[1] = mb;
  if (!b->fusion()->isInput(b)) r.weight_operand = -1;  // activations on both sides
}

// Broadcast, reshape, permute, slice move data without arithmetic: linear, a pending sum passes
// through. A sliced dim (or one the slice shortens) stays whole.
void movementRule(const Expr* e, ShardingRule& r) {
  const TensorView* x = tensorOperand(e, 0);
  const TensorView* out = e->output();
  r.partial_mode = ShardingRule::PartialMode::AnyOne;
  r.linear_in[0] = true;
  switch (e->info().category) {
    case OpCategory::BroadcastInDim: r.operand_maps[0] = e->attr<std::vector<int64_t>>("broadcast_dims"); break;
    case OpCategory::Reshape: r.operand_maps[0] = reshapeMap(x, out); break;
    case OpCategory::Permute: {
      const auto& perm = e->attr<std::vector<int64_t>>("dims");
      r.operand_maps[0].assign(x->rank(), -1);
      for (size_t j = 0; j < perm.size(); ++j)
        r.operand_maps[0][(perm[j] + x->rank()) % x->rank()] = static_cast<int64_t>(j);
      break;
    }
    default: {  // Slice
      const auto& starts = e->attr<std::vector<int64_t>>("starts");
      r.operand_maps[0] = identity(x->rank());
      for (int64_t d = 0; d < x->rank(); ++d)
        if (starts[d] != 0 || x->shape()[d] != out->shape()[d]) r.operand_maps[0][d] = -1;
      break;
    }
  }
}

// cat, softmax, layer/rms norm, attention: one dim (or more) every output element depends on
// whole stays unsharded; the rest pass through.
void wholeDimRule(const Expr* e, ShardingRule& r) {
  auto withWhole = [](const TensorView* t, int64_t dim) {
    std::vector<int64_t> m = identity(t->rank());
    m[dim < 0 ? dim + t->rank() : dim] = -1;
    return m;
  };
  switch (e->info().category) {
    case OpCategory::Cat:
      mapOperands(e, r, [&](size_t, const TensorView* t) { return withWhole(t, e->attr<int64_t>("dim")); });
      r.partial_mode = ShardingRule::PartialMode::All;
      break;
    case OpCategory::Softmax: r.operand_maps[0] = withWhole(tensorOperand(e, 0), e->attr<int64_t>("dim")); break;
    case OpCategory::Norm:
      // The normalized dim (and the weight/bias along it) stays whole.
      mapOperands(e, r,
                  [&](size_t i, const TensorView* t) { return i > 0 ? std::vector<int64_t>{-1} : withWhole(t, -1); });
      break;
    default:  // Attention
      // Batch and heads pass through, and so does the query's sequence: each output row is its
      // query row's attention, so a sequence split of the query is one of the output. The keys'
      // and values' sequence (what every row attends) and the embedding dims stay whole
      // (context parallelism moves or rotates them: context_parallel.h).
      // An sdpa_grad with its lse and delta (ops.def) has independent rows too: dQ's are query
      // rows (of q, grad, lse and delta), dK's and dV's key rows (of k and v); the other side's
      // sequence stays whole (ring attention rotates it).
      mapOperands(e, r, [&](size_t i, const TensorView* t) {
        bool rows = i == 0 && (e->kind() == OpKind::Sdpa || e->kind() == OpKind::SdpaLse);
        if (e->kind() == OpKind::SdpaGrad && e->input("lse") != nullptr) {
          const bool query_side = i == 0 || i >= 3;
          rows = query_side == (e->attr<std::string>("wrt") == "query");
        }
        std::vector<int64_t> m{0, 1, rows ? 2 : -1, -1};
        m.resize(t->rank());  // lse and delta: [b, heads, s]
        return m;
      });
      break;
  }
}

}  // namespace

ShardingRule shardingRuleOf(const Expr* e) {
  ShardingRule r;
  const size_t n = e->inputs().size();
  r.operand_maps.resize(n);
  r.linear_in.assign(n, false);
  switch (e->info().category) {
    case OpCategory::Unary:
    case OpCategory::Cast:
    case OpCategory::Set:
    case OpCategory::Binary:
    case OpCategory::Compare:
    case OpCategory::Ternary: elementwiseRule(e, r); break;
    case OpCategory::Reduction: reductionRule(e, r); break;
    case OpCategory::Gemm: gemmRule(e, r); break;
    case OpCategory::BroadcastInDim:
    case OpCategory::Reshape:
    case OpCategory::Permute:
    case OpCategory::Slice: movementRule(e, r); break;
    case OpCategory::Cat:
    case OpCategory::Softmax:
    case OpCategory::Norm:
    case OpCategory::Attention: wholeDimRule(e, r); break;
    case OpCategory::Indexing: indexingRule(e, r); break;
    case OpCategory::Loss: lossRule(e, r); break;
  }
  // The contracted dim: the first output r-dim an operand dim maps to.
  const TensorView* out = e->output();
  for (size_t l = 0; r.contraction_ok && l + out->numPartialDims() < out->logical().size(); ++l) {
    if (out->logical()[l]->isReduction() && r.fromOperands(static_cast<int64_t>(l))) {
      r.contracted_dim = static_cast<int64_t>(l);
      break;
    }
  }
  return r;
}

}  // namespace meshfuse
