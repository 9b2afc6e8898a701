// specialize-for-rank (MPMD): a rank's program holds only its own work, and only the
// collectives of teams it belongs to, with each team resolved to global ranks.
//
// requires: lower-to-host-ir.   guarantees: every node's TensorViews live on a mesh containing
//   `rank` (a stage-boundary SendRecv is kept by both its sender and its receiver, with the side
//   this rank does not take part in cleared, and its team the ranks it exchanges with); a
//   broadcast, scatter, gather or reduce between meshes is kept by the members of its team (the
//   slice through its root); every other Communication has its team (the mesh slice along its
//   axis through `rank`); loops whose bodies hold no work of this rank are dropped.
//
//   before (hostir {):        comm h0 allgather %inp -> %0 axis 0 from dim 0
//   after (hostir rank 1 {):  comm h0 allgather %inp -> %0 axis 0 from dim 0 team [0, 1]
//   (a stage boundary: `comm h0 send_recv %out0 -> %0` becomes, on rank 1 of stages [0] -> [1],
//   `comm h0 send_recv %out0 -> %0 from rank 0 team [0, 1]`; rank 2 drops it.)
#include <algorithm>

#include "lower/lower_segment.h"
#include "lower/host_ir.h"
#include "meshfuse/ir/fusion.h"

namespace meshfuse {
namespace {

const TensorView* anchorOf(const HostProgram& p, const HostNode& n) {
  if (n.tv) return n.tv;
  if (n.out.tv) return n.out.tv;
  if (n.segment >= 0) return p.segment(n).outputs.at(0);
  return nullptr;
}

bool onRank(const TensorView* tv, int64_t rank) {
  return tv == nullptr || tv->mesh() == nullptr || tv->mesh()->contains(rank);
}

// Keeps `rank`'s nodes; returns whether any work (not just stream bookkeeping) was kept.
bool specialize(const HostProgram& p, const std::vector<HostNode>& in, int64_t rank, std::vector<int64_t>& handles,
                std::vector<HostNode>& out) {
  bool work = false;
  for (const HostNode& n : in) {
    switch (n.kind) {
      case HostNodeKind::Wait:
        if (std::find(handles.begin(), handles.end(), n.handle) != handles.end()) out.push_back(n);
        continue;
      case HostNodeKind::ForLoop: {
        HostNode loop = n;
        loop.body.clear();
        if (specialize(p, n.body, rank, handles, loop.body)) {
          out.push_back(std::move(loop));
          work = true;
        }
        continue;
      }
      case HostNodeKind::SetCurrentStream:
      case HostNodeKind::RecordEvent:
      case HostNodeKind::WaitEvent:
      case HostNodeKind::HostWaitEvent:
      case HostNodeKind::Synchronize: out.push_back(n); continue;
      case HostNodeKind::Communication:
        if (n.comm == CommKind::SendRecv && n.mesh_axis < 0) {  // a stage boundary between meshes
          // Between stages of one shape, this rank sends to the device at its coordinates in the
          // next stage's mesh and receives from the device at its coordinates in the previous
          // one; a replicated value goes to a single-device mesh from its mesh's first device.
          const DeviceMesh& src = *n.in.tv->mesh();
          const DeviceMesh& dst = *n.out.tv->mesh();
          const bool paired = src.shape() == dst.shape();
          auto index = [rank](const DeviceMesh& m) {
            return std::find(m.devices().begin(), m.devices().end(), rank) - m.devices().begin();
          };
          HostNode s = n;
          if (src.contains(rank) && (paired || index(src) == 0)) s.send_to = dst.devices()[paired ? index(src) : 0];
          if (dst.contains(rank)) s.recv_from = src.devices()[paired ? index(dst) : 0];
          if (s.send_to < 0 && s.recv_from < 0) continue;
          // The team is the ranks this rank exchanges with (and itself), so reports name them.
          for (int64_t r : {s.recv_from, rank, s.send_to})
            if (r >= 0 && std::find(s.team.begin(), s.team.end(), r) == s.team.end()) s.team.push_back(r);
          std::sort(s.team.begin(), s.team.end());
          out.push_back(s);
          handles.push_back(n.handle);
          work = true;
          continue;
        }
        break;
      default: break;
    }
    if (n.kind == HostNodeKind::Communication && n.root >= 0) {
      // A rooted collective between meshes: its team is the slice of the mesh with several
      // devices through the root (root and team are the same on every rank), and only the
      // team takes part. A gather's or reduce's output lives on the root alone, a broadcast's or
      // scatter's input too (their Allocate nodes follow the output's mesh).
      const DeviceMesh& m = teamMesh(n);
      Team team = n.mesh_axis >= 0 ? m.team(n.root, n.mesh_axis) : m.devices();
      if (std::find(team.begin(), team.end(), rank) == team.end()) continue;
      HostNode s = n;
      s.team = std::move(team);
      out.push_back(std::move(s));
      handles.push_back(n.handle);
      work = true;
      continue;
    }
    const TensorView* tv = anchorOf(p, n);
    if (!onRank(tv, rank)) continue;  // another rank's (or stage's) work
    HostNode s = n;
    if (n.kind == HostNodeKind::Communication) {
      s.team = tv->mesh()->team(rank, n.mesh_axis);
      handles.push_back(n.handle);
      if (n.comm == CommKind::SendRecv && n.shift != 0) {  // a ring step: `shift` places along the team
        const int64_t size = static_cast<int64_t>(s.team.size());
        const int64_t me = std::find(s.team.begin(), s.team.end(), rank) - s.team.begin();
        s.send_to = s.team[((me + n.shift) % size + size) % size];
        s.recv_from = s.team[((me - n.shift) % size + size) % size];
      }
    }
    out.push_back(s);
    work = true;
  }
  return work;
}

}  // namespace

HostProgram specializeForRank(const HostProgram& program, int64_t rank) {
  HostProgram p;
  p.fusion = program.fusion;
  p.segments = program.segments;
  p.rank = rank;
  std::vector<int64_t> handles;
  specialize(program, program.nodes, rank, handles, p.nodes);
  return p;
}

}  // namespace meshfuse
