// The exhaustive minimum-bytes search (oracle.h). A tensor's placement is one small int per mesh
// axis: kRep, kPar, or a shard dim >= 0.
#include "oracle.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <limits>
#include <map>
#include <tuple>

namespace meshfuse::placement_fuzz {
namespace {

constexpr int kRep = -2, kPar = -1;
constexpr int kMaxAxes = 2;
constexpr int64_t kNever = std::numeric_limits<int64_t>::max() / 4;
// A plan's cost: moves of parameters first, bytes second (bytes stay far below this).
constexpr int64_t kWeightMove = int64_t{1} << 40;

// One placement per mesh axis (axes past the mesh's are Replicate).
struct Pl {
  std::array<int, kMaxAxes> q{kRep, kRep};
  bool operator==(const Pl& o) const { return q == o.q; }
  bool operator<(const Pl& o) const { return q < o.q; }
};

std::string name1(int p) { return p == kRep ? "Replicate()" : p == kPar ? "Partial()" : fmt::format("Shard({})", p); }

struct Rule {
  std::vector<Pl> in;  // one per operand
  Pl out;
};

// A one-axis rule, before the axes are combined.
struct Rule1 {
  std::vector<int> in;
  int out;
};

// What a case's tensors look like to the search.
struct Problem {
  const CaseSpec& c;
  std::vector<int64_t> mesh;              // the mesh's axes
  int64_t size = 1;                       // the mesh's devices, N
  std::vector<std::vector<int64_t>> ext;  // per tensor
  std::vector<int64_t> bytes;             // per tensor, global f32 bytes
  std::vector<bool> weight;               // per tensor: an input that is a GEMM's weight operand
  bool uneven = false;                    // torch.chunk's blocks allowed
  // Per tensor, between every two of its placements: the best way (its wire bytes over all ranks,
  // times N, see oracle.h; how many collectives it takes; the step it starts with, for the
  // plan's description), the best being the fewest bytes or, in the second table, the fewest
  // collectives (on a 2-D mesh they may differ: reduce-scattering before an allreduce sends less,
  // in more collectives). A plan may take either for each tensor.
  struct Moves {
    int states = 0;
    std::vector<int64_t> cost;
    std::vector<int64_t> count;
    std::vector<int> next;
  };
  enum Mode { kFewestBytes = 0, kFewestCollectives = 1 };
  std::vector<std::array<Moves, 2>> moves;
  // conversions()'s answers (bytes, collectives) by (tensor, own placement, needs as a sorted
  // set, mode): the search asks the same ones at many nodes, and a tensor with many consumers
  // has many orders to try.
  using ConversionKey = std::tuple<int, Pl, std::vector<Pl>, int>;
  mutable std::map<ConversionKey, std::pair<int64_t, int64_t>> conversions_seen;

  int axes() const { return static_cast<int>(mesh.size()); }
  std::string name(const Pl& p) const {
    if (axes() == 1) return name1(p.q[0]);
    return fmt::format("[{}, {}]", name1(p.q[0]), name1(p.q[1]));
  }
  // The ranks among which dim d of a tensor placed p is split.
  int64_t splits(const Pl& p, int d) const {
    int64_t s = 1;
    for (int a = 0; a < axes(); ++a) s *= p.q[a] == d ? mesh[a] : 1;
    return s;
  }
  bool valid(int t, const Pl& p) const {
    for (int a = 0; a < axes(); ++a)
      if (p.q[a] >= static_cast<int>(ext[t].size())) return false;
    for (int d = 0; d < static_cast<int>(ext[t].size()); ++d)
      if (!uneven && ext[t][d] % splits(p, d) != 0) return false;
    return true;
  }
  // Placements are numbered per tensor: (q0 + 2) + (rank + 2) (q1 + 2).
  int index(int t, const Pl& p) const {
    const int w = static_cast<int>(ext[t].size()) + 2;
    return (p.q[0] + 2) + (axes() > 1 ? w * (p.q[1] + 2) : 0);
  }
  Pl placementOf(int t, int i) const {
    const int w = static_cast<int>(ext[t].size()) + 2;
    Pl p;
    p.q[0] = i % w - 2;
    if (axes() > 1) p.q[1] = i / w - 2;
    return p;
  }

