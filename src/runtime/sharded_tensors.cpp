// Local blocks of distributed tensors: binding symbolic sizes from local inputs, cutting a
// rank's block out of a full tensor, and assembling the full tensor from every rank's block.
#include <fmt/ranges.h>

#include <map>

#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/placement.h"
#include "runtime/host_ir_evaluator.h"
#include "runtime/tensor_blocks.h"

namespace meshfuse {
namespace {

std::vector<int64_t> zeros(size_t n) { return std::vector<int64_t>(n, 0); }

std::vector<int64_t> offsetsOf(const std::vector<Span>& block) {
  std::vector<int64_t> off;
  for (const Span& s : block) off.push_back(s.begin);
  return off;
}

std::vector<int64_t> sizesOf(const std::vector<Span>& block) {
  std::vector<int64_t> sizes;
  for (const Span& s : block) sizes.push_back(s.size);
  return sizes;
}

// Throws ShapeError unless the local tensor `t` of input `i` is `rank`'s block of its global
// shape under `b` (localBlock: uneven shards are torch.chunk's); rank -1: the whole tensor.
void checkBlock(const Fusion& f, size_t i, const Tensor& t, int64_t rank, const SymbolBindings& b, bool has_global) {
  const TensorView* tv = f.inputs()[i];
  const std::vector<int64_t> want = rank < 0 ? tv->evaluateShape(b) : localShape(tv, b, rank);
  if (t.shape() == want) return;
  const std::vector<int64_t> factors = rank < 0 ? std::vector<int64_t>(want.size(), 1) : shardFactors(tv);
  const std::vector<Extent> shape = tv->shape();
  for (size_t d = 0; d < want.size(); ++d) {
    if (t.shape()[d] == want[d]) continue;
    const std::string name = f.displayName(tv);
    if (shape[d].isStatic() && !has_global)
      userError(ErrorKind::Shape, "input {} ({}): dim {} must be {}{} but the local tensor has shape {}", i, name, d,
                shape[d].value(),
                factors[d] == 1 ? std::string()
                                : fmt::format(" globally ({} on rank {}: its block of {} shards)", want[d], rank,
                                              factors[d]),
                t.shapeString());
    userError(ErrorKind::Shape,
              "input {} ({}): the local tensor has shape {} but the global shape {} in {} shards along dim {} gives {} "
              "there on rank {}",
              i, name, t.shapeString(), fmt::format("[{}]", fmt::join(tv->evaluateShape(b), ", ")), factors[d], d,
              want[d], rank);
  }
}

}  // namespace

SymbolBindings bindSizes(const Fusion& f, const std::vector<std::vector<int64_t>>& global_shapes,
                         const std::vector<bool>& stated) {
  MF_USER_CHECK(global_shapes.size() == f.inputs().size(), ErrorKind::Value,
                "the fusion takes {} inputs but {} were given", f.inputs().size(), global_shapes.size());
  SymbolBindings b;
  std::map<std::string, std::pair<size_t, size_t>> bound_by;  // symbol -> the input and dim that bound it
  for (size_t i = 0; i < global_shapes.size(); ++i) {
    const std::vector<int64_t>& global = global_shapes[i];
    if (global.empty()) continue;
    const TensorView* tv = f.inputs()[i];
    auto name = [&] { return f.displayName(tv); };  // only for messages: displayName scans the fusion
    const std::vector<Extent> shape = tv->shape();
    const bool given = i < stated.size() && stated[i];
    MF_USER_CHECK(global.size() == shape.size(), ErrorKind::Shape,
                  "input {} ({}): expected rank {} but got the global shape [{}]", i, name(), shape.size(),
                  fmt::join(global, ", "));
    for (size_t d = 0; d < shape.size(); ++d) {
      const Extent& e = shape[d];
      if (e.isStatic()) {
        MF_USER_CHECK(!given || e.value() == global[d], ErrorKind::Shape,
                      "input {} ({}): dim {} must be {} but the global shape given is [{}]", i, name(), d, e.value(),
                      fmt::join(global, ", "));
        continue;
      }
      // The symbol's value: a dim of extent ?t*num/den of size g has ?t = g*den/num.
      MF_USER_CHECK((global[d] * e.den()) % e.num() == 0, ErrorKind::Shape,
                    "input {} ({}): dim {} has size {}, which its extent {} gives for no integer ?{}", i, name(), d,
                    global[d], e.toString(), e.symbol());
      const int64_t value = global[d] * e.den() / e.num();
      auto [it, fresh] = b.emplace(e.symbol(), value);
      if (fresh) bound_by[e.symbol()] = {i, d};
      const auto [first_input, first_dim] = bound_by[e.symbol()];
      MF_USER_CHECK(fresh || it->second == value, ErrorKind::Shape,
                    "input {} ({}): dim {} is ?{} = {} but input {} ({}) has ?{} = {} (dim {})", i, name(), d,
                    e.symbol(), value, first_input, f.displayName(f.inputs()[first_input]), e.symbol(), it->second,
                    first_dim);
    }
  }
  return b;
}

std::vector<int64_t> impliedGlobalShape(const TensorView* tv, const Tensor& local, int64_t rank) {
  std::vector<int64_t> global = local.shape();
  const std::vector<int64_t> factors =
      rank < 0 ? std::vector<int64_t>(global.size(), 1) : shardFactors(tv);
  for (size_t d = 0; d < global.size() && d < factors.size(); ++d) global[d] *= factors[d];
  return global;
}

SymbolBindings bindLocalInputs(const Fusion& f, const std::vector<Tensor>& locals, int64_t rank,
                               const std::vector<std::vector<int64_t>>& global_shapes) {
  MF_USER_CHECK(locals.size() == f.inputs().size(), ErrorKind::Value, "the fusion takes {} inputs but {} were given",
                f.inputs().size(), locals.size());
  const bool full = rank < 0;
  auto given = [&](size_t i) { return !full && i < global_shapes.size() && !global_shapes[i].empty(); };
  // The global size of each dim: given (distributeTensor, DTensors, a rank of another pipeline
  // stage), else the local block times its shards, which is exact for even shards only: an
  // uneven symbolic size needs the global shape (a local block alone does not tell 8 rows
  // split 4 + 4 from 7 split 4 + 3). An input this rank does not hold binds only what is given.
  std::vector<std::vector<int64_t>> globals(locals.size());
  std::vector<bool> held(locals.size(), false), stated(locals.size(), false);
  for (size_t i = 0; i < locals.size(); ++i) {
    const TensorView* tv = f.inputs()[i];
    stated[i] = given(i);
    if (stated[i]) globals[i] = global_shapes[i];
    if (!full && tv->mesh() != nullptr && !tv->mesh()->contains(rank)) {
      if (stated[i] && globals[i].size() != tv->shape().size()) globals[i].clear();  // the stage's own to check
      continue;
    }
    held[i] = true;
    const Tensor& t = locals[i];
    MF_USER_CHECK(t.dtype() == tv->dtype(), ErrorKind::Dtype, "input {} ({}): expected dtype {} but got {}", i,
                  f.displayName(tv), dtypeName(tv->dtype()), dtypeName(t.dtype()));
    MF_USER_CHECK(t.rank() == static_cast<int64_t>(tv->shape().size()), ErrorKind::Shape,
                  "input {} ({}): expected rank {} but got a {} of shape {}", i, f.displayName(tv), tv->shape().size(),
                  full ? "tensor" : "local tensor", t.shapeString());
    if (!stated[i]) globals[i] = impliedGlobalShape(tv, t, rank);
  }
  SymbolBindings b = bindSizes(f, globals, stated);
  f.checkExtentConstraints(b);
  // Every block held here is this rank's block of the global shape (a full tensor: all of it).
  for (size_t i = 0; i < locals.size(); ++i)
    if (held[i]) checkBlock(f, i, locals[i], rank, b, given(i));
  return b;
}

Tensor shardForRank(const TensorView* tv, const Tensor& full, int64_t rank) {
  if (tv->mesh() == nullptr) return full;
  std::vector<Span> block = localBlockOf(tv, full.shape(), rank);
  std::vector<int64_t> local = sizesOf(block);
  Tensor out(full.dtype(), local);
  std::vector<Placement> ps = placementsOf(tv);
  std::vector<int64_t> coords = tv->mesh()->coordinates(rank);
  for (size_t a = 0; a < ps.size(); ++a)
    if (ps[a].kind == Placement::Partial && coords[a] != 0) return out;  // zeros: the sum is held by index 0
  copyBlock(full, offsetsOf(block), out, zeros(local.size()), local);
  return out;
}

Tensor assembleGlobal(const TensorView* tv, const std::vector<Tensor>& locals) {
  const DeviceMesh* mesh = tv->mesh();
  if (mesh == nullptr) return locals.at(0);
  std::vector<Placement> ps = placementsOf(tv);
  // Dim d's global size: the sizes of the blocks along it, which the ranks at coordinate 0 on
  // every mesh axis that does not shard d hold one each.
  std::vector<int64_t> global(static_cast<size_t>(tv->rank()), 0);
  for (size_t d = 0; d < global.size(); ++d)
    for (int64_t r : mesh->devices()) {
      std::vector<int64_t> coords = mesh->coordinates(r);
      bool along = true;
      for (size_t a = 0; a < ps.size(); ++a)
        along &= coords[a] == 0 || (ps[a].kind == Placement::Shard && ps[a].dim == static_cast<int64_t>(d));
      if (along) global[d] += locals.at(r).shape().at(d);
    }
  Tensor out(locals.at(mesh->devices()[0]).dtype(), global);
  for (int64_t r : mesh->devices()) {
    std::vector<int64_t> coords = mesh->coordinates(r);
    bool skip = false, partial = false;
    for (size_t a = 0; a < ps.size(); ++a) {
      if (ps[a].kind == Placement::Replicate && coords[a] != 0) skip = true;
      if (ps[a].kind == Placement::Partial) partial = true;
    }
    if (skip) continue;
    const Tensor& l = locals.at(r);
    std::vector<Span> block = localBlockOf(tv, global, r);
    MF_USER_CHECK(l.shape() == sizesOf(block), ErrorKind::Shape,
                  "{}: rank {}'s block has shape {}, but the blocks of the global shape [{}] are split as torch.chunk "
                  "splits, which gives it [{}]",
                  tv->fusion()->displayName(tv), r, l.shapeString(), fmt::join(global, ", "),
                  fmt::join(sizesOf(block), ", "));
    if (partial)
      addBlock(l, zeros(block.size()), out, offsetsOf(block), l.shape());
    else
      copyBlock(l, zeros(block.size()), out, offsetsOf(block), l.shape());
  }
  return out;
}

}  // namespace meshfuse
