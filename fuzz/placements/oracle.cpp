// The exhaustive minimum-bytes search (oracle.h). Placements are small ints: kRep, kPar, or a
// shard dim >= 0.
#include "oracle.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <set>

namespace meshfuse::placement_fuzz {
namespace {

constexpr int kRep = -2, kPar = -1;
constexpr int64_t kNever = std::numeric_limits<int64_t>::max() / 4;
// A plan's cost: moves of parameters first, bytes second (bytes stay far below this).
constexpr int64_t kWeightMove = int64_t{1} << 40;

std::string name(int p) { return p == kRep ? "Replicate()" : p == kPar ? "Partial()" : fmt::format("Shard({})", p); }

struct Rule {
  std::vector<int> in;  // one per operand
  int out;
};

// What a case's tensors look like to the search.
struct Problem {
  const CaseSpec& c;
  int64_t n;
  std::vector<std::vector<int64_t>> ext;  // per tensor
  std::vector<int64_t> bytes;             // per tensor, global f32 bytes
  std::vector<bool> weight;               // per tensor: an input that is a GEMM's weight operand

  bool uneven;                            // torch.chunk's blocks allowed (else a shard divides evenly)

  bool shardable(int t, int d) const {
    return d >= 0 && d < static_cast<int>(ext[t].size()) && (uneven || ext[t][d] % n == 0);
  }
  // Wire bytes (all ranks, times n: see oracle.h) to turn placement `from` of tensor t into `to`.
  // Summed over the ranks, what each sends depends on the whole tensor only (B = its bytes; each
  // rank's block b_r, summing to B): an allgather sends each block to n-1 ranks, (n-1) B; a
  // reduce-scatter or all-to-all (n-1)/n of what each holds, (n-1) B and (n-1) B / n; uneven
  // blocks included, as meshfuse's report of each rank's block counts them.
  int64_t conversion(int t, int from, int to) const {
    if (from == to) return 0;
    if (to != kRep && to != kPar && !shardable(t, to)) return kNever;
    if (from == kRep) return 0;  // slice locally; Partial: the value on one rank, zeros elsewhere
    const int64_t b = bytes[t];
    if (from == kPar) {
      if (to == kPar) return 0;
      return (to == kRep ? 2 : 1) * n * (n - 1) * b;  // allreduce, reduce-scatter
    }
    if (to == kPar) return kNever;
    return to == kRep ? n * (n - 1) * b : (n - 1) * b;  // allgather, all-to-all
  }
  // The elements one rank holds of tensor t placed `q`: the largest of torch.chunk's blocks (a
  // pending sum holds the whole value).
  int64_t local(int t, int q) const {
    int64_t e = 1;
    for (int d = 0; d < static_cast<int>(ext[t].size()); ++d) e *= d == q ? (ext[t][d] + n - 1) / n : ext[t][d];
    return e;
  }
  // torch.chunk's block sizes of an extent over the n ranks.
  std::vector<int64_t> blocks(int64_t extent) const {
    const int64_t size = (extent + n - 1) / n;
    std::vector<int64_t> out;
    for (int64_t r = 0, left = extent; r < n; ++r, left -= std::min(left, size)) out.push_back(std::min(left, size));
    return out;
  }
  // The cheapest way to give tensor t every placement in `need`, starting from `own`: each one
  // converted from the best placement available so far (all orders tried; `need` is tiny).
  // `collectives` (optional) gets how many of the conversions send anything.
  int64_t conversions(int t, int own, std::vector<int> need, std::vector<std::string>* how,
                      int64_t* collectives = nullptr) const {
    need.erase(std::remove(need.begin(), need.end(), own), need.end());
    std::sort(need.begin(), need.end());
    need.erase(std::unique(need.begin(), need.end()), need.end());
    int64_t best = kNever;
    int64_t best_count = 0;
    std::vector<int> best_order;
    do {
      std::vector<int> have = {own};
      int64_t cost = 0, count = 0;
      for (int q : need) {
        int64_t step = kNever;
        for (int a : have) step = std::min(step, conversion(t, a, q));
        cost = std::min(kNever, cost + step);
        count += step > 0 ? 1 : 0;
        have.push_back(q);
      }
      if (cost < best || (cost == best && count < best_count)) best = cost, best_order = need, best_count = count;
    } while (std::next_permutation(need.begin(), need.end()));
    if (collectives) *collectives += best_count;
    if (how && best < kNever) {
      std::vector<int> have = {own};
      for (int q : best_order) {
        int from = have[0];
        for (int a : have)
          if (conversion(t, a, q) < conversion(t, from, q)) from = a;
        how->push_back(fmt::format("    %t{} {} -> {}: sends {:.1f} bytes", t, name(from), name(q),
                                   static_cast<double>(conversion(t, from, q)) / static_cast<double>(n)));
        have.push_back(q);
      }
    }
    return best;
  }
};

std::vector<Rule> pointwiseRules(int rank, int operands, bool keeps_partial) {
  std::vector<Rule> rules;
  for (int d = 0; d < rank; ++d) rules.push_back({std::vector<int>(operands, d), d});
  if (keeps_partial) rules.push_back({std::vector<int>(operands, kPar), kPar});
  return rules;
}

// Shard(d) -> Shard(d) for every d but `except` (softmax, norms, max: a dim the op reads whole).
std::vector<Rule> allDimsBut(int rank, int except) {
  std::vector<Rule> rules;
  for (int d = 0; d < rank; ++d)
    if (d != except) rules.push_back({{d}, d});
  return rules;
}

// For reshape: rank r of the input holds, within each block of the dims before d, a contiguous
// run of the rest: its block of d times what the dims after d hold. The output dim e is sharded
// the same way iff the dims before it hold the same number of elements and every rank's run is
// the same on both sides (even blocks: e divides by n; uneven: block by block).
std::vector<Rule> reshapeRules(const Problem& p, int in, int out) {
  std::vector<Rule> rules = {{{kPar}, kPar}};
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
      if (product(xo, 0, e) != before_in || xo[e] <= 1 || !p.shardable(out, e)) continue;
      const int64_t inner_out = product(xo, e + 1, xo.size());
      const std::vector<int64_t> bi = p.blocks(xi[d]), bo = p.blocks(xo[e]);
      bool lined_up = true;
      for (size_t r = 0; r < bi.size(); ++r) lined_up = lined_up && bi[r] * inner_in == bo[r] * inner_out;
      if (lined_up) rules.push_back({{d}, e});
    }
  }
  return rules;
}