  // One step on mesh axis a from `from` to `to` (which differ on axis a only): what the teams of
  // that axis send, summed over the ranks, times N; kNever where no single collective or local
  // slice does it. A step that changes a dim's split on axis a is one only where no inner axis
  // splits that dim too (see resharding_steps.h: the blocks would interleave). Each team holds
  // B / s of the tensor, s being what the other axes shard; for a team of m: an allgather sends
  // each block to m-1 ranks, (m-1) B/s; a reduce-scatter (m-1) B/s; an allreduce twice that; an
  // all-to-all (m-1) B/(s m). Uneven blocks count as even ones (oracle.h).
  int64_t step(int t, const Pl& from, const Pl& to, int a) const {
    const int f = from.q[a], g = to.q[a];
    if (f == g) return 0;
    for (int k = a + 1; k < axes(); ++k)
      if ((f >= 0 && from.q[k] == f) || (g >= 0 && from.q[k] == g)) return kNever;
    if (f == kRep) return 0;  // slice locally; Partial: the value on one rank, zeros elsewhere
    if (g == kPar) return kNever;
    const int64_t m = mesh[a];
    int64_t s = 1;
    for (int k = 0; k < axes(); ++k) s *= k != a && from.q[k] >= 0 ? mesh[k] : 1;
    const int64_t all = (size / m) * size * (m - 1) * bytes[t];  // (teams) (times N) (m - 1) B
    if (f == kPar) return (g == kRep ? 2 : 1) * all / s;        // allreduce, reduce-scatter
    return g == kRep ? all / s : all / (s * m);                  // allgather, all-to-all
  }

  // All placements' best moves between each other, through one-axis steps (Floyd-Warshall on a
  // few dozen placements), by bytes then collectives or by collectives then bytes.
  Moves allMoves(int t, Mode mode) const {
    Moves mv;
    const int w = static_cast<int>(ext[t].size()) + 2;
    mv.states = axes() > 1 ? w * w : w;
    const int s = mv.states;
    mv.cost.assign(static_cast<size_t>(s * s), kNever);
    mv.count.assign(static_cast<size_t>(s * s), 0);
    mv.next.assign(static_cast<size_t>(s * s), -1);
    for (int i = 0; i < s; ++i) {
      const Pl a = placementOf(t, i);
      if (!valid(t, a)) continue;
      mv.cost[i * s + i] = 0, mv.next[i * s + i] = i;
      for (int ax = 0; ax < axes(); ++ax)
        for (int v = kRep; v < static_cast<int>(ext[t].size()); ++v) {
          Pl b = a;
          b.q[ax] = v;
          if (b == a || !valid(t, b)) continue;
          const int j = index(t, b);
          const int64_t c = step(t, a, b, ax);
          if (better(mode, c, c > 0 ? 1 : 0, mv.cost[i * s + j], mv.count[i * s + j]))
            mv.cost[i * s + j] = c, mv.count[i * s + j] = c > 0 ? 1 : 0, mv.next[i * s + j] = j;
        }
    }
    for (int k = 0; k < s; ++k)
      for (int i = 0; i < s; ++i)
        for (int j = 0; j < s; ++j) {
          const int64_t ik = mv.cost[i * s + k], kj = mv.cost[k * s + j];
          if (ik >= kNever || kj >= kNever) continue;
          const int64_t c = ik + kj, n = mv.count[i * s + k] + mv.count[k * s + j];
          if (better(mode, c, n, mv.cost[i * s + j], mv.count[i * s + j]))
            mv.cost[i * s + j] = c, mv.count[i * s + j] = n, mv.next[i * s + j] = mv.next[i * s + k];
        }
    return mv;
  }

