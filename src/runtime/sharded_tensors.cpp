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

}  // namespace

std::vector<int64_t> blockOffsets(const TensorView* tv, const std::vector<int64_t>& local, int64_t rank) {
  std::vector<int64_t> off(local.size(), 0);
  const DeviceMesh* mesh = tv->mesh();
  if (mesh == nullptr) return off;
  std::vector<Placement> ps = placementsOf(tv);
  std::vector<int64_t> coords = mesh->coordinates(rank);
  std::vector<int64_t> index(local.size(), 0);  // block index along each dim
  for (int64_t a = 0; a < mesh->rank(); ++a)
    if (ps[a].kind == Placement::Shard) index[ps[a].dim] = index[ps[a].dim] * mesh->size(a) + coords[a];
  for (size_t d = 0; d < local.size(); ++d) off[d] = index[d] * local[d];
  return off;
}

SymbolBindings bindLocalInputs(const Fusion& f, const std::vector<Tensor>& locals, int64_t rank,
                               const std::vector<std::vector<int64_t>>& global_shapes) {
  MF_USER_CHECK(locals.size() == f.inputs().size(), ErrorKind::Value, "the fusion takes {} inputs but {} were given",
                f.inputs().size(), locals.size());
  SymbolBindings b;
  std::map<std::string, std::pair<size_t, size_t>> bound_by;  // symbol -> the input and dim that bound it
  const bool full = rank < 0;
  for (size_t i = 0; i < locals.size(); ++i) {
    const TensorView* tv = f.inputs()[i];
    if (!full && tv->mesh() != nullptr && !tv->mesh()->contains(rank)) {
      // Not held here (another pipeline stage): its global shape still binds symbolic sizes.
      if (i < global_shapes.size() && global_shapes[i].size() == tv->shape().size())
        for (size_t d = 0; d < global_shapes[i].size(); ++d)
          if (!tv->shape()[d].isStatic() && b.emplace(tv->shape()[d].symbol(), global_shapes[i][d]).second)
            bound_by[tv->shape()[d].symbol()] = {i, d};
      continue;
    }
    const Tensor& t = locals[i];
    auto name = [&] { return f.displayName(tv); };  // only for messages: displayName scans the fusion
    MF_USER_CHECK(t.dtype() == tv->dtype(), ErrorKind::Dtype, "input {} ({}): expected dtype {} but got {}", i, name(),
                  dtypeName(tv->dtype()), dtypeName(t.dtype()));
    std::vector<Extent> shape = tv->shape();
    const char* what = full ? "tensor" : "local tensor";
    MF_USER_CHECK(t.rank() == static_cast<int64_t>(shape.size()), ErrorKind::Shape,
                  "input {} ({}): expected rank {} but got a {} of shape {}", i, name(), shape.size(), what,
                  t.shapeString());
    std::vector<int64_t> factors = full ? std::vector<int64_t>(shape.size(), 1) : shardFactors(tv);
    // A caller that knows the global shape (distributeTensor, DTensors) gets uneven shards and
    // blocks of the wrong size named here, not a program that binds each rank's sizes apart.
    const bool has_global = !full && i < global_shapes.size() && !global_shapes[i].empty();
    if (has_global) {
      MF_USER_CHECK(global_shapes[i].size() == shape.size(), ErrorKind::Shape,
                    "input {} ({}): expected rank {} but the global shape given is [{}]", i, name(), shape.size(),
                    fmt::join(global_shapes[i], ", "));
      for (size_t d = 0; d < shape.size(); ++d) {
        MF_USER_CHECK(global_shapes[i][d] % factors[d] == 0, ErrorKind::Unsupported,
                      "uneven sharding not supported: input {} ({}) dim {} has size {} which does not divide into {} "
                      "shards",
                      i, name(), d, global_shapes[i][d], factors[d]);
        MF_USER_CHECK(global_shapes[i][d] == t.shape()[d] * factors[d], ErrorKind::Shape,
                      "input {} ({}): the {} has shape {} but the global shape [{}] in {} shards along dim {} "
                      "gives {} there",
                      i, name(), what, t.shapeString(), fmt::join(global_shapes[i], ", "), factors[d], d,
                      global_shapes[i][d] / factors[d]);
      }
    }
    for (size_t d = 0; d < shape.size(); ++d) {
      int64_t global = t.shape()[d] * factors[d];
      if (shape[d].isStatic()) {
        MF_USER_CHECK(shape[d].value() == global, ErrorKind::Shape,
                      "input {} ({}): dim {} must be {}{} but the {} has shape {}", i, name(), d, shape[d].value(),
                      factors[d] == 1 ? std::string()
                                      : fmt::format(" globally ({} per rank over {} shards)",
                                                    shape[d].value() / factors[d], factors[d]),
                      what, t.shapeString());
        continue;
      }
      auto [it, fresh] = b.emplace(shape[d].symbol(), global);
      if (fresh) bound_by[shape[d].symbol()] = {i, d};
      const auto [first_input, first_dim] = bound_by[shape[d].symbol()];
      MF_USER_CHECK(fresh || it->second == global, ErrorKind::Shape,
                    "input {} ({}): dim {} is ?{} = {} but input {} ({}) has ?{} = {} (dim {})", i, name(), d,
                    shape[d].symbol(), global, first_input, f.displayName(f.inputs()[first_input]), shape[d].symbol(),
                    it->second, first_dim);
    }
  }
  f.checkExtentConstraints(b);
  return b;
}

