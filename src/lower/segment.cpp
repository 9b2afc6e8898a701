// segment: cuts a decomposed fusion into fused kernels, library GEMM calls and communications.
//
// requires: decompose-reshardings (a `set` whose operand and output shardings differ is a
//   communication on one mesh axis and nothing else).
// guarantees:
//   - every resharding `set` is its own Communication segment;
//   - every linear / matmul / sdpa / sdpa_lse is in a Gemm segment of its own (a linear's bias is
//     fused into the GEMM; sdpa is one tiled attention kernel), with the transposes of its
//     operands it can read in place (a permute of the last two dims that only it reads),
//     except that an sdpa and an sdpa_lse of the same query, key and attributes share one
//     segment with two outputs (one kernel computes both), and so do the key's and the value's
//     gradient (sdpa_grad) of one attention (keyValueGradientPair);
//     the pointwise chain after a GEMM (bias add, activation, residual add) becomes the GEMM's
//     epilogue kernel, a Kernel segment;
//   - every other op is in a Kernel segment, fused with its producers as long as all of the
//     segment's values live on one mesh, all or none of them are microbatched (Stream-split
//     rows, which lower-to-host-ir runs in a loop), and no path leaves the segment and comes
//     back through another one (which would make the segments impossible to order);
//   - segments come in dependency order (ties: the program order of their first op); `inputs`
//     in first-use order; `outputs` in program order: the values used outside the segment,
//     fusion outputs, and values nobody uses (still computed, as they were before segmenting).
//
//   %b = broadcast_in_dim(%bias)              gemm   #0 (%x, %w) -> (%a): linear
//   %a = linear(%x, %w)                  =>   kernel #1 (%bias, %a, %r) -> (%y):
//   %y = add(gelu(add(%a, %b)), %r)                broadcast_in_dim, add, gelu, add
#include "lower/segment.h"

#include <algorithm>
#include <map>
#include <set>

#include "decompose/decompose_ring_attention.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/placement.h"
#include "meshfuse/ir/printer.h"

namespace meshfuse {
namespace {

// A `set` whose operand and output are sharded differently: a communication.
bool isResharding(const Expr* e) {
  if (e->kind() != OpKind::Set) return false;
  const auto* in = static_cast<const TensorView*>(e->input(size_t{0}));
  const TensorView* out = e->output();
  if (in->mesh() == nullptr || out->mesh() == nullptr) return false;
  return *in->mesh() != *out->mesh() || placementsOf(in) != placementsOf(out);
}

Segment::Kind kindOf(const Expr* e) {
  const OpCategory c = e->info().category;
  if (c == OpCategory::Gemm || c == OpCategory::Attention) return Segment::Kind::Gemm;
  return isResharding(e) ? Segment::Kind::Communication : Segment::Kind::Kernel;
}

bool sameMesh(const TensorView* a, const TensorView* b) {
  if (a->mesh() == nullptr || b->mesh() == nullptr) return a->mesh() == b->mesh();
  return *a->mesh() == *b->mesh();
}

class Segmenter {
 public:
  explicit Segmenter(const Fusion& f) : f_(f) {
    for (size_t i = 0; i < f.exprs().size(); ++i) position_[f.exprs()[i]] = i;
  }

  std::vector<Segment> run() {
    for (const Expr* e : f_.exprs()) {
      if (const int64_t partner = attentionPartner(e); partner >= 0) {
        groups_[partner].exprs.push_back(e);  // e comes later in program order
        group_of_[e] = partner;
        continue;
      }
      const int64_t g = static_cast<int64_t>(groups_.size());
      groups_.push_back({kindOf(e), {e}});
      group_of_[e] = g;
      if (e->info().category == OpCategory::Gemm) absorbTransposes(g, e);
      if (groups_[g].kind != Segment::Kind::Kernel) continue;
      // Join the first producer kernel it can, then pull the other producer kernels in.
      int64_t home = g;
      for (int64_t p : producerGroups(e))
        if (home == g && canMerge(p, g)) home = merge(p, g);
      for (int64_t p : producerGroups(e))
        if (p != home && canMerge(home, p)) merge(home, p);
    }
    return ordered();
  }

 private:
  struct Group {
    Segment::Kind kind;
    std::vector<const Expr*> exprs;  // program order
    bool alive = true;
  };

  // The group of an sdpa (sdpa_lse) visited before `e`, an sdpa_lse (sdpa) of the same query, key
  // and attributes, alone in its group: the log-sum-exp is a by-product of the output's online
  // softmax, so one kernel returns both. -1 when there is none.
  int64_t attentionPartner(const Expr* e) const {
    auto forward = [](const Expr* x) { return x->kind() == OpKind::Sdpa || x->kind() == OpKind::SdpaLse; };
    if (e->kind() == OpKind::SdpaGrad) return gradientPartner(e);
    if (!forward(e)) return -1;
    const auto* q = static_cast<const TensorView*>(e->input(size_t{0}));
    for (const Expr* u : q->uses()) {
      auto it = group_of_.find(u);
      if (it == group_of_.end() || u->kind() == e->kind() || !forward(u)) continue;
      const Group& g = groups_[it->second];
      if (!g.alive || g.exprs.size() != 1 || u->input(size_t{0}) != q || u->input(size_t{1}) != e->input(size_t{1}) ||
          u->attr<bool>("is_causal") != e->attr<bool>("is_causal") ||
          u->attr<double>("scale") != e->attr<double>("scale") || !sameMesh(u->output(), e->output()) ||
          streamSplitOf(u->output()).has_value() != streamSplitOf(e->output()).has_value())
        continue;
      return it->second;
    }
    return -1;
  }