  static bool better(Mode mode, int64_t cost, int64_t count, int64_t than_cost, int64_t than_count) {
    if (cost >= kNever) return false;
    if (than_cost >= kNever) return true;
    return mode == kFewestBytes ? std::pair(cost, count) < std::pair(than_cost, than_count)
                                : std::pair(count, cost) < std::pair(than_count, than_cost);
  }

  int64_t conversion(int t, const Pl& from, const Pl& to, Mode mode, int64_t* collectives = nullptr) const {
    if (!valid(t, from) || !valid(t, to)) return kNever;
    const Moves& mv = moves[t][mode];
    const int i = index(t, from) * mv.states + index(t, to);
    if (collectives) *collectives = mv.count[i];
    return mv.cost[i];
  }

  // The elements one rank holds of tensor t placed `p`: the largest of torch.chunk's blocks (a
  // pending sum holds the whole value).
  int64_t local(int t, const Pl& p) const {
    int64_t e = 1;
    for (int d = 0; d < static_cast<int>(ext[t].size()); ++d) {
      const int64_t k = splits(p, d);
      e *= (ext[t][d] + k - 1) / k;
    }
    return e;
  }
  // torch.chunk's block sizes of an extent over the n ranks.
  static std::vector<int64_t> blocks(int64_t extent, int64_t n) {
    const int64_t size = (extent + n - 1) / n;
    std::vector<int64_t> out;
    for (int64_t r = 0, left = extent; r < n; ++r, left -= std::min(left, size)) out.push_back(std::min(left, size));
    return out;
  }
  // The best way (by `mode`) to give tensor t every placement in `need`, starting from `own`:
  // each one converted from the best placement available so far (all orders tried; `need` is
  // tiny). Returns its bytes; `collectives` (optional) gets how many collectives it takes.
  int64_t conversions(int t, const Pl& own, std::vector<Pl> need, Mode mode, std::vector<std::string>* how,
                      int64_t* collectives = nullptr) const {
    need.erase(std::remove(need.begin(), need.end(), own), need.end());
    std::sort(need.begin(), need.end());
    need.erase(std::unique(need.begin(), need.end()), need.end());
    ConversionKey key{t, own, need, mode};
    if (!how) {
      const auto seen = conversions_seen.find(key);
      if (seen != conversions_seen.end()) {
        if (collectives) *collectives += seen->second.second;
        return seen->second.first;
      }
    }
    int64_t best = kNever;
    int64_t best_count = 0;
    std::vector<Pl> best_order;
    do {
      std::vector<Pl> have = {own};
      int64_t cost = 0, count = 0;
      for (const Pl& q : need) {
        int64_t step_cost = kNever, step_count = 0;
        for (const Pl& a : have) {
          int64_t k = 0;
          const int64_t c = conversion(t, a, q, mode, &k);
          if (better(mode, c, k, step_cost, step_count)) step_cost = c, step_count = k;
        }
        cost = std::min(kNever, cost + step_cost);
        count += step_count;
        have.push_back(q);
      }
      if (better(mode, cost, count, best, best_count)) best = cost, best_order = need, best_count = count;
    } while (std::next_permutation(need.begin(), need.end()));
    conversions_seen.emplace(std::move(key), std::pair(best, best_count));
    if (collectives) *collectives += best_count;
    if (how && best < kNever) {
      std::vector<Pl> have = {own};
      for (const Pl& q : best_order) {
        Pl from = have[0];
        for (const Pl& a : have) {
          int64_t a_count = 0, from_count = 0;
          const int64_t a_cost = conversion(t, a, q, mode, &a_count);
          const int64_t from_cost = conversion(t, from, q, mode, &from_count);
          if (better(mode, a_cost, a_count, from_cost, from_count)) from = a;
        }
        describe(t, from, q, mode, how);
        have.push_back(q);
      }
    }
    return best;
  }
  // Each step of the cheapest move from `from` to `to`, a line each.
  void describe(int t, const Pl& from, const Pl& to, Mode mode, std::vector<std::string>* how) const {
    const Moves& mv = moves[t][mode];
    const int goal = index(t, to);
    for (int i = index(t, from); i != goal;) {
      const int j = mv.next[i * mv.states + goal];
      const int64_t c = mv.cost[i * mv.states + j];
      how->push_back(fmt::format("    %t{} {} -> {}: sends {:.1f} bytes", t, name(placementOf(t, i)),
                                 name(placementOf(t, j)), static_cast<double>(c) / static_cast<double>(size)));
      i = j;
    }
  }
};

std::vector<Rule1> pointwiseRules(int rank, int operands, bool keeps_partial) {
  std::vector<Rule1> rules;
  for (int d = 0; d < rank; ++d) rules.push_back({std::vector<int>(operands, d), d});
  if (keeps_partial) rules.push_back({std::vector<int>(operands, kPar), kPar});
  return rules;
}

// Shard(d) -> Shard(d) for every d but `except` (softmax, norms, max: a dim the op reads whole).
std::vector<Rule1> allDimsBut(int rank, int except) {
  std::vector<Rule1> rules;
  for (int d = 0; d < rank; ++d)
    if (d != except) rules.push_back({{d}, d});
  return rules;
}

// For reshape, on one axis of n ranks: rank r of the input holds, within each block of the dims
// before d, a contiguous run of the rest: its block of d times what the dims after d hold. The
// output dim e is sharded the same way iff the dims before it hold the same number of elements
// and every rank's run is the same on both sides (even blocks: e divides by n; uneven: block by
// block).
std::vector<Rule1> reshapeRules(const Problem& p, int in, int out, int64_t n) {
  std::vector<Rule1> rules = {{{kPar}, kPar}};
  auto product = [](const std::vector<int64_t>& x, size_t from, size_t to) {
    int64_t v = 1;
    for (size_t i = from; i < to; ++i) v *= x[i];
    return v;
  };
  const std::vector<int64_t>& xi = p.ext[in];
  const std::vector<int64_t>& xo = p.ext[out];
  for (int d = 0; d < static_cast<int>(xi.size()); ++d) {
    const int64_t before_in = product(xi, 0, d), inner_in = product(xi, d + 1, xi.size());
    for (int e = 0; e < static_cast<int>(xo.size()); ++e) {
      if (product(xo, 0, e) != before_in || xo[e] <= 1) continue;
      const int64_t inner_out = product(xo, e + 1, xo.size());
      const std::vector<int64_t> bi = Problem::blocks(xi[d], n), bo = Problem::blocks(xo[e], n);
      bool lined_up = true;
      for (size_t r = 0; r < bi.size(); ++r) lined_up = lined_up && bi[r] * inner_in == bo[r] * inner_out;
      if (lined_up) rules.push_back({{d}, e});
    }
  }
  return rules;
}

// The rules of `op` on one mesh axis of n ranks.
std::vector<Rule1> axisRules(const Problem& p, const OpSpec& op, int out, int64_t n) {
  const int x = op.operands.at(0);
  const int rank = static_cast<int>(p.ext[x].size());
  std::vector<Rule1> rules;
  const int a = static_cast<int>(op.axis);
  switch (op.kind) {
    case FuzzOp::Exp:
    case FuzzOp::Tanh:
    case FuzzOp::Relu: rules = pointwiseRules(rank, 1, false); break;
    case FuzzOp::Neg: rules = pointwiseRules(rank, 1, true); break;
    case FuzzOp::Add: rules = pointwiseRules(rank, 2, true); break;
    case FuzzOp::Mul:
      rules = pointwiseRules(rank, 2, false);
      rules.push_back({{kPar, kRep}, kPar});
      rules.push_back({{kRep, kPar}, kPar});
      break;
    case FuzzOp::Sum:
    case FuzzOp::Mean:
    case FuzzOp::Max:
      for (int d = 0; d < rank; ++d)
        if (d != a) rules.push_back({{d}, d - (d > a)});
      if (op.kind != FuzzOp::Max) rules.push_back({{a}, kPar}), rules.push_back({{kPar}, kPar});
      break;
    case FuzzOp::Linear:  // x [..., k] w [m, k] -> [..., m]
      for (int d = 0; d + 1 < rank; ++d) rules.push_back({{d, kRep}, d});
      rules.push_back({{kRep, 0}, rank - 1});
      rules.push_back({{rank - 1, 1}, kPar});
      rules.push_back({{kPar, kRep}, kPar});
      rules.push_back({{kRep, kPar}, kPar});
      break;
    case FuzzOp::Matmul:  // a [m, k] b [k, m'] -> [m, m']
      rules = {{{0, kRep}, 0}, {{kRep, 1}, 1}, {{1, 0}, kPar}, {{kPar, kRep}, kPar}, {{kRep, kPar}, kPar}};
      break;
    case FuzzOp::Permute:
      for (int j = 0; j < rank; ++j) rules.push_back({{static_cast<int>(op.perm[j])}, j});
      rules.push_back({{kPar}, kPar});
      break;
    case FuzzOp::Reshape: rules = reshapeRules(p, x, out, n); break;
    case FuzzOp::Softmax: rules = allDimsBut(rank, a); break;
    case FuzzOp::LayerNorm:
    case FuzzOp::RmsNorm: rules = allDimsBut(rank, rank - 1); break;
    case FuzzOp::Sdpa: rules = {{{0, 0, 0}, 0}, {{1, 1, 1}, 1}}; break;  // batch, heads
  }
  rules.push_back({std::vector<int>(op.operands.size(), kRep), kRep});
  return rules;
}

// The rules of `op` on the whole mesh: one axis rule per mesh axis (DTensor's strategies are
// combined the same way), keeping the placements the tensors can take. A reshape keeps two
// axes' splits only on different dims, in the same order on both sides (a dim split by both
// axes is converted first: the oracle does not model nested splits through reshapes).
std::vector<Rule> rulesFor(const Problem& p, const OpSpec& op, int out) {
  std::vector<std::vector<Rule1>> per_axis;
  for (int64_t n : p.mesh) per_axis.push_back(axisRules(p, op, out, n));
  std::vector<Rule> rules;
  auto keep = [&](const Rule& r) {
    bool fits = p.valid(out, r.out);
    for (size_t i = 0; i < r.in.size(); ++i) fits = fits && p.valid(op.operands[i], r.in[i]);
    if (fits && op.kind == FuzzOp::Reshape && p.axes() > 1) {
      const int d0 = r.in[0].q[0], d1 = r.in[0].q[1], e0 = r.out.q[0], e1 = r.out.q[1];
      if (d0 >= 0 && d1 >= 0) fits = d0 != d1 && e0 != e1 && (d0 < d1) == (e0 < e1);
    }
    if (fits) rules.push_back(r);
  };
  if (p.axes() == 1) {
    for (const Rule1& r : per_axis[0]) {
      Rule c;
      for (int q : r.in) c.in.push_back(Pl{{q, kRep}});
      c.out = Pl{{r.out, kRep}};
      keep(c);
    }
    return rules;
  }
  for (const Rule1& r0 : per_axis[0])
    for (const Rule1& r1 : per_axis[1]) {
      Rule c;
      for (size_t i = 0; i < r0.in.size(); ++i) c.in.push_back(Pl{{r0.in[i], r1.in[i]}});
      c.out = Pl{{r0.out, r1.out}};
      keep(c);
    }
  return rules;
}

Pl fromPlacements(const std::vector<Placement>& ps) {
  Pl p;
  for (size_t a = 0; a < ps.size() && a < kMaxAxes; ++a)
    p.q[a] = ps[a].kind == Placement::Shard ? static_cast<int>(ps[a].dim) : ps[a].kind == Placement::Partial ? kPar : kRep;
  return p;
}

// One plan's measures: what it is ranked by (parameter moves, then bytes: `rank`; ties go to
// fewer collectives, then less work) and what it is bounded by (collectives and work per rank, at
// most meshfuse's).
struct Cost {
  int64_t rank = kNever;  // kWeightMove per parameter move, plus the bytes (times N)
  int64_t collectives = 0;
  int64_t work = 0;
  bool operator<(const Cost& o) const {
    return std::tie(rank, collectives, work) < std::tie(o.rank, o.collectives, o.work);
  }
};

// A depth-first search over one rule per op, in program order, and for each tensor whose moves
// can be had in fewer bytes or in fewer collectives, over both. A tensor's conversions are known
// once its last consumer's rule is chosen, so each partial plan has measures that only grow, and
// a branch that cannot beat the plans found so far is cut.
struct Search {
  using Mode = Problem::Mode;
  const Problem& p;
  PlanBounds bounds;
  int64_t budget;  // partial plans to visit at most
  std::vector<std::vector<Rule>> rules;  // per op
  std::vector<std::vector<int>> closed;  // per op: the tensors whose conversions it settles
  std::vector<int> closed_first;         // the tensors settled before any op (no consumer)
  std::vector<size_t> choice;            // per op: its rule
  std::vector<Mode> mode;                // per tensor: how its conversions are chosen
  std::vector<size_t> best_choice;
  std::vector<Mode> best_mode;
  std::vector<Pl> placement;
  std::vector<std::vector<Pl>> need;
  std::vector<bool> pinned;  // per tensor: an output with a pin (in `need` from the start)
  Cost best, free;  // the best plan within the bounds, and the best of all
  int64_t visited = 0;

