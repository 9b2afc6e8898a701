// specialize-for-rank (MPMD): a rank's program holds only its own work, and only the
// collectives of teams it belongs to, with each team resolved to global ranks.
//
// requires: lower-to-host-ir.   guarantees: every node's TensorViews live on a mesh containing
//   `rank`; every Communication has its team (the mesh slice along its axis through `rank`).
#include <algorithm>

#include "meshfuse/host_ir.h"
#include "meshfuse/ir/fusion.h"

namespace meshfuse {
namespace {

const TensorView* anchorOf(const HostProgram& p, const HostNode& n) {
  if (n.tv) return n.tv;
  if (n.out) return n.out;
  if (n.segment >= 0) return p.segment(n).outputs.at(0);
  return nullptr;
}

}  // namespace

HostProgram specializeForRank(const HostProgram& program, int64_t rank) {
  HostProgram p;
  p.fusion = program.fusion;
  p.segments = program.segments;
  p.rank = rank;
  std::vector<int64_t> kept_handles;
  for (const HostNode& n : program.nodes) {
    if (n.kind == HostNodeKind::Wait) {
      if (std::find(kept_handles.begin(), kept_handles.end(), n.handle) != kept_handles.end()) p.nodes.push_back(n);
      continue;
    }
    const TensorView* tv = anchorOf(program, n);
    const DeviceMesh* mesh = tv ? tv->mesh() : nullptr;
    if (mesh != nullptr && !mesh->contains(rank)) continue;  // another rank's (or stage's) work
    HostNode s = n;
    if (n.kind == HostNodeKind::Communication) {
      s.team = mesh->team(rank, n.mesh_axis);
      kept_handles.push_back(n.handle);
    }
    p.nodes.push_back(s);
  }
  return p;
}

}  // namespace meshfuse
