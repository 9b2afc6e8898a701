// Lowering of ring attention (contract in lower_ring_attention.h).
#include "lower/lower_ring_attention.h"

#include <algorithm>
#include <climits>
#include <map>
#include <optional>

#include "decompose/decompose_ring_attention.h"
#include "lower/host_builder.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/placement.h"
#include "propagation/sharding.h"

namespace meshfuse {
namespace {

using host::allocate;
using host::block;
using host::deallocate;
using host::event;
using host::onStream;

constexpr int64_t kSeq = 2;  // attention's operands: [batch, heads, seq, e]
constexpr int64_t kCur = 1, kNext = 2;  // the slots of the attended and the arriving block (whole)

const TensorView* operandOf(const Expr* e, size_t i) { return static_cast<const TensorView*>(e->input(i)); }

// Whether `e` is a set decompose-ring-attention marked to rotate.
bool isRingSet(const Expr* e) {
  return e != nullptr && e->kind() == OpKind::Set && e->attr<std::string>("overlap") == "ring";
}

class RingLowering {
 public:
  RingLowering(const std::vector<Segment>& segments, int64_t index, int64_t groups, OverlapLoweringState& state)
      : seg_(segments.at(index)), index_(index), state_(state) {
    for (const Expr* e : seg_.exprs)
      (e->kind() == OpKind::Sdpa ? sdpa_ : e->kind() == OpKind::SdpaLse ? lse_ : grad_) = e;
    att_ = sdpa_ != nullptr ? sdpa_ : grad_ != nullptr ? grad_ : lse_;
    MF_CHECK(att_ != nullptr && seg_.exprs.size() <= 2 && (grad_ == nullptr || (sdpa_ == nullptr && lse_ == nullptr)),
             "a ring attention segment of {} ops", seg_.exprs.size());
    // (Text written by hand may mark the sets without it; decompose-ring-attention adds it.)
    MF_USER_CHECK(sdpa_ == nullptr || lse_ != nullptr, ErrorKind::Value,
                  "ring attention of {}: no sdpa_lse of its query and key follows the sdpa (the log-sum-exp its "
                  "steps merge their partial outputs by; decompose-ring-attention adds it)",
                  att_->output()->fusion()->displayName(att_->output()));
    // The rotating tensors: the local blocks the ring-marked sets gather (k and v of sdpa and
    // sdpa_lse; the other side's blocks of sdpa_grad), each once.
    for (const Val* v : att_->inputs()) {
      const Expr* set = v != nullptr ? v->definition() : nullptr;
      if (!isRingSet(set)) continue;
      const TensorView* source = operandOf(set, 0);
      if (std::find(rotating_.begin(), rotating_.end(), source) == rotating_.end()) rotating_.push_back(source);
      if (axis_ < 0) {
        const Sharding from = readSharding(source), to = readSharding(set->output());
        for (size_t a = 0; a < from.axes.size(); ++a)
          if (from.axes[a] != to.axes[a]) axis_ = static_cast<int64_t>(a);
        balanced_ = set->attr<int64_t>("chunks") == 2 * att_->output()->mesh()->size(axis_);
      }
    }
    MF_CHECK(!rotating_.empty() && axis_ >= 0, "{}: a ring attention segment with no rotating operand", att_->name());
    n_ = att_->output()->mesh()->size(axis_);
    // Which side's rows rotate: the keys' (sdpa, sdpa_lse, the query's gradient) or the
    // queries' (the key's and value's gradients: their rows are key rows).
    queries_rotate_ = grad_ != nullptr && grad_->attr<std::string>("wrt") != "query";
    // The rows this rank keeps: the operands no ring-marked set gathers (the query, or for the
    // query's gradient also the output's gradient, lse and delta; the key and value when the
    // queries rotate).
    for (const Val* v : att_->inputs())
      if (v != nullptr && !isRingSet(v->definition()) &&
          std::find(kept_.begin(), kept_.end(), v) == kept_.end())
        kept_.push_back(static_cast<const TensorView*>(v));
    groups_ = headGroups(groups);
    if (groups_ > 1) cur_ = 2 * groups_, next_ = cur_ + 1;
  }