  Search(const Problem& problem, const PlanBounds& b, int64_t max_plans) : p(problem), bounds(b), budget(max_plans) {
    const CaseSpec& c = p.c;
    const int inputs = static_cast<int>(c.input_shapes.size());
    placement.resize(c.numTensors());
    need.resize(c.numTensors());
    pinned.assign(c.numTensors(), false);
    mode.assign(c.numTensors(), Problem::kFewestBytes);
    for (int t = 0; t < inputs; ++t) placement[t] = fromPlacements(c.input_placements[t]);
    for (size_t k = 0; k < c.outputs.size(); ++k)
      if (!c.output_pins[k].empty()) need[c.outputs[k]].push_back(fromPlacements(c.output_pins[k])), pinned[c.outputs[k]] = true;
    std::vector<int> last(c.numTensors());
    for (int t = 0; t < c.numTensors(); ++t) last[t] = t - inputs;  // its producer (< 0: an input)
    for (size_t i = 0; i < c.ops.size(); ++i)
      for (int o : c.ops[i].operands) last[o] = std::max(last[o], static_cast<int>(i));
    closed.resize(c.ops.size());
    for (int t = 0; t < c.numTensors(); ++t) (last[t] < 0 ? closed_first : closed[last[t]]).push_back(t);
    choice.resize(c.ops.size());
    for (size_t i = 0; i < c.ops.size(); ++i) rules.push_back(rulesFor(p, c.ops[i], inputs + static_cast<int>(i)));
  }