std::vector<Rule> rulesFor(const Problem& p, const OpSpec& op, int out) {
  const int x = op.operands.at(0);
  const int rank = static_cast<int>(p.ext[x].size());
  std::vector<Rule> rules;
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
    case FuzzOp::Reshape: rules = reshapeRules(p, x, out); break;
    case FuzzOp::Softmax: rules = allDimsBut(rank, a); break;
    case FuzzOp::LayerNorm:
    case FuzzOp::RmsNorm: rules = allDimsBut(rank, rank - 1); break;
    case FuzzOp::Sdpa: rules = {{{0, 0, 0}, 0}, {{1, 1, 1}, 1}}; break;  // batch, heads
  }
  rules.push_back({std::vector<int>(op.operands.size(), kRep), kRep});
  // Only placements the tensors can take (a shard divides evenly).
  std::vector<Rule> ok;
  for (const Rule& r : rules) {
    bool fits = r.out < 0 || p.shardable(out, r.out);
    for (size_t i = 0; i < r.in.size(); ++i) fits = fits && (r.in[i] < 0 || p.shardable(op.operands[i], r.in[i]));
    if (fits) ok.push_back(r);
  }
  return ok;
}

// One plan's measures: what it is ranked by (parameter moves, then bytes: `rank`) and what it is
// bounded by (collectives and work per rank, at most meshfuse's).
struct Cost {
  int64_t rank = kNever;  // kWeightMove per parameter move, plus the bytes (times n)
  int64_t collectives = 0;
  int64_t work = 0;
};

struct Search {
  const Problem& p;
  PlanBounds bounds;
  std::vector<std::vector<Rule>> rules;  // per op
  std::vector<size_t> choice, best_choice, free_choice;
  Cost best, free;  // the best plan within the bounds, and the best of all

  int64_t local(int t, int q) const { return p.local(t, q); }

