// The random case generator: a seeded, platform-independent draw (splitmix64, no <random>
// distributions, whose results differ between standard libraries) of ops, shapes and placements.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "case_spec.h"

namespace meshfuse::placement_fuzz {
namespace {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  int64_t pick(int64_t n) { return n <= 1 ? 0 : static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
  bool chance(int percent) { return pick(100) < percent; }

 private:
  uint64_t state_;
};

struct Builder {
  CaseSpec c;
  std::vector<Shape> shapes;  // of every tensor so far
  Rng rng;
  int uneven = 0;  // percent of shard draws that may pick a dim the mesh axis does not divide

  int newSlot() {
    static const int64_t menu[] = {2, 3, 4, 6, 8, 2, 4, 6, 12};
    static const int64_t uneven_menu[] = {2, 3, 4, 5, 6, 7, 8, 3, 12};  // odd sizes for 2 and 4 ranks
    c.slots.push_back(uneven > 0 ? uneven_menu[rng.pick(std::size(uneven_menu))] : menu[rng.pick(std::size(menu))]);
    return static_cast<int>(c.slots.size() - 1);
  }
  Shape freshShape(int64_t rank) {
    Shape s;
    for (int64_t i = 0; i < rank; ++i) s.push_back({newSlot()});
    return s;
  }
  // A random placement per mesh axis for a tensor of `shape`; shards where they divide evenly,
  // except that `uneven` percent of the draws take the dims the axis does not divide (torch.chunk's
  // blocks, empty ones included). Partial only where allowed. (With uneven = 0 no extra number is drawn: seeds name the same cases as
  // before uneven draws existed, so known failures keep their names.)
  std::vector<Placement> placements(const Shape& shape, bool allow_partial) {
    std::vector<int64_t> ext = extents(c, shape), split(shape.size(), 1);
    std::vector<Placement> ps;
    for (int64_t m : c.mesh_shape) {
      int64_t r = rng.pick(100);
      // An uneven draw takes the dims the axis does not divide (where there are any).
      const bool uneven_draw = uneven > 0 && rng.chance(uneven);
      std::vector<int64_t> dims, odd;
      for (size_t d = 0; d < ext.size(); ++d)
        (ext[d] % (split[d] * m) == 0 ? dims : odd).push_back(static_cast<int64_t>(d));
      if (uneven_draw && !odd.empty()) dims = odd;
      if (r >= 35 && r < 80 && !dims.empty()) {
        int64_t d = dims[rng.pick(static_cast<int64_t>(dims.size()))];
        split[d] *= m;
        ps.push_back(Placement::shard(d));
      } else if (r >= 80 && allow_partial) {
        ps.push_back(Placement::partial());
      } else {
        ps.push_back(Placement::replicate());
      }
    }
    return ps;
  }
  int addInput(const Shape& shape) {
    c.input_shapes.push_back(shape);
    c.input_placements.push_back(placements(shape, /*allow_partial=*/true));
    // Inputs come first: shift every op operand and output id by one.
    for (OpSpec& op : c.ops)
      for (int& o : op.operands) o += o >= static_cast<int>(c.input_shapes.size()) - 1 ? 1 : 0;
    shapes.insert(shapes.begin() + static_cast<int64_t>(c.input_shapes.size()) - 1, shape);
    return static_cast<int>(c.input_shapes.size()) - 1;
  }
  // A tensor of the same shape as `t`: an existing one sometimes, else a new input.
  int sameShape(int t) {
    std::vector<int> same;
    for (int u = 0; u < static_cast<int>(shapes.size()); ++u)
      if (shapes[u] == shapes[t]) same.push_back(u);
    if (rng.chance(50)) return same[rng.pick(static_cast<int64_t>(same.size()))];
    return addInput(shapes[t]);
  }
  // Whether tensor t sums to about zero along its last dim (a layer_norm's result, and what
  // sign changes, scalings, sums and reorderings make of it): a sum or mean of it is rounding
  // noise, which the one tolerance (relative to the output's magnitude) cannot judge.
  bool zeroMean(int t) const {
    const int inputs = static_cast<int>(c.input_shapes.size());
    if (t < inputs) return false;
    const OpSpec& op = c.ops[t - inputs];
    switch (op.kind) {
      case FuzzOp::LayerNorm: return true;
      case FuzzOp::Neg:
      case FuzzOp::Tanh:
      case FuzzOp::RmsNorm:
      case FuzzOp::Permute:
      case FuzzOp::Reshape: return zeroMean(op.operands[0]);
      case FuzzOp::Add:
      case FuzzOp::Mul: return zeroMean(op.operands[0]) || zeroMean(op.operands[1]);
      default: return false;
    }
  }
  // Whether tensor t is the same number everywhere: a sum of a softmax over its own axis (ones),
  // and what pointwise ops and reorderings make of it. Its layer_norm divides rounding noise by
  // sqrt(eps) (s2-w3-u40-c123: 3.8e-5 where the f64 reference is exactly 0).
  bool constant(int t) const {
    const int inputs = static_cast<int>(c.input_shapes.size());
    if (t < inputs) return false;
    const OpSpec& op = c.ops[t - inputs];
    switch (op.kind) {
      case FuzzOp::Sum: {
        const int x = op.operands[0];
        if (x < inputs) return false;
        const OpSpec& def = c.ops[x - inputs];
        return def.kind == FuzzOp::Softmax && def.axis == op.axis;
      }
      case FuzzOp::Neg:
      case FuzzOp::Tanh:
      case FuzzOp::Exp:
      case FuzzOp::Relu:
      case FuzzOp::Permute:
      case FuzzOp::Reshape:
      case FuzzOp::Mean:
      case FuzzOp::Softmax:  // (of a constant: 1/n everywhere, s1-w4-c473)
      case FuzzOp::Max: return constant(op.operands[0]);
      case FuzzOp::Add:
      case FuzzOp::Mul: return constant(op.operands[0]) && constant(op.operands[1]);
      default: return false;
    }
  }
  // Whether tensor t is an exponential of the inputs (an exp, and what ops that do not bound it
  // make of it). Its exp is ill-conditioned: exp(exp(x)) reaches 1e31 for x of a few units, and
  // the inner exp's f32 rounding, amplified by the outer one, exceeds the one tolerance relative
  // to the output (s1-w4-c173: exp(exp(sum(x))), replicated, no collective at all).
  bool exponential(int t) const {
    const int inputs = static_cast<int>(c.input_shapes.size());
    if (t < inputs) return false;
    const OpSpec& op = c.ops[t - inputs];
    switch (op.kind) {
      case FuzzOp::Exp: return true;
      case FuzzOp::Tanh:
      case FuzzOp::Softmax:
      case FuzzOp::LayerNorm:
      case FuzzOp::RmsNorm: return false;  // bounded
      default:
        return std::any_of(op.operands.begin(), op.operands.end(), [&](int x) { return exponential(x); });
    }
  }
  // A tensor id taken before a call that may have added an input (which shifts the ids of op
  // results by one), made valid again.
  int keep(int id, size_t inputs_before) const {
    return c.input_shapes.size() > inputs_before && id >= static_cast<int>(inputs_before) ? id + 1 : id;
  }
};

std::vector<int64_t> randomPermutation(Rng& rng, int64_t n) {
  std::vector<int64_t> p(n);
  std::iota(p.begin(), p.end(), 0);
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[i], p[rng.pick(i + 1)]);
  return p;
}

// A reshape of `s`: merge two neighbouring dims, split a merged dim back, insert or drop a 1.
std::optional<Shape> randomReshape(Rng& rng, const Shape& s) {
  Shape out = s;
  int64_t i = rng.pick(static_cast<int64_t>(s.size()));
  switch (rng.pick(4)) {
    case 0:
      if (i + 1 >= static_cast<int64_t>(s.size())) return std::nullopt;
      out[i].insert(out[i].end(), out[i + 1].begin(), out[i + 1].end());
      out.erase(out.begin() + i + 1);
      return out;
    case 1:
      if (s[i].size() < 2) return std::nullopt;
      out[i] = Dim(s[i].begin() + 1, s[i].end());
      out.insert(out.begin() + i, Dim{s[i][0]});
      return out;
    case 2: out.insert(out.begin() + rng.pick(static_cast<int64_t>(s.size()) + 1), Dim{}); return out;
    default:
      if (!s[i].empty() || s.size() < 2) return std::nullopt;
      out.erase(out.begin() + i);
      return out;
  }
}

// One op on `x` (a tensor id), or nullopt when the drawn kind does not apply to it.
std::optional<OpSpec> drawOp(Builder& b, int x) {
  // linear, sum and add are listed twice: they make and consume the Partial values that most
  // resharding decisions are about.
  static const FuzzOp kinds[] = {FuzzOp::Exp,    FuzzOp::Tanh,    FuzzOp::Relu,      FuzzOp::Neg,     FuzzOp::Add,
                                 FuzzOp::Mul,    FuzzOp::Sum,     FuzzOp::Mean,      FuzzOp::Max,     FuzzOp::Linear,
                                 FuzzOp::Matmul, FuzzOp::Permute, FuzzOp::Reshape,   FuzzOp::Softmax, FuzzOp::LayerNorm,
                                 FuzzOp::RmsNorm, FuzzOp::Sdpa,   FuzzOp::Linear,    FuzzOp::Sum,     FuzzOp::Add};
  OpSpec op;
  op.kind = kinds[b.rng.pick(std::size(kinds))];
  const Shape s = b.shapes[x];
  const auto rank = static_cast<int64_t>(s.size());
  switch (op.kind) {
    case FuzzOp::Add:
    case FuzzOp::Mul: {
      const size_t before = b.c.input_shapes.size();
      const int y = b.sameShape(x);
      op.operands = {b.keep(x, before), y};
      return op;
    }
    case FuzzOp::Sum:
    case FuzzOp::Mean:
      if (b.zeroMean(x)) return std::nullopt;
      [[fallthrough]];
    case FuzzOp::Max:
      if (rank < 2) return std::nullopt;
      op.axis = b.rng.pick(rank);
      op.operands = {x};
      return op;
    case FuzzOp::Linear:
      if (rank < 2 || rank > 3) return std::nullopt;
      op.operands = {x, b.addInput({{b.newSlot()}, s.back()})};
      op.operands[0] = x < static_cast<int>(b.c.input_shapes.size()) - 1 ? x : x + 1;
      return op;
    case FuzzOp::Matmul:
      if (rank != 2) return std::nullopt;
      op.operands = {x, b.addInput({s.back(), {b.newSlot()}})};
      op.operands[0] = x < static_cast<int>(b.c.input_shapes.size()) - 1 ? x : x + 1;
      return op;
    case FuzzOp::Permute:
      if (rank < 2) return std::nullopt;
      op.perm = randomPermutation(b.rng, rank);
      op.operands = {x};
      return op;
    case FuzzOp::Reshape: {
      std::optional<Shape> to = randomReshape(b.rng, s);
      if (!to) return std::nullopt;
      op.new_shape = *to;
      op.operands = {x};
      return op;
    }
    case FuzzOp::Softmax: op.axis = b.rng.pick(rank); [[fallthrough]];
    case FuzzOp::LayerNorm:
      if (extents(b.c, s).back() < 4 || (op.kind == FuzzOp::LayerNorm && b.constant(x))) return std::nullopt;
      [[fallthrough]];
    case FuzzOp::RmsNorm: op.operands = {x}; return op;
    case FuzzOp::Sdpa:
      if (rank != 4) return std::nullopt;
    {
      size_t before = b.c.input_shapes.size();
      int k = b.sameShape(x);
      x = b.keep(x, before);
      before = b.c.input_shapes.size();
      const int v = b.sameShape(x);
      op.operands = {b.keep(x, before), b.keep(k, before), v};
      return op;
    }
    case FuzzOp::Exp:
      if (b.exponential(x)) return std::nullopt;
      op.operands = {x};
      return op;
    default: op.operands = {x}; return op;  // pointwise unary
  }
}

}  // namespace