  bool hasPartial(const Pl& q) const { return std::find(q.q.begin(), q.q.begin() + p.axes(), kPar) != q.q.begin() + p.axes(); }

  // What tensor t's conversions (chosen by `m`) add to a plan, its placement and needs being set;
  // `how` (optional) gets them described. Returns false when the plan cannot convert it.
  bool settle(int t, Mode m, Cost& into, std::vector<std::string>* how) const {
    std::vector<Pl> needs = need[t];
    if (!pinned[t] && hasPartial(placement[t]) &&
        std::find(p.c.outputs.begin(), p.c.outputs.end(), t) != p.c.outputs.end()) {
      // An unpinned output that is a pending sum is materialized as the cheapest placement
      // without Partial.
      int64_t cheapest = kNever;
      Pl pick;
      for (int i = 0; i < p.moves[t][m].states; ++i) {
        const Pl q = p.placementOf(t, i);
        if (hasPartial(q)) continue;
        std::vector<Pl> with = need[t];
        with.push_back(q);
        const int64_t c = p.conversions(t, placement[t], with, m, nullptr);
        if (c < cheapest) cheapest = c, pick = q;
      }
      needs.push_back(pick);
    }
    if (how) how->push_back(fmt::format("  %t{}: {}", t, p.name(placement[t])));
    const int64_t bytes = p.conversions(t, placement[t], needs, m, how, &into.collectives);
    if (bytes >= kNever) return false;
    // A parameter's move weighs more than any number of bytes (meshfuse's documented priority).
    if (bytes > 0 && p.weight[t]) into.rank += kWeightMove;
    into.rank += bytes;
    return true;
  }