Tensor shardForRank(const TensorView* tv, const Tensor& full, int64_t rank) {
  if (tv->mesh() == nullptr) return full;
  std::vector<int64_t> factors = shardFactors(tv);
  std::vector<int64_t> local = full.shape();
  for (size_t d = 0; d < local.size(); ++d) {
    MF_USER_CHECK(local[d] % factors[d] == 0, ErrorKind::Unsupported,
                  "uneven sharding not supported: {} dim {} has size {} which does not divide into {} shards",
                  tv->fusion()->displayName(tv), d, local[d], factors[d]);
    local[d] /= factors[d];
  }
  Tensor out(full.dtype(), local);
  std::vector<Placement> ps = placementsOf(tv);
  std::vector<int64_t> coords = tv->mesh()->coordinates(rank);
  for (size_t a = 0; a < ps.size(); ++a)
    if (ps[a].kind == Placement::Partial && coords[a] != 0) return out;  // zeros: the sum is held by index 0
  copyBlock(full, blockOffsets(tv, local, rank), out, zeros(local.size()), local);
  return out;
}

Tensor assembleGlobal(const TensorView* tv, const std::vector<Tensor>& locals) {
  const DeviceMesh* mesh = tv->mesh();
  if (mesh == nullptr) return locals.at(0);
  std::vector<Placement> ps = placementsOf(tv);
  std::vector<int64_t> factors = shardFactors(tv);
  const Tensor& first = locals.at(mesh->devices()[0]);
  std::vector<int64_t> global = first.shape();
  for (size_t d = 0; d < global.size(); ++d) global[d] *= factors[d];
  Tensor out(first.dtype(), global);
  for (int64_t r : mesh->devices()) {
    std::vector<int64_t> coords = mesh->coordinates(r);
    bool skip = false, partial = false;
    for (size_t a = 0; a < ps.size(); ++a) {
      if (ps[a].kind == Placement::Replicate && coords[a] != 0) skip = true;
      if (ps[a].kind == Placement::Partial) partial = true;
    }
    if (skip) continue;
    const Tensor& l = locals.at(r);
    if (partial)
      addBlock(l, zeros(global.size()), out, blockOffsets(tv, l.shape(), r), l.shape());
    else
      copyBlock(l, zeros(global.size()), out, blockOffsets(tv, l.shape(), r), l.shape());
  }
  return out;
}

}  // namespace meshfuse