  // The group of the key's (value's) gradient visited before `e`, the value's (key's) gradient
  // of the same attention (keyValueGradientPair), alone in its group: one kernel computes both
  // from one P. -1 when there is none, and for the query's gradient.
  int64_t gradientPartner(const Expr* e) const {
    for (const Expr* u : e->input(size_t{0})->uses()) {
      auto it = group_of_.find(u);
      if (it == group_of_.end() || !keyValueGradientPair(u, e)) continue;
      const Group& g = groups_[it->second];
      if (g.alive && g.exprs.size() == 1 && sameMesh(u->output(), e->output()) &&
          placementsOf(u->output()) == placementsOf(e->output()) &&
          streamSplitOf(u->output()).has_value() == streamSplitOf(e->output()).has_value())
        return it->second;
    }
    return -1;
  }

  // A permute that swaps the last two dims of a GEMM operand and that nothing else reads joins the
  // GEMM's segment, out of the kernel it was fused into if any: the GEMM reads its operand
  // transposed, no copy (autodiff's weight gradients are matmuls of such transposes).
  // (Not for GEMMs that overlap lowering chunks: it launches the GEMM segment on row blocks.)
  void absorbTransposes(int64_t g, const Expr* gemm) {
    auto overlapped = [](const Expr* e) {
      return e && e->kind() == OpKind::Set && e->attr<std::string>("overlap") != "none";
    };
    for (const Val* v : gemm->inputs())
      if (v && overlapped(v->definition())) return;
    for (const Expr* u : gemm->output()->uses())
      if (overlapped(u)) return;
    const bool linear = gemm->kind() == OpKind::Linear;
    // A GEMM on stream chunks of its rows launches on row blocks of operand 0 likewise.
    const bool row_chunks = streamSplitOf(gemm->output()).has_value();
    for (size_t i = 0; i < 2; ++i) {
      if (i == 0 && row_chunks) continue;
      const auto* tv = static_cast<const TensorView*>(gemm->input(i));
      const Expr* p = tv->definition();
      if (p == nullptr || p->kind() != OpKind::Permute) continue;
      if (linear && tv->rank() != 2) continue;  // a linear's rows are its input's leading dims, flattened
      std::vector<int64_t> perm = p->attr<std::vector<int64_t>>("dims");
      const int64_t r = static_cast<int64_t>(perm.size());
      for (int64_t& d : perm) d = d < 0 ? d + r : d;
      bool swap = r >= 2 && perm[r - 2] == r - 1 && perm[r - 1] == r - 2;
      for (int64_t d = 0; d + 2 < r; ++d) swap &= perm[d] == d;
      const auto& uses = tv->uses();
      const bool only_here = !f_.isOutput(tv) &&
                             std::all_of(uses.begin(), uses.end(), [&](const Expr* u) { return u == gemm; }) &&
                             std::count(gemm->inputs().begin(), gemm->inputs().end(), tv) == 1;
      if (!swap || !only_here || !sameMesh(tv, gemm->output()) ||
          streamSplitOf(tv).has_value() != streamSplitOf(gemm->output()).has_value())
        continue;
      // Out of its kernel, fused with its producers or alone: nothing else there reads it, so the
      // kernel stays closed (it stores the permute's operand instead, in its own layout).
      Group& home = groups_[group_of_.at(p)];
      home.exprs.erase(std::find(home.exprs.begin(), home.exprs.end(), p));
      home.alive = !home.exprs.empty();
      groups_[g].exprs.insert(groups_[g].exprs.begin(), p);
      group_of_[p] = g;
    }
    inProgramOrder(groups_[g].exprs);
  }

  void inProgramOrder(std::vector<const Expr*>& exprs) const {
    std::sort(exprs.begin(), exprs.end(),
              [&](const Expr* a, const Expr* b) { return position_.at(a) < position_.at(b); });
  }

  // Kernel groups that define an operand of `e`, in operand order, without repeats.
  std::vector<int64_t> producerGroups(const Expr* e) const {
    std::vector<int64_t> out;
    for (const Val* v : e->inputs()) {
      if (v == nullptr || v->definition() == nullptr) continue;
      int64_t g = group_of_.at(v->definition());
      if (groups_[g].kind == Segment::Kind::Kernel && std::find(out.begin(), out.end(), g) == out.end() &&
          g != group_of_.at(e))
        out.push_back(g);
    }
    return out;
  }