  void lower(std::vector<HostNode>& out) {
    for (const Expr* e : seg_.exprs) out.push_back(allocate(e->output()));
    if (balanced_) balanceKeptRows(out);
    for (const TensorView* t : rotating_) {
      out.push_back(slotBuffer(t, cur_));
      if (arrivesSeparately(t)) out.push_back(slotBuffer(t, next_));
    }
    if (groups_ > 1) {  // one ring per head group, one after the other
      std::vector<HostNode> body;
      ring(body);
      out.push_back(host::loop(groups_, std::move(body)));
    } else {
      ring(out);
    }
    out.push_back(host::sync());
    for (const TensorView* t : rotating_) {
      out.push_back(deallocate(t, 1, cur_));
      if (arrivesSeparately(t)) out.push_back(deallocate(t, 1, next_));
    }
    if (balanced_) restoreOutputs(out);
  }

 private:
  // The n steps of one ring (of the head group of the enclosing loop when groups_ > 1).
  void ring(std::vector<HostNode>& out) {
    const int64_t start = state_.events++, arrived = state_.events++, done = state_.events++;
    // Step 0: this rank's own block, while it travels on into the attended slot.
    out.push_back(ev(HostNodeKind::RecordEvent, start, {}, 0));
    out.push_back(onStream(1));
    out.push_back(ev(HostNodeKind::WaitEvent, start, {}, 0));
    rotate(0, cur_, /*inner=*/false, out);
    out.push_back(ev(HostNodeKind::RecordEvent, arrived, {}, 0));
    out.push_back(onStream(0));
    out.push_back(step(0, /*accumulate=*/false, {}, 0));
    out.push_back(ev(HostNodeKind::RecordEvent, done, {}, 0));
    // Steps 1 .. n - 2 (i = step - 1): attend the block that arrived, while the next one comes in.
    if (n_ > 2) {
      std::vector<HostNode> body;
      body.push_back(onStream(1));
      body.push_back(ev(HostNodeKind::WaitEvent, done, {1}, 0));  // the attended slot holds the block to send
      rotate(cur_, next_, /*inner=*/true, body);
      body.push_back(ev(HostNodeKind::RecordEvent, arrived, {1}, 1));
      body.push_back(onStream(0));
      body.push_back(ev(HostNodeKind::WaitEvent, arrived, {1}, 0));
      body.push_back(step(cur_, /*accumulate=*/true, {-1}, -1));
      body.push_back(ev(HostNodeKind::WaitEvent, arrived, {1}, 1));
      for (const TensorView* t : rotating_) body.push_back(host::copy(next(t), BlockRef::of(t, cur_), false));
      body.push_back(ev(HostNodeKind::RecordEvent, done, {1}, 1));
      out.push_back(host::loop(n_ - 2, std::move(body)));
    }
    // Step n - 1: the last block; nothing travels on.
    out.push_back(ev(HostNodeKind::WaitEvent, arrived, {}, n_ - 2));
    out.push_back(step(cur_, /*accumulate=*/true, {}, -(n_ - 1)));
  }

  // The head groups (BlockRef::heads) the ring runs in, one after the other, so that its slots
  // hold a group's block instead of a whole block: at most half a block of each rotating tensor
  // beyond its own (the attended and the arriving slot a quarter each, or the attended one half
  // when the ring reuses the own buffer), which leaves room for the merge state under one block in
  // flight. Fewer groups (1: whole blocks) when the ranks' [batch, heads] are not static and alike
  // or do not split so. `requested` > 0 (OverlapOptions::ring_groups): that many, or an error when
  // they do not split.
  int64_t headGroups(int64_t requested) const {
    if (requested == 1) return 1;
    std::optional<std::pair<int64_t, int64_t>> pairs;  // (batch, heads) of a rank's block
    std::vector<const TensorView*> operands(seg_.inputs.begin(), seg_.inputs.end());
    operands.insert(operands.end(), seg_.outputs.begin(), seg_.outputs.end());
    for (const TensorView* t : operands) {
      if (t->mesh() == nullptr) return noGroups(requested, "is not on a mesh");
      const std::vector<Placement> ps = placementsOf(t);
      int64_t local[2];
      for (int64_t d : {0, 1}) {
        int64_t split = 1;
        for (size_t a = 0; a < ps.size(); ++a)
          if (ps[a] == Placement::shard(d)) split *= t->mesh()->size(static_cast<int64_t>(a));
        const Extent extent = t->shape()[d];
        if (!extent.isStatic() || !extent.divisible(split))
          return noGroups(requested,
                          fmt::format("has {} {} on {} devices", extent.toString(), d == 0 ? "batch" : "heads", split));
        local[d] = extent.value() / split;
      }
      if (pairs && *pairs != std::make_pair(local[0], local[1]))
        return noGroups(requested, "has blocks of unlike [batch, heads]");
      pairs = {local[0], local[1]};
    }
    const bool reused =
        std::all_of(rotating_.begin(), rotating_.end(), [&](const TensorView* t) { return donated(t); });
    const int64_t heads = pairs->second, all = pairs->first * heads;
    auto splits = [&](int64_t groups) {
      return all % groups == 0 && (heads % (all / groups) == 0 || (all / groups) % heads == 0);
    };
    if (requested > 0) {
      if (!splits(requested))
        noGroups(requested,
                 fmt::format("has {} (batch, head) pairs per rank ([batch {}, heads {}]), which do not split "
                             "into {} groups of whole heads of one batch entry or whole batch entries",
                             all, pairs->first, heads, requested));
      return requested;
    }
    for (int64_t groups = reused ? 2 : 4; groups > 1; --groups)
      if (splits(groups)) return groups;
    return 1;
  }
  // 1, or (`requested` > 1 head groups) the error that says why the attention has none.
  int64_t noGroups(int64_t requested, const std::string& why) const {
    MF_USER_CHECK(requested <= 1, ErrorKind::Value,
                  "ring attention of {}: ring_groups={} asks for head groups, but it {}",
                  att_->output()->fusion()->displayName(att_->output()), requested, why);
    return 1;
  }

