// DTensor placements <-> IterDomain splits and DID parallelization.
#include "meshfuse/ir/placement.h"

#include <algorithm>

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
    const Extent& e = tv->loop()[loop_axis]->extent();
    MF_USER_CHECK(e.divisible(n), ErrorKind::Unsupported,
                  "uneven sharding not supported: {} dim {} has size {} which mesh axis {} does not divide into {} "
                  "equal shards ({})",
                  name, d, e.toString(), axis, n, p.toString());
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

std::vector<int64_t> localShape(const TensorView* tv, const SymbolBindings& bindings) {
  std::vector<int64_t> factors = shardFactors(tv);
  std::vector<int64_t> out;
  std::vector<int64_t> shape = tv->evaluateShape(bindings);
  for (size_t d = 0; d < shape.size(); ++d) {
    int64_t global = shape[d];
    MF_USER_CHECK(global % factors[d] == 0, ErrorKind::Unsupported,
                  "uneven sharding not supported: {} dim {} has size {} which does not divide into {} shards",
                  tv->fusion()->displayName(tv), d, global, factors[d]);
    out.push_back(global / factors[d]);
  }
  return out;
}

}  // namespace meshfuse
