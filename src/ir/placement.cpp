// DTensor placements <-> IterDomain splits and DID parallelization.
#include "meshfuse/ir/placement.h"

#include <algorithm>
#include <tuple>

#include "meshfuse/ir/fusion.h"

namespace meshfuse {

std::string Placement::toString() const {
  switch (kind) {
    case Shard: return fmt::format("Shard({})", dim);
    case Replicate: return "Replicate()";
    case Partial: return "Partial()";
  }
  return "?";
}

std::string placementsToString(const std::vector<Placement>& ps) {
  std::vector<std::string> s;
  for (const Placement& p : ps) s.push_back(p.toString());
  return fmt::format("[{}]", fmt::join(s, ", "));
}

void applyPlacements(TensorView* tv, const DeviceMesh& mesh, const std::vector<Placement>& placements) {
  Fusion* f = tv->fusion();
  const std::string name = f->displayName(tv);
  MF_USER_CHECK(static_cast<int64_t>(placements.size()) == mesh.rank(), ErrorKind::Placement,
                "{}: got {} placements {} for a rank-{} mesh {} (one placement per mesh axis is needed)", name,
                placements.size(), placementsToString(placements), mesh.rank(), mesh.toString());
  std::optional<StreamSplit> stream = streamSplitOf(tv);  // chunking survives a new placement
  tv->resetSchedule();
  tv->setDeviceMesh(mesh);
  const int64_t rank = tv->rank();
  // For each logical dim: the loop axis holding its not-yet-split remainder.
  for (int64_t axis = 0; axis < mesh.rank(); ++axis) {
    const Placement& p = placements[axis];
    ParallelType pt = mesh.parallelTypeOfAxis(axis);
    int64_t n = mesh.size(axis);
    if (p.kind == Placement::Replicate) continue;
    if (p.kind == Placement::Partial) {
      tv->addPartialDim(n);
      tv->parallelize(static_cast<int64_t>(tv->loop().size()) - 1, pt);
      continue;
    }
    MF_USER_CHECK(p.dim >= -rank && p.dim < rank, ErrorKind::Placement,
                  "{}: placement {} on mesh axis {} names a dim that {} of rank {} does not have", name, p.toString(),
                  axis, name, rank);
    int64_t d = p.dim < 0 ? p.dim + rank : p.dim;
    IterDomain* logical_id = tv->dims()[d];
    // Find the innermost loop axis derived from this dim (its unsplit remainder).
    int64_t loop_axis = -1;
    for (size_t i = 0; i < tv->loop().size(); ++i) {
      if (tv->loop()[i]->isDeviceDim()) continue;
      const IterDomain* id = tv->loop()[i];
      while (id->definition() != nullptr) id = id->definition()->inputs[0];
      if (id == logical_id) loop_axis = static_cast<int64_t>(i);
    }
    MF_CHECK(loop_axis >= 0, "no loop axis for dim {}", d);
    // An extent the mesh axis does not divide is split as torch.chunk splits it (localBlock).
    tv->split(loop_axis, n);
    tv->parallelize(loop_axis, pt);
  }
  if (stream) applyStreamSplit(tv, *stream);
}

std::vector<Placement> placementsOf(const TensorView* tv) {
  const DeviceMesh* mesh = tv->mesh();
  MF_CHECK(mesh != nullptr, "placementsOf {} without a mesh", tv->fusion()->displayName(tv));
  std::vector<Placement> out;
  std::vector<IterDomain*> dims = tv->dims();
  for (int64_t axis = 0; axis < mesh->rank(); ++axis) {
    int64_t loop_axis = tv->loopAxisOf(mesh->parallelTypeOfAxis(axis));
    if (loop_axis < 0) {
      out.push_back(Placement::replicate());
      continue;
    }
    IterDomain* id = tv->loop()[loop_axis];
    if (id->isReduction()) {
      out.push_back(Placement::partial());
      continue;
    }
    int64_t logical = tv->logicalAxisOf(loop_axis);
    MF_USER_CHECK(logical >= 0, ErrorKind::Placement,
                  "{}: its {} axis derives from a merge of several dims, which no placement expresses",
                  tv->fusion()->displayName(tv), parallelTypeName(id->parallelType()));
    IterDomain* lid = tv->logical()[logical];
    out.push_back(Placement::shard(std::find(dims.begin(), dims.end(), lid) - dims.begin()));
  }
  return out;
}

std::optional<StreamSplit> streamSplitOf(const TensorView* tv) {
  int64_t axis = tv->loopAxisOf(ParallelType::Stream);
  if (axis < 0) return std::nullopt;
  int64_t logical = tv->logicalAxisOf(axis);
  const IterDomain* id = tv->loop()[axis];
  if (logical < 0 || !id->extent().isStatic() || tv->logical()[logical]->isReduction()) return std::nullopt;
  std::vector<IterDomain*> dims = tv->dims();
  return StreamSplit{std::find(dims.begin(), dims.end(), tv->logical()[logical]) - dims.begin(), id->extent().value()};
}

void applyStreamSplit(TensorView* tv, const StreamSplit& s) {
  const std::string name = tv->fusion()->displayName(tv);
  MF_USER_CHECK(s.dim >= 0 && s.dim < tv->rank(), ErrorKind::Value,
                "{}: a Stream split of dim {}, but it has {} dims (not counting reduction dims)", name, s.dim,
                tv->rank());
  const IterDomain* target = tv->dims()[s.dim];
  for (size_t i = 0; i < tv->loop().size(); ++i) {
    const IterDomain* id = tv->loop()[i];
    if (id->isDeviceDim()) continue;
    const IterDomain* root = id;
    while (root->definition() != nullptr) root = root->definition()->inputs[0];
    if (root != target) continue;
    tv->split(static_cast<int64_t>(i), s.chunks);
    tv->parallelize(static_cast<int64_t>(i), ParallelType::Stream);
    return;
  }
  // Only a merge's first input is traced back above: a dim merged into an earlier one has no loop
  // axis of its own (the schedule API can build that).
  userError(ErrorKind::Unsupported, "{}: a Stream split of dim {}, which its schedule merged into another dim", name,
            s.dim);
}

std::vector<int64_t> shardFactors(const TensorView* tv) {
  std::vector<IterDomain*> dims = tv->dims();
  std::vector<int64_t> factors(dims.size(), 1);
  for (size_t i = 0; i < tv->loop().size(); ++i) {
    if (!tv->loop()[i]->isDeviceDim() || tv->loop()[i]->isReduction()) continue;
    int64_t logical = tv->logicalAxisOf(static_cast<int64_t>(i));
    MF_USER_CHECK(logical >= 0, ErrorKind::Unsupported, "{}: DID parallelization of a merged axis",
                  tv->fusion()->displayName(tv));
    int64_t d = std::find(dims.begin(), dims.end(), tv->logical()[logical]) - dims.begin();
    factors[d] *= tv->loop()[i]->extent().value();
  }
  return factors;
}

namespace {

// The DID splits of each dims() index, outermost first: (mesh axis, number of devices). A split
// nested in another's remainder is deeper (applyPlacements splits mesh axis 0 outermost).
std::vector<std::vector<std::pair<int64_t, int64_t>>> shardLevels(const TensorView* tv) {
  std::vector<IterDomain*> dims = tv->dims();
  std::vector<std::vector<std::tuple<int64_t, int64_t, int64_t>>> found(dims.size());  // (depth, axis, n)
  const DeviceMesh* mesh = tv->mesh();
  for (size_t i = 0; i < tv->loop().size(); ++i) {
    const IterDomain* id = tv->loop()[i];
    if (!id->isDeviceDim() || id->isReduction()) continue;
    int64_t depth = 0;
    const IterDomain* root = id;
    for (; root->definition() != nullptr; root = root->definition()->inputs[0]) ++depth;
    auto it = std::find(dims.begin(), dims.end(), root);
    MF_USER_CHECK(it != dims.end() && tv->logicalAxisOf(static_cast<int64_t>(i)) >= 0, ErrorKind::Unsupported,
                  "{}: DID parallelization of a merged axis", tv->fusion()->displayName(tv));
    MF_CHECK(mesh != nullptr, "{} has a DID axis but no mesh", tv->fusion()->displayName(tv));
    found[it - dims.begin()].emplace_back(depth, mesh->axisOfParallelType(id->parallelType()),
                                          id->extent().value());
  }
  std::vector<std::vector<std::pair<int64_t, int64_t>>> out(dims.size());
  for (size_t d = 0; d < dims.size(); ++d) {
    std::sort(found[d].begin(), found[d].end());
    for (const auto& [depth, axis, n] : found[d]) out[d].emplace_back(axis, n);
  }
  return out;
}

}  // namespace

std::vector<Span> localBlock(const TensorView* tv, const SymbolBindings& bindings, int64_t rank) {
  return localBlockOf(tv, tv->evaluateShape(bindings), rank);
}

std::vector<Span> localBlockOf(const TensorView* tv, const std::vector<int64_t>& shape, int64_t rank) {
  MF_CHECK(shape.size() == static_cast<size_t>(tv->rank()), "a global shape of {} dims for {} of rank {}",
           shape.size(), tv->fusion()->displayName(tv), tv->rank());
  std::vector<Span> out;
  for (int64_t s : shape) out.push_back({0, s});
  const DeviceMesh* mesh = tv->mesh();
  if (mesh == nullptr) return out;
  // Outside the mesh (or rank -1): coordinate 0 on every axis, whose blocks are the largest.
  std::vector<int64_t> coords =
      rank >= 0 && mesh->contains(rank) ? mesh->coordinates(rank) : std::vector<int64_t>(mesh->rank(), 0);
  std::vector<std::vector<std::pair<int64_t, int64_t>>> levels = shardLevels(tv);
  for (size_t d = 0; d < out.size(); ++d)
    for (const auto& [axis, n] : levels[d]) {
      Span part = chunkSpan(out[d].size, n, coords[axis]);
      out[d] = {out[d].begin + part.begin, part.size};
    }
  return out;
}

std::vector<int64_t> localShape(const TensorView* tv, const SymbolBindings& bindings, int64_t rank) {
  std::vector<int64_t> out;
  for (const Span& s : localBlock(tv, bindings, rank)) out.push_back(s.size);
  return out;
}

}  // namespace meshfuse