  // A rotating tensor whose own buffer the ring may overwrite once it has attended and sent it:
  // an intermediate the ring's set is the only reader of.
  bool donated(const TensorView* t) const {
    const Fusion& f = *t->fusion();
    return !f.isInput(t) && !f.isOutput(t) && t->uses().size() == 1 && t != operandOf(att_, 0);
  }
  // Whether blocks of `t` arriving while one is attended need a slot of their own: they do on
  // rings of more than 2 ranks (2 ranks have no such step) when t's own buffer is not reused.
  bool arrivesSeparately(const TensorView* t) const { return n_ > 2 && !donated(t); }
  // (Inside the steps' loop: the arriving block goes to the own buffer's head group.)
  BlockRef next(const TensorView* t) const { return donated(t) ? view(t, 0, /*inner=*/true) : BlockRef::of(t, next_); }

  // A rotating tensor's buffer in ring slot `slot`: one head group's when groups_ > 1.
  HostNode slotBuffer(const TensorView* t, int64_t slot) const {
    return groups_ > 1 ? host::allocateHeadGroup(t, groups_, slot) : allocate(t, 1, slot);
  }
  // What a step reads or writes of `t`'s buffer in `slot`: the whole buffer, or its head group
  // (the group loop's variable; `inner`: from inside the steps' loop) unless the buffer is one
  // head group's already (a rotating slot).
  BlockRef view(const TensorView* t, int64_t slot, bool inner) const {
    const bool group_buffer =
        (slot == cur_ || slot == next_) && std::find(rotating_.begin(), rotating_.end(), t) != rotating_.end();
    if (groups_ == 1 || group_buffer) return BlockRef::of(t, slot);
    return host::headGroup(t, groups_, inner ? std::vector<int64_t>{1, 0} : std::vector<int64_t>{1}, 0, slot);
  }
  // An event instance: per head group, n_ instances (coefficient n_ on the group loop).
  HostNode ev(HostNodeKind kind, int64_t id, std::vector<int64_t> coeffs, int64_t offset) const {
    if (groups_ > 1) coeffs.insert(coeffs.begin(), n_);
    return event(kind, id, std::move(coeffs), offset);
  }

  // One send/recv per rotating tensor (to r + 1, from r - 1) from slot `from` into slot `to`.
  void rotate(int64_t from, int64_t to, bool inner, std::vector<HostNode>& out) {
    std::vector<int64_t> handles;
    for (const TensorView* t : rotating_) {
      handles.push_back(state_.handles++);
      out.push_back(host::sendRecv(view(t, from, inner), to == next_ ? next(t) : BlockRef::of(t, to), axis_,
                                   handles.back(), /*shift=*/1));
    }
    for (int64_t h : handles) out.push_back(host::wait(h));
  }

