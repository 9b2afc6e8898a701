// Fuzz target `compile_plan`: compile() and each rank's plan for random small programs, shapes,
// meshes and placements. The input bytes are decoded (Decoder) into
//   - one or two device meshes (1-D or 2-D, up to 4 devices each; the second one a later
//     pipeline stage or an overlapping set of devices),
//   - 1-3 inputs: rank 1-4, extents from a menu (including the symbolic ?t), a dtype, and
//     placements on a mesh (Shard(d) / Replicate / Partial per axis), sometimes a Stream split,
//   - up to 8 ops from a fixed menu, operands drawn from the tensors so far, some outputs pinned
//     (schedule API: placements or a Stream split),
//   - the outputs, the pipeline options (overlap none/collective/ring, chunks, streams, FSDP) and
//     bindings of the symbolic sizes.
// An op or placement that the builder rejects (UserError) is skipped, so that most inputs still
// compile something. Then: compile() with every stage kept; the kept fusion stages must reparse
// to the same text; for every rank of the meshes, programForRank, its printed form and, with every
// size bound, its collectives, peak memory and kernel IR (dumpKernels). The collectives of the
// ranks of one team must agree in order, kind and root (or the program would hang at run time).
// A UserError anywhere is a pass; anything else is a finding (fuzz_target.h).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "fuzz_target.h"
#include "lower/host_ir.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/ir/placement.h"
#include "meshfuse/ir/printer.h"
#include "meshfuse/ops.h"
#include "codegen/kernel_dump.h"
#include "lower/pipeline.h"