CaseSpec generateCase(uint64_t seed, int64_t index, int64_t world, int max_ops, int uneven) {
  Builder b{CaseSpec{}, {}, Rng(seed * 0x100000001B3ull + static_cast<uint64_t>(world) * 7919 + index), uneven};
  b.c.name = uneven > 0 ? fmt::format("s{}-w{}-u{}-c{}", seed, world, uneven, index)
                        : fmt::format("s{}-w{}-c{}", seed, world, index);
  b.c.mesh_shape = world == 4 && b.rng.chance(40) ? std::vector<int64_t>{2, 2} : std::vector<int64_t>{world};
  static const int64_t ranks[] = {2, 2, 2, 3, 3, 4};
  b.addInput(b.freshShape(ranks[b.rng.pick(std::size(ranks))]));
  const int64_t n_ops = 1 + b.rng.pick(max_ops);
  for (int64_t tries = 0; static_cast<int64_t>(b.c.ops.size()) < n_ops && tries < 50; ++tries) {
    // Mostly chain on the newest tensor, sometimes branch from an older one.
    const int x = b.rng.chance(65) ? static_cast<int>(b.shapes.size()) - 1 : static_cast<int>(b.rng.pick(b.shapes.size()));
    std::optional<OpSpec> op = drawOp(b, x);
    if (!op) continue;
    b.c.ops.push_back(*op);
    b.shapes = shapesOf(b.c);
  }
  // Every result that nothing reads is an output (no dead code: programs compute what they
  // return), and sometimes one that is also read.
  const int first_op = static_cast<int>(b.c.input_shapes.size());
  std::vector<bool> read(b.c.numTensors(), false);
  for (const OpSpec& op : b.c.ops)
    for (int o : op.operands) read[o] = true;
  for (int t = first_op; t < b.c.numTensors(); ++t)
    if (!read[t]) b.c.outputs.push_back(t);
  const int extra = first_op + static_cast<int>(b.rng.pick(b.c.numTensors() - first_op));
  if (read[extra] && b.rng.chance(25)) b.c.outputs.push_back(extra);
  for (int out : b.c.outputs)
    b.c.output_pins.push_back(b.rng.chance(30) ? b.placements(b.shapes[out], /*allow_partial=*/false)
                                               : std::vector<Placement>{});
  return b.c;
}

}  // namespace meshfuse::placement_fuzz