  bool exceeds(const Cost& c) const { return c.collectives > bounds.collectives || c.work > bounds.work; }

  // Settles the tensors `ts` from the k-th on, each both ways where the two differ, then goes on
  // to op `op`.
  void settleThenRun(const std::vector<int>& ts, size_t k, size_t op, const Cost& so_far) {
    if (k == ts.size()) return run(op, so_far);
    const int t = ts[k];
    Cost by_bytes = so_far, by_collectives = so_far;
    const bool bytes_ok = settle(t, Problem::kFewestBytes, by_bytes, nullptr);
    const bool collectives_ok = settle(t, Problem::kFewestCollectives, by_collectives, nullptr);
    if (bytes_ok) mode[t] = Problem::kFewestBytes, settleThenRun(ts, k + 1, op, by_bytes);
    if (collectives_ok && (!bytes_ok || by_collectives.collectives < by_bytes.collectives))
      mode[t] = Problem::kFewestCollectives, settleThenRun(ts, k + 1, op, by_collectives);
    mode[t] = Problem::kFewestBytes;
  }

  void run(size_t op, const Cost& so_far) {
    if (++visited > budget) return;
    // Cut a branch that can improve neither the best plan within the bounds nor the best of all
    // (every measure only grows along a branch, and free <= best).
    if (!(so_far < best) || (!(so_far < free) && exceeds(so_far))) return;
    if (op == rules.size()) {
      if (so_far < free) free = so_far;
      if (so_far < best && !exceeds(so_far)) best = so_far, best_choice = choice, best_mode = mode;
      return;
    }
    const CaseSpec& c = p.c;
    const int result = static_cast<int>(c.input_shapes.size() + op);
    for (size_t r = 0; r < rules[op].size(); ++r) {
      const Rule& rule = rules[op][r];
      choice[op] = r;
      Cost next = so_far;
      placement[result] = rule.out;
      next.work += p.local(result, rule.out);
      for (size_t k = 0; k < rule.in.size(); ++k) {
        need[c.ops[op].operands[k]].push_back(rule.in[k]);
        next.work += p.local(c.ops[op].operands[k], rule.in[k]);
      }
      settleThenRun(closed[op], 0, op + 1, next);
      for (size_t k = rule.in.size(); k-- > 0;) need[c.ops[op].operands[k]].pop_back();
    }
  }