  // The attention (or its gradient) of this rank's own rows against the rotating block in `slot`
  // (0: its own), block (r + coeffs . i + offset) mod n of the rotating side's sequence.
  HostNode step(int64_t slot, bool accumulate, std::vector<int64_t> coeffs, int64_t offset) const {
    const bool inner = !coeffs.empty();
    const TensorView* q = operandOf(att_, 0);
    std::vector<BlockRef> views;
    for (const TensorView* in : seg_.inputs) {
      const Expr* d = in->definition();
      views.push_back(isRingSet(d) ? view(operandOf(d, 0), slot, inner)
                                   : view(in, balanced_ ? keptSlot(in) : 0, inner));
    }
    for (const TensorView* o : seg_.outputs) views.push_back(view(o, restored(o) ? 1 : 0, inner));
    auto source = [&](size_t i) {  // (the block a ring-marked set gathers)
      const TensorView* t = operandOf(att_, i);
      return isRingSet(t->definition()) ? operandOf(t->definition(), 0) : t;
    };
    const TensorView* k = operandOf(att_, 1);
    BlockRef rotating = block(source(queries_rotate_ ? 0 : 1), n_, std::move(coeffs), 1, offset, axis_);
    const TensorView* kept = queries_rotate_ ? k : q;
    std::vector<BlockRef> own = {block(kept, balanced_ ? 2 * n_ : n_, {}, balanced_ ? 2 : 1, 0, axis_)};
    if (balanced_) own.push_back(block(kept, 2 * n_, {}, -2, 2 * n_ - 1, axis_));
    if (queries_rotate_) return host::attentionStep(index_, std::move(views), accumulate, {rotating}, std::move(own));
    return host::attentionStep(index_, std::move(views), accumulate, std::move(own), {rotating});
  }

  // Causal balance: this rank keeps the first half of the rows it keeps (chunk 2r of the query,
  // or of the keys when the queries rotate) and takes the second half of rank n - 1 - r's (chunk
  // 2n - 1 - 2r) into each kept operand's balanced buffer (keptSlot).
  void balanceKeptRows(std::vector<HostNode>& out) {
    for (const TensorView* o : seg_.outputs)
      if (restored(o)) out.push_back(allocate(o, 1, 1));
    for (const TensorView* t : kept_) {
      out.push_back(allocate(t, 1, keptSlot(t)));
      swapHalves(BlockRef::of(t), BlockRef::of(t, keptSlot(t)), out);
    }
  }
  // ... and gives the output rows of those back: its own first half, rank n - 1 - r's second.
  void restoreOutputs(std::vector<HostNode>& out) {
    for (const TensorView* o : seg_.outputs) {
      if (!restored(o)) continue;
      swapHalves(BlockRef::of(o, 1), BlockRef::of(o), out);
      out.push_back(deallocate(o, 1, 1));
    }
    for (const TensorView* t : kept_) out.push_back(deallocate(t, 1, keptSlot(t)));
  }
  // A kept operand's balanced buffer: slot 1, unless it is itself a rotating tensor
  // (self-attention: q, k and v one tensor), whose slots 1 and 2 hold the rotating blocks.
  int64_t keptSlot(const TensorView* t) const {
    return std::find(rotating_.begin(), rotating_.end(), t) != rotating_.end() ? kNext + 1 : 1;
  }
  // Whether output `o` is computed in the balanced layout and given back: every output anything
  // reads (the forward's own log-sum-exp, the merge state nothing else reads, stays as computed).
  bool restored(const TensorView* o) const {
    return balanced_ && (o->fusion()->isOutput(o) || !o->uses().empty());
  }
  // `to` = (the first half of `from`, the second half of the mirrored rank's `from`), halves of
  // the sequence dim.
  void swapHalves(const BlockRef& from, const BlockRef& to, std::vector<HostNode>& out) {
    auto half = [](BlockRef b, int64_t which) {
      b.blocks = 2;
      b.offset = which;
      return b;
    };
    out.push_back(host::copy(half(from, 0), half(to, 0), false, kSeq));
    const int64_t h = state_.handles++;
    out.push_back(host::sendRecv(half(from, 1), half(to, 1), axis_, h, /*shift=*/0, /*mirror=*/true, kSeq));
    out.push_back(host::wait(h));
  }