namespace meshfuse::fuzz {
namespace {

// The decoder: every choice takes the next byte(s) of the input, modulo the number of options;
// an exhausted input reads as zeros (the first option), so every input decodes to a program.
class Decoder {
 public:
  Decoder(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  int64_t pick(int64_t n) {
    if (n <= 1) return 0;
    uint64_t v = 0;
    for (int64_t range = n - 1; range > 0; range >>= 8) v = (v << 8) | (pos_ < size_ ? data_[pos_++] : 0);
    return static_cast<int64_t>(v % static_cast<uint64_t>(n));
  }
  bool chance(int percent) { return pick(100) < percent; }
  bool exhausted() const { return pos_ >= size_; }
  template <typename T>
  const T& from(const std::vector<T>& menu) {
    return menu[pick(static_cast<int64_t>(menu.size()))];
  }

 private:
  const uint8_t* data_;
  size_t size_, pos_ = 0;
};

struct Program {
  std::unique_ptr<Fusion> fusion = std::make_unique<Fusion>();
  std::vector<DeviceMesh> meshes;
  std::vector<TensorView*> pool;  // every tensor built so far (operands of later ops)
  PipelineOptions options;
};

DeviceMesh decodeMesh(Decoder& d, int64_t first_device) {
  static const std::vector<std::vector<int64_t>> shapes = {{1}, {2}, {3}, {4}, {2, 2}, {1, 2}, {2, 1}};
  std::vector<int64_t> shape = d.from(shapes);
  std::vector<int64_t> devices(std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>()));
  std::iota(devices.begin(), devices.end(), first_device);
  if (d.chance(10)) std::reverse(devices.begin(), devices.end());
  return DeviceMesh(devices, shape);
}

std::vector<Placement> decodePlacements(Decoder& d, const DeviceMesh& mesh, int64_t rank) {
  std::vector<Placement> ps;
  for (int64_t axis = 0; axis < mesh.rank(); ++axis) {
    int64_t k = d.pick(4);
    if (k == 0) ps.push_back(Placement::replicate());
    if (k == 1 || k == 2) ps.push_back(Placement::shard(d.pick(2 * rank + 1) - rank));  // out of range too
    if (k == 3) ps.push_back(Placement::partial());
  }
  return ps;
}

// Places `tv` on one of the meshes (placements, sometimes a Stream split), as a user pin would.
void decodeLayout(Decoder& d, Program& p, TensorView* tv) {
  const DeviceMesh& mesh = d.from(p.meshes);
  try {
    applyPlacements(tv, mesh, decodePlacements(d, mesh, tv->rank()));
    if (d.chance(15)) applyStreamSplit(tv, {d.pick(tv->rank()), 1 + d.pick(4)});
  } catch (const UserError&) {
    // Left as it is: the builder said why it refuses (wrong dim, uneven split, ...).
  }
}

std::vector<int64_t> somePermutation(Decoder& d, int64_t n) {
  std::vector<int64_t> dims(n);
  std::iota(dims.begin(), dims.end(), 0);
  for (int64_t i = n - 1; i > 0; --i) std::swap(dims[i], dims[d.pick(i + 1)]);
  return dims;
}

std::vector<int64_t> staticShape(const TensorView* tv) {
  std::vector<int64_t> shape;
  for (const Extent& e : tv->shape()) shape.push_back(e.isStatic() ? e.value() : -1);
  return shape;
}

// One op from the menu, on operands drawn from the pool.
TensorView* decodeOp(Decoder& d, Program& p) {
  auto operand = [&] { return d.from(p.pool); };
  auto dim = [&](TensorView* x) { return d.pick(2 * x->rank() + 1) - x->rank(); };  // -rank..rank
  TensorView* x = operand();
  switch (d.pick(16)) {
    case 0: {
      using Unary = TensorView* (*)(TensorView*);
      static const std::vector<Unary> unary = {ops::neg,  ops::exp,     ops::relu, ops::silu,
                                               ops::tanh, ops::sigmoid, ops::rsqrt, ops::log};
      return d.from(unary)(x);
    }
    case 1: return ops::gelu(x, d.chance(50) ? "tanh" : "none");
    case 2: {
      ops::Operand y = d.chance(25) ? ops::Operand(0.5) : ops::Operand(operand());
      switch (d.pick(5)) {
        case 0: return ops::add(x, y);
        case 1: return ops::sub(x, y);
        case 2: return ops::mul(x, y);
        case 3: return ops::div(x, y);
        default: return ops::maximum(x, y);
      }
    }
    case 3: return ops::where(ops::gt(x, 0.0), x, operand());
    case 4: return ops::cast(x, d.from(std::vector<DataType>{DataType::Float, DataType::BFloat16, DataType::Half}));
    case 5: {
      std::vector<int64_t> dims = {dim(x)};
      if (d.chance(30)) dims.push_back(dim(x));
      bool keepdim = d.chance(30);
      switch (d.pick(3)) {
        case 0: return ops::sum(x, dims, keepdim);
        case 1: return ops::max(x, dims, keepdim);
        default: return ops::mean(x, dims, keepdim);
      }
    }
    case 6: return ops::linear(x, operand(), d.chance(30) ? operand() : nullptr);
    case 7: return ops::matmul(x, operand());
    case 8: return ops::permute(x, somePermutation(d, x->rank()));
    case 9: {
      // Merge two neighbouring dims, split one by a factor, or a shape from the menu.
      std::vector<int64_t> shape = staticShape(x);
      int64_t i = d.pick(std::max<int64_t>(x->rank(), 1));
      if (d.chance(40) && i + 1 < x->rank() && shape[i] > 0 && shape[i + 1] > 0) {
        shape[i] *= shape[i + 1];
        shape.erase(shape.begin() + i + 1);
      } else if (d.chance(60) && i < x->rank() && shape[i] > 0) {
        int64_t f = 1 + d.pick(4);
        shape[i] /= f;
        shape.insert(shape.begin() + i, f);
      } else {
        shape.resize(1 + d.pick(3));
        for (int64_t& s : shape) s = d.from(std::vector<int64_t>{-1, 1, 2, 4, 8, 16});
      }
      return ops::reshape(x, shape);
    }
    case 10: {
      std::vector<int64_t> shape = staticShape(x), bdims(x->rank());
      int64_t at = d.pick(x->rank() + 1);
      for (int64_t i = 0; i < x->rank(); ++i) bdims[i] = i < at ? i : i + 1;
      shape.insert(shape.begin() + at, d.from(std::vector<int64_t>{1, 2, 4}));
      return ops::broadcastInDim(x, shape, bdims);
    }
    case 11: {
      std::vector<int64_t> starts, ends;
      for (int64_t s : staticShape(x)) {
        int64_t n = s > 0 ? s : 8;
        starts.push_back(d.pick(n + 1));
        ends.push_back(starts.back() + d.pick(n + 2 - starts.back()));
      }
      return ops::slice(x, starts, ends);
    }
    case 12: return ops::cat({x, operand()}, dim(x));
    case 13: return ops::softmax(x, dim(x));
    case 14:
      if (d.chance(50)) return ops::layerNorm(x, d.chance(50) ? operand() : nullptr, d.chance(50) ? operand() : nullptr);
      return ops::rmsNorm(x, d.chance(50) ? operand() : nullptr);
    default:
      if (d.chance(60)) return ops::set(x);
      return ops::sdpa(x, operand(), operand(), d.chance(50));
  }
}

Program decodeProgram(Decoder& d) {
  Program p;
  p.meshes.push_back(decodeMesh(d, 0));
  if (d.chance(30)) p.meshes.push_back(decodeMesh(d, d.chance(50) ? p.meshes[0].size() : 0));

  static const std::vector<Extent> extents = {1, 2, 3, 4, 6, 8, 12, Extent::symbolic("t"), Extent::symbolic("s")};
  static const std::vector<DataType> dtypes = {DataType::Float, DataType::Float, DataType::BFloat16, DataType::Half,
                                               DataType::Int64, DataType::Bool};
  int64_t num_inputs = 1 + d.pick(3);
  for (int64_t i = 0; i < num_inputs; ++i) {
    std::vector<Extent> shape(1 + d.pick(4));
    for (Extent& e : shape) e = d.from(extents);
    TensorView* tv = p.fusion->defineTensor(shape, d.from(dtypes), "in" + std::to_string(i));
    if (d.chance(90)) decodeLayout(d, p, tv);
    p.pool.push_back(tv);
  }

  int64_t num_ops = d.pick(9);
  for (int64_t i = 0; i < num_ops && !d.exhausted(); ++i) {
    try {
      TensorView* tv = decodeOp(d, p);
      if (d.chance(15)) decodeLayout(d, p, tv);
      p.pool.push_back(tv);
    } catch (const UserError&) {
      // The menu draws ill-typed programs too; the op is left out.
    }
  }

  std::set<TensorView*> outputs = {p.pool.back()};
  if (d.chance(30)) outputs.insert(d.from(p.pool));
  for (TensorView* tv : outputs) p.fusion->addOutput(tv);

  OverlapOptions& overlap = p.options.overlap;
  overlap.algorithm = parseOverlapAlgorithm(d.from(std::vector<std::string>{"none", "none", "collective", "ring"}));
  overlap.chunks = d.pick(5);
  overlap.streams = 1 + d.pick(3);
  p.options.propagation.gather_parameters = d.chance(20);
  for (const char* symbol : {"t", "s"})
    if (d.chance(80)) p.options.sizes[symbol] = 1 + d.pick(16);
  return p;
}

// The collectives of every team, as each member sees them, must be the same sequence (kind and
// root; an allreduce also its size). Point-to-point steps pair up differently and are skipped.
void checkTeamsAgree(const std::map<int64_t, std::vector<CollectiveInfo>>& by_rank) {
  std::map<Team, std::map<int64_t, std::vector<std::string>>> seen;  // team -> member -> sequence
  for (const auto& [rank, list] : by_rank)
    for (const CollectiveInfo& c : list) {
      if (c.kind == CommKind::SendRecv) continue;
      std::string sig = fmt::format("{} root {}", commKindName(c.kind), c.root);
      if (c.kind == CommKind::Allreduce) sig += fmt::format(" {} bytes", c.bytes);
      seen[c.team][rank].push_back(sig);
    }
  for (const auto& [team, members] : seen)
    for (int64_t r : team) {
      auto it = members.find(r);
      const std::vector<std::string> none;
      const std::vector<std::string>& mine = it == members.end() ? none : it->second;
      const std::vector<std::string>& first = members.begin()->second;
      findingIf(mine != first, fmt::format("ranks {} and {} of team [{}] disagree on its collectives: [{}] vs [{}]",
                                           members.begin()->first, r, fmt::join(team, ", "), fmt::join(first, "; "),
                                           fmt::join(mine, "; ")));
    }
}

void compileAndPlan(Program p) {
  PipelineOptions options = p.options;
  std::set<std::string> symbols;
  for (const TensorView* tv : p.fusion->inputs())
    for (const Extent& e : tv->shape())
      if (!e.isStatic()) symbols.insert(e.symbol());
  bool sized = std::all_of(symbols.begin(), symbols.end(), [&](const std::string& s) { return options.sizes.count(s); });

  if (tracing())
    trace(fmt::format("{}options: overlap {} chunks {} streams {} fsdp {} sizes {}", printFusion(*p.fusion),
                      overlapAlgorithmName(options.overlap.algorithm), options.overlap.chunks, options.overlap.streams,
                      options.propagation.gather_parameters, fmt::join(options.sizes, ", ")));
  CompiledProgram compiled = compile(std::move(p.fusion), options, /*keep_stages=*/true);

  for (const char* stage : {"fusion", "propagated", "decomposed"}) {
    const std::string& text = compiled.stages.at(stage);
    std::string again;
    try {
      again = printFusion(*parseFusion(text, stage));
    } catch (const UserError& e) {
      finding(fmt::format("the {} stage does not parse: {}\n{}", stage, e.message(), text));
    }
    findingIf(again != text, fmt::format("the {} stage does not round-trip:\n{}\nreprinted:\n{}", stage, text, again));
  }

  std::set<int64_t> ranks;
  for (int64_t m = 0; m < compiled.fusion->numMeshes(); ++m)
    for (int64_t r : compiled.fusion->mesh(m).devices()) ranks.insert(r);
  std::map<int64_t, std::vector<CollectiveInfo>> by_rank;
  for (int64_t rank : ranks) {
    HostProgram program = programForRank(compiled, rank);
    (void)program.toString();
    if (!sized) continue;
    by_rank[rank] = collectives(program, options.sizes);
    (void)peakMemoryBytes(program, options.sizes);
    (void)dumpKernels(compiled, rank, options.sizes, KernelDump::KernelIr);
  }
  checkTeamsAgree(by_rank);
}

}  // namespace
}  // namespace meshfuse::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshfuse::fuzz;
  runInput([&] {
    Decoder d(data, size);
    compileAndPlan(decodeProgram(d));
  });
  return 0;
}