  // Groups reading a value of group `g` (other than g). Ops not visited yet are in no group.
  std::set<int64_t> consumers(int64_t g) const {
    std::set<int64_t> out;
    for (const Expr* e : groups_[g].exprs)
      for (const TensorView* o : e->outputs())
        for (const Expr* u : o->uses())
          if (auto it = group_of_.find(u); it != group_of_.end() && it->second != g) out.insert(it->second);
    return out;
  }

  // Whether some path from `from` reaches `to` through a third group.
  bool reachesIndirectly(int64_t from, int64_t to) const {
    std::vector<int64_t> stack;
    std::set<int64_t> seen;
    for (int64_t c : consumers(from))
      if (c != to) stack.push_back(c);
    while (!stack.empty()) {
      int64_t g = stack.back();
      stack.pop_back();
      if (!seen.insert(g).second) continue;
      for (int64_t c : consumers(g)) {
        if (c == to) return true;
        stack.push_back(c);
      }
    }
    return false;
  }

  bool canMerge(int64_t a, int64_t b) const {
    const Group &ga = groups_[a], &gb = groups_[b];
    if (ga.kind != Segment::Kind::Kernel || gb.kind != Segment::Kind::Kernel) return false;
    const TensorView* x = ga.exprs[0]->output();
    const TensorView* y = gb.exprs[0]->output();
    if (!sameMesh(x, y) || streamSplitOf(x).has_value() != streamSplitOf(y).has_value()) return false;
    return !reachesIndirectly(a, b) && !reachesIndirectly(b, a);
  }

  // Moves group `from` into `into`; returns `into`.
  int64_t merge(int64_t into, int64_t from) {
    Group& g = groups_[into];
    for (const Expr* e : groups_[from].exprs) {
      g.exprs.push_back(e);
      group_of_[e] = into;
    }
    inProgramOrder(g.exprs);
    groups_[from].alive = false;
    groups_[from].exprs.clear();
    return into;
  }

  // Live groups in dependency order, the earliest-created ready group first.
  std::vector<Segment> ordered() const {
    std::map<int64_t, int64_t> waiting;  // group -> producers not yet placed
    for (size_t g = 0; g < groups_.size(); ++g) {
      if (!groups_[g].alive) continue;
      waiting.emplace(g, 0);
    }
    for (const auto& [g, n] : waiting)
      for (int64_t c : consumers(g)) ++waiting[c];
    std::set<int64_t> ready;
    for (const auto& [g, n] : waiting)
      if (n == 0) ready.insert(g);
    std::vector<Segment> out;
    while (!ready.empty()) {
      int64_t g = *ready.begin();
      ready.erase(ready.begin());
      out.push_back(toSegment(groups_[g]));
      for (int64_t c : consumers(g))
        if (--waiting[c] == 0) ready.insert(c);
    }
    MF_CHECK(out.size() == waiting.size(), "segments depend on each other in a cycle");
    return out;
  }

  Segment toSegment(const Group& g) const {
    Segment s;
    s.kind = g.kind;
    s.exprs = g.exprs;
    auto inside = [&](const Expr* e) { return std::find(g.exprs.begin(), g.exprs.end(), e) != g.exprs.end(); };
    for (const Expr* e : g.exprs) {
      for (const Val* v : e->inputs()) {
        if (v == nullptr || v->valKind() != ValKind::TensorView || (v->definition() && inside(v->definition())))
          continue;
        const auto* tv = static_cast<const TensorView*>(v);
        if (std::find(s.inputs.begin(), s.inputs.end(), tv) == s.inputs.end()) s.inputs.push_back(tv);
      }
      for (const TensorView* o : e->outputs()) {
        const auto& uses = o->uses();
        if (f_.isOutput(o) || uses.empty() || !std::all_of(uses.begin(), uses.end(), inside)) s.outputs.push_back(o);
      }
    }
    return s;
  }

  const Fusion& f_;
  std::vector<Group> groups_;
  std::map<const Expr*, int64_t> group_of_;
  std::map<const Expr*, size_t> position_;  // in program order
};

}  // namespace

const char* segmentKindName(Segment::Kind k) {
  switch (k) {
    case Segment::Kind::Kernel: return "kernel";
    case Segment::Kind::Gemm: return "gemm";
    case Segment::Kind::Communication: return "comm";
  }
  return "?";
}

std::vector<Segment> segmentFusion(const Fusion& f) { return Segmenter(f).run(); }

std::string printSegments(const Fusion& f, const std::vector<Segment>& segments) {
  std::string s = "segments {\n";
  auto names = [&](const std::vector<const TensorView*>& tvs) {
    std::vector<std::string> n;
    for (const TensorView* tv : tvs) n.push_back(f.displayName(tv));
    return fmt::format("{}", fmt::join(n, ", "));
  };
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& seg = segments[i];
    std::vector<std::string> ops;
    for (const Expr* e : seg.exprs) ops.push_back(std::string(e->name()));
    s += fmt::format("  {} #{} ({}) -> ({}): {}\n", segmentKindName(seg.kind), i, names(seg.inputs), names(seg.outputs),
                     fmt::join(ops, ", "));
  }
  return s + "}\n";
}

}  // namespace meshfuse