  // The best plan within the bounds, described tensor by tensor.
  std::vector<std::string> describeBest() {
    const CaseSpec& c = p.c;
    const int inputs = static_cast<int>(c.input_shapes.size());
    for (size_t i = 0; i < c.ops.size(); ++i) {
      const Rule& r = rules[i][best_choice[i]];
      placement[inputs + i] = r.out;
      for (size_t k = 0; k < r.in.size(); ++k) need[c.ops[i].operands[k]].push_back(r.in[k]);
    }
    std::vector<std::string> lines;
    Cost ignored;
    ignored.rank = 0;
    for (int t = 0; t < c.numTensors(); ++t) settle(t, best_mode[t], ignored, &lines);
    return lines;
  }
};

}  // namespace

OraclePlan minimumBytes(const CaseSpec& c, const PlanBounds& bounds, int64_t max_plans) {
  OraclePlan plan;
  if (c.mesh_shape.empty() || c.mesh_shape.size() > kMaxAxes) {
    plan.why_not = fmt::format("the oracle models meshes of 1 or {} axes", kMaxAxes);
    return plan;
  }
  Problem p{c, c.mesh_shape, c.meshSize(), {}, {}, {}, !evenlyPlaced(c), {}, {}};
  for (const Shape& s : shapesOf(c)) {
    p.ext.push_back(extents(c, s));
    int64_t numel = 1;
    for (int64_t e : p.ext.back()) numel *= e;
    p.bytes.push_back(4 * numel);
  }
  p.weight.assign(c.numTensors(), false);
  for (const OpSpec& op : c.ops)
    if ((op.kind == FuzzOp::Linear || op.kind == FuzzOp::Matmul) && op.operands[1] < static_cast<int>(c.input_shapes.size()))
      p.weight[op.operands[1]] = true;
  for (int t = 0; t < c.numTensors(); ++t)
    p.moves.push_back({p.allMoves(t, Problem::kFewestBytes), p.allMoves(t, Problem::kFewestCollectives)});
  Search search(p, bounds, max_plans);
  Cost start;
  start.rank = 0;
  search.settleThenRun(search.closed_first, 0, 0, start);
  if (search.visited > max_plans) {
    plan.why_not = fmt::format("more than {} partial plans to search", max_plans);
    return plan;
  }
  if (search.free.rank >= kNever) {
    plan.why_not = "no plan within the oracle's rules";  // e.g. a Shard pin on a dim it cannot shard
    return plan;
  }
  plan.n = p.size;
  plan.bytes_only_min_times_n = p.size == 1 ? 0 : search.free.rank % kWeightMove;
  plan.bytes_only_collectives = search.free.collectives;
  plan.bytes_only_work = search.free.work;
  if (search.best.rank >= kNever) {
    // meshfuse's plan is outside the rules' reach in collectives or work (not a finding: the
    // oracle has nothing to compare it with).
    plan.why_not = fmt::format("no plan of the oracle's rules has at most {} collectives and {} elements of work per rank",
                               bounds.collectives, bounds.work);
    return plan;
  }
  plan.applicable = true;
  plan.min_wire_times_n = p.size == 1 ? 0 : search.best.rank % kWeightMove;
  plan.weight_moves = search.best.rank / kWeightMove;
  plan.collectives = search.best.collectives;
  plan.work = search.best.work;
  plan.lines = search.describeBest();
  return plan;
}

int64_t wireBytesTimesN(CommKind kind, int64_t in_bytes, int64_t team, int64_t mesh_size) {
  const int64_t m = team, scale = mesh_size / team;
  switch (kind) {
    case CommKind::Allgather: return scale * m * (m - 1) * in_bytes;  // its block to each of m-1 others
    case CommKind::Allreduce: return scale * 2 * (m - 1) * in_bytes;  // reduce-scatter, then allgather
    case CommKind::ReduceScatter:
    case CommKind::AllToAll: return scale * (m - 1) * in_bytes;  // all but its own m-th
    default: return scale * m * (m - 1) * in_bytes;  // (not drawn: counted as an allgather)
  }
}

std::string compareWithOracle(const OraclePlan& oracle, int64_t plan_wire_times_n) {
  if (!oracle.applicable || plan_wire_times_n <= oracle.min_wire_times_n) return "";
  const auto n = static_cast<double>(oracle.n);
  return fmt::format("meshfuse's plan sends {:.1f} bytes; the oracle's sends {:.1f}", plan_wire_times_n / n,
                     oracle.min_wire_times_n / n);
}

}  // namespace meshfuse::placement_fuzz