  // The measures of one choice of rules; `how` (optional) gets the plan's description.
  Cost cost(const std::vector<size_t>& pick, std::vector<std::string>* how) const {
    const CaseSpec& c = p.c;
    const int inputs = static_cast<int>(c.input_shapes.size());
    std::vector<int> placement(c.numTensors());
    std::vector<std::vector<int>> need(c.numTensors());
    Cost out;
    out.rank = 0;
    for (int t = 0; t < inputs; ++t) {
      const Placement& q = c.input_placements[t][0];
      placement[t] = q.kind == Placement::Shard ? static_cast<int>(q.dim) : q.kind == Placement::Partial ? kPar : kRep;
    }
    for (size_t i = 0; i < c.ops.size(); ++i) {
      const Rule& r = rules[i][pick[i]];
      const int result = inputs + static_cast<int>(i);
      placement[result] = r.out;
      out.work += local(result, r.out);
      for (size_t k = 0; k < r.in.size(); ++k) {
        need[c.ops[i].operands[k]].push_back(r.in[k]);
        out.work += local(c.ops[i].operands[k], r.in[k]);
      }
    }
    for (size_t k = 0; k < c.outputs.size(); ++k) {
      const int t = c.outputs[k];
      if (!c.output_pins[k].empty()) {
        const Placement& q = c.output_pins[k][0];
        need[t].push_back(q.kind == Placement::Shard ? static_cast<int>(q.dim) : q.kind == Placement::Partial ? kPar : kRep);
      } else if (placement[t] == kPar) {
        // Materialized as the cheapest of Replicate or a Shard.
        int best_q = kRep;
        for (int d = 0; d < static_cast<int>(p.ext[t].size()); ++d) {
          std::vector<int> with = need[t];
          with.push_back(d);
          std::vector<int> with_best = need[t];
          with_best.push_back(best_q);
          if (p.conversions(t, kPar, with, nullptr) < p.conversions(t, kPar, with_best, nullptr)) best_q = d;
        }
        need[t].push_back(best_q);
      }
    }
    for (int t = 0; t < c.numTensors(); ++t) {
      if (how) how->push_back(fmt::format("  %t{}: {}", t, name(placement[t])));
      const int64_t bytes = p.conversions(t, placement[t], need[t], how, &out.collectives);
      if (bytes >= kNever) return Cost{};
      // A parameter's move weighs more than any number of bytes (meshfuse's documented priority).
      if (bytes > 0 && p.weight[t]) out.rank += kWeightMove;
      out.rank += bytes;
    }
    return out;
  }

  void run(size_t op) {
    if (op == rules.size()) {
      const Cost c = cost(choice, nullptr);
      if (c.rank < free.rank) free = c, free_choice = choice;
      if (c.rank < best.rank && c.collectives <= bounds.collectives && c.work <= bounds.work)
        best = c, best_choice = choice;
      return;
    }
    for (size_t r = 0; r < rules[op].size(); ++r) {
      choice[op] = r;
      run(op + 1);
    }
  }
};

}  // namespace

OraclePlan minimumBytes(const CaseSpec& c, const PlanBounds& bounds, int64_t max_plans) {
  OraclePlan plan;
  if (c.mesh_shape.size() != 1) {
    plan.why_not = "the oracle models 1-D meshes only";
    return plan;
  }
  Problem p{c, c.mesh_shape[0], {}, {}, {}, !evenlyPlaced(c)};
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
  Search search{p, bounds, {}, std::vector<size_t>(c.ops.size()), {}, {}, {}, {}};
  int64_t plans = 1;
  for (size_t i = 0; i < c.ops.size(); ++i) {
    search.rules.push_back(rulesFor(p, c.ops[i], static_cast<int>(c.input_shapes.size() + i)));
    plans *= static_cast<int64_t>(search.rules.back().size());
    if (plans > max_plans) {
      plan.why_not = fmt::format("more than {} plans to search", max_plans);
      return plan;
    }
  }
  search.run(0);
  if (search.free.rank >= kNever) {
    plan.why_not = "no plan within the oracle's rules";  // e.g. a Shard pin on a dim it cannot shard
    return plan;
  }
  plan.n = p.n;
  plan.bytes_only_min_times_n = p.n == 1 ? 0 : search.free.rank % kWeightMove;
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
  plan.min_wire_times_n = p.n == 1 ? 0 : search.best.rank % kWeightMove;
  plan.weight_moves = search.best.rank / kWeightMove;
  plan.collectives = search.best.collectives;
  plan.work = search.best.work;
  search.cost(search.best_choice, &plan.lines);
  return plan;
}

int64_t wireBytesTimesN(CommKind kind, int64_t in_bytes, int64_t n) {
  switch (kind) {
    case CommKind::Allgather: return n * (n - 1) * in_bytes;  // its block to each of n-1 others
    case CommKind::Allreduce: return 2 * (n - 1) * in_bytes;  // reduce-scatter, then allgather
    case CommKind::ReduceScatter:
    case CommKind::AllToAll: return (n - 1) * in_bytes;  // all but its own n-th
    default: return n * (n - 1) * in_bytes;  // (not drawn on 1-D meshes: counted as an allgather)
  }
}

std::string compareWithOracle(const OraclePlan& oracle, int64_t plan_wire_times_n) {
  if (!oracle.applicable || plan_wire_times_n <= oracle.min_wire_times_n) return "";
  const auto n = static_cast<double>(oracle.n);
  return fmt::format("meshfuse's plan sends {:.1f} bytes; the oracle's sends {:.1f}", plan_wire_times_n / n,
                     oracle.min_wire_times_n / n);
}

}  // namespace meshfuse::placement_fuzz