  const Segment& seg_;
  int64_t index_;
  OverlapLoweringState& state_;
  const Expr* sdpa_ = nullptr;
  const Expr* lse_ = nullptr;
  const Expr* grad_ = nullptr;
  const Expr* att_ = nullptr;                // the sdpa, else the sdpa_grad, else the sdpa_lse
  int64_t groups_ = 1;                       // head groups, one ring each (headGroups)
  // The slots of the attended and the arriving block: kCur and kNext, or for one of g head groups
  // 2g and 2g + 1 (a buffer's size goes with its slot in the whole program, and another ring of it
  // may hold the tensor whole: the query's gradient ring keeps q in slot 1 while the key's and
  // value's ring rotates it).
  int64_t cur_ = kCur, next_ = kNext;
  std::vector<const TensorView*> rotating_;  // the local blocks the ring-marked sets gather, each once
  std::vector<const TensorView*> kept_;      // the operands of the rows this rank keeps, each once
  int64_t axis_ = -1, n_ = 1;
  bool balanced_ = false, queries_rotate_ = false;
};

// The global (start, rows) of the sequence block `b` names on `rank` in the iteration `loops`.
std::pair<int64_t, int64_t> blockRows(const BlockRef& b, const std::vector<int64_t>& loops, int64_t rank,
                                      const SymbolBindings& bindings) {
  const int64_t rows = b.tv->evaluateShape(bindings).at(kSeq) / b.blocks;
  int64_t index = b.offset;
  const size_t first = loops.size() - b.loop_coeffs.size();  // (the innermost loops)
  for (size_t j = 0; j < b.loop_coeffs.size(); ++j) index += b.loop_coeffs[j] * loops[first + j];
  if (b.rank_coeff != 0) index += b.rank_coeff * b.tv->mesh()->indexAlong(rank, b.mesh_axis);
  return {((index % b.blocks) + b.blocks) % b.blocks * rows, rows};
}

// Adds one ring step's chunk pairs to `count`.
void countStep(const HostProgram& p, const hir::SegmentCall& n, const std::vector<int64_t>& loops, const SymbolBindings& b,
               AttentionBlocks& count) {
  std::vector<std::pair<int64_t, int64_t>> queries, keys;
  for (const BlockRef& r : n.query_blocks) queries.push_back(blockRows(r, loops, p.rank, b));
  for (const BlockRef& r : n.key_blocks) keys.push_back(blockRows(r, loops, p.rank, b));
  int64_t chunk = INT64_MAX;
  for (const auto& q : queries) chunk = std::min(chunk, q.second);
  for (const auto& k : keys) chunk = std::min(chunk, k.second);
  bool causal = false;
  for (const Expr* e : p.segment(n).exprs) causal |= e->attr<bool>("is_causal");
  count.chunk = chunk;
  ++count.steps;
  for (const auto& [qs, qn] : queries)
    for (int64_t q = qs; q < qs + qn; q += chunk)
      for (const auto& [ks, kn] : keys)
        for (int64_t k = ks; k < ks + kn; k += chunk) ++(causal && k > q + chunk - 1 ? count.skipped : count.attended);
}

void countBlocks(const HostProgram& p, const std::vector<HostNode>& nodes, std::vector<int64_t>& loops,
                 const SymbolBindings& b, std::map<int64_t, AttentionBlocks>& out) {
  for (const HostNode& n : nodes) {
    if (const auto* l = n.as<hir::ForLoop>()) {
      loops.push_back(0);
      for (int64_t i = 0; i < l->trip_count; ++i) {
        loops.back() = i;
        countBlocks(p, l->body, loops, b, out);
      }
      loops.pop_back();
    } else if (const auto* g = n.as<hir::Gemm>(); g && !g->query_blocks.empty()) {
      AttentionBlocks& count = out[g->segment];
      for (const BlockRef& v : g->views)
        if (v.heads) count.head_groups = v.blocks;
      for (const Expr* e : p.segment(*g).exprs)  // (the sdpa's name, not its sdpa_lse's)
        if (e->kind() != OpKind::SdpaLse || count.tensor.empty()) count.tensor = p.fusion->displayName(e->output());
      countStep(p, *g, loops, b, count);
    }
  }
}

}  // namespace

std::vector<AttentionBlocks> attentionBlocks(const HostProgram& program, const SymbolBindings& bindings) {
  MF_CHECK(program.rank >= 0, "attention blocks of a program not specialized for a rank");
  std::map<int64_t, AttentionBlocks> by_segment;
  std::vector<int64_t> loops;
  countBlocks(program, program.nodes, loops, bindings, by_segment);
  std::vector<AttentionBlocks> out;
  for (auto& [segment, count] : by_segment) {  // (one head group's: every group attends the same pairs)
    count.steps /= count.head_groups;
    count.attended /= count.head_groups;
    count.skipped /= count.head_groups;
    out.push_back(std::move(count));
  }
  return out;
}

bool isRingAttention(const Segment& seg) {
  for (const Expr* e : seg.exprs)
    if (e->info().category == OpCategory::Attention)
      for (const Val* v : e->inputs())
        if (v != nullptr && isRingSet(v->definition())) return true;
  return false;
}

void lowerRingAttention(const std::vector<Segment>& segments, int64_t index, int64_t groups,
                        OverlapLoweringState& state, std::vector<HostNode>& out) {
  RingLowering(segments, index, groups, state).lower(out);
}

}  // namespace meshfuse
