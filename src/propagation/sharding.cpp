// Reading and writing shardings from/to the IR's DID splits.
#include "propagation/sharding.h"

#include <algorithm>

#include "meshfuse/ir/fusion.h"

namespace meshfuse {

Sharding readSharding(const TensorView* tv) {
  if (tv->mesh() == nullptr) return {};
  return {tv->meshIndex(), placementsOf(tv)};
}

void writeSharding(TensorView* tv, const Sharding& s, const std::vector<int64_t>& partial_dims) {
  MF_CHECK(s.decided(), "writing an undecided sharding");
  const DeviceMesh& mesh = tv->fusion()->mesh(s.mesh);
  // Shard/Replicate through applyPlacements; Partial axes on an existing reduction dim are
  // split here, others get a fresh Partial dim from applyPlacements.
  std::vector<Placement> ps = s.axes;
  std::vector<std::pair<int64_t, int64_t>> contraction;  // (mesh axis, logical reduction index)
  for (size_t a = 0; a < ps.size(); ++a) {
    if (ps[a].kind == Placement::Partial && a < partial_dims.size() && partial_dims[a] >= 0) {
      contraction.push_back({static_cast<int64_t>(a), partial_dims[a]});
      ps[a] = Placement::replicate();
    }
  }
  applyPlacements(tv, mesh, ps);
  for (auto [axis, logical] : contraction) {
    IterDomain* rid = tv->logical().at(logical);
    MF_CHECK(rid->isReduction(), "partial dim {} is not a reduction", logical);
    int64_t loop_axis = -1;
    for (size_t i = 0; i < tv->loop().size(); ++i) {
      const IterDomain* id = tv->loop()[i];
      if (id->isDeviceDim()) continue;
      while (id->definition() != nullptr) id = id->definition()->inputs[0];
      if (id == rid) loop_axis = static_cast<int64_t>(i);
    }
    MF_CHECK(loop_axis >= 0, "no loop axis for reduction dim {}", logical);
    // A contracted dim the mesh axis does not divide is cut as torch.chunk cuts it (each rank
    // sums its operands' blocks of it, of whatever size).
    tv->split(loop_axis, mesh.size(axis));
    tv->parallelize(loop_axis, mesh.parallelTypeOfAxis(axis));
  }
}

std::string toString(const Sharding& s) {
  if (!s.decided()) return "undecided";
  return placementsToString(s.axes);
}

Provenance pinnedProvenance(const TensorView* tv) {
  const Fusion& f = *tv->fusion();
  std::string placed = toString(readSharding(tv));
  // With several meshes (pipeline stages) the mesh is part of what the user asked for.
  if (f.numMeshes() > 1 && tv->mesh() != nullptr) placed += " on mesh " + tv->mesh()->toString();
  const Expr* def = tv->definition();
  if (def == nullptr) return {fmt::format("pinned by the user: input {{}} placed {}", placed), {tv}};
  if (def->kind() == OpKind::Set) return {fmt::format("pinned by the user: {{}} set to {}", placed), {tv}};
  return {fmt::format("pinned by the user: {{}} = {} placed {}", def->name(), placed), {tv}};
}

void redirectProvenance(Fusion& f, const TensorView* from, const TensorView* to) {
  for (TensorView* tv : f.tensorViews()) {
    Provenance p = tv->provenanceNote();
    if (std::find(p.refs.begin(), p.refs.end(), from) == p.refs.end()) continue;
    std::replace(p.refs.begin(), p.refs.end(), static_cast<const Val*>(from), static_cast<const Val*>(to));
    tv->setProvenance(p);
  }
}

}  // namespace meshfuse
