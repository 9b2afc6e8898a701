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
#include <optional>

#include "lower/lower_segment.h"
#include "lower/host_ir.h"
#include "meshfuse/ir/fusion.h"

namespace meshfuse {
namespace {

// The tensor whose mesh says which ranks run a node (nullptr: every rank).
const TensorView* anchorOf(const HostProgram& p, const HostNode& node) {
  return node.visit([&](const auto& n) -> const TensorView* {
    using T = std::decay_t<decltype(n)>;
    if constexpr (std::is_base_of_v<hir::BufferNode, T>) {
      return n.tv;
    } else if constexpr (std::is_base_of_v<hir::SegmentCall, T>) {
      return p.segment(n).outputs.at(0);
    } else if constexpr (std::is_same_v<T, hir::Communication> || std::is_same_v<T, hir::ShardSlice> ||
                         std::is_same_v<T, hir::Copy>) {
      return n.out.tv;
    } else {
      return nullptr;  // stream and event bookkeeping, loops: every rank
    }
  });
}

bool onRank(const TensorView* tv, int64_t rank) {
  return tv == nullptr || tv->mesh() == nullptr || tv->mesh()->contains(rank);
}

// A stage boundary between meshes, as `rank` sees it (nullopt: it takes no part). Between stages
// of one shape, this rank sends to the device at its coordinates in the next stage's mesh and
// receives from the device at its coordinates in the previous one; a replicated value goes to a
// single-device mesh from its mesh's first device.
std::optional<hir::Communication> stageBoundary(const hir::Communication& n, int64_t rank) {
  const DeviceMesh& src = *n.in.tv->mesh();
  const DeviceMesh& dst = *n.out.tv->mesh();
  const bool paired = src.shape() == dst.shape();
  auto index = [rank](const DeviceMesh& m) {
    return std::find(m.devices().begin(), m.devices().end(), rank) - m.devices().begin();
  };
  hir::Communication s = n;
  if (src.contains(rank) && (paired || index(src) == 0)) s.send_to = dst.devices()[paired ? index(src) : 0];
  if (dst.contains(rank)) s.recv_from = src.devices()[paired ? index(dst) : 0];
  if (s.send_to < 0 && s.recv_from < 0) return std::nullopt;
  // The team is the ranks this rank exchanges with (and itself), so reports name them.
  for (int64_t r : {s.recv_from, rank, s.send_to})
    if (r >= 0 && std::find(s.team.begin(), s.team.end(), r) == s.team.end()) s.team.push_back(r);
  std::sort(s.team.begin(), s.team.end());
  return s;
}

// A communication as `rank` runs it (nullopt: not a member of its team), its team resolved.
std::optional<hir::Communication> specializeCommunication(const HostProgram& p, const hir::Communication& n,
                                                          int64_t rank) {
  if (n.kind == CommKind::SendRecv && n.mesh_axis < 0) return stageBoundary(n, rank);
  hir::Communication s = n;
  if (n.root >= 0) {
    // A rooted collective between meshes: its team is the slice of the mesh with several
    // devices through the root (root and team are the same on every rank), and only the
    // team takes part. A gather's or reduce's output lives on the root alone, a broadcast's or
    // scatter's input too (their Allocate nodes follow the output's mesh).
    const DeviceMesh& m = teamMesh(n);
    s.team = n.mesh_axis >= 0 ? m.team(n.root, n.mesh_axis) : m.devices();
    if (std::find(s.team.begin(), s.team.end(), rank) == s.team.end()) return std::nullopt;
    return s;
  }
  const TensorView* tv = anchorOf(p, n);
  if (!onRank(tv, rank)) return std::nullopt;  // another rank's (or stage's) work
  s.team = tv->mesh()->team(rank, n.mesh_axis);
  if (n.kind == CommKind::SendRecv && n.shift != 0) {  // a ring step: `shift` places along the team
    const int64_t size = static_cast<int64_t>(s.team.size());
    const int64_t me = std::find(s.team.begin(), s.team.end(), rank) - s.team.begin();
    s.send_to = s.team[((me + n.shift) % size + size) % size];
    s.recv_from = s.team[((me - n.shift) % size + size) % size];
  }
  return s;
}

// Keeps `rank`'s nodes; returns whether any work (not just stream bookkeeping) was kept.
bool specialize(const HostProgram& p, const std::vector<HostNode>& in, int64_t rank, std::vector<int64_t>& handles,
                std::vector<HostNode>& out) {
  bool work = false;
  for (const HostNode& n : in) {
    if (const auto* w = n.as<hir::Wait>()) {
      if (std::find(handles.begin(), handles.end(), w->handle) != handles.end()) out.push_back(n);
    } else if (const auto* l = n.as<hir::ForLoop>()) {
      hir::ForLoop loop{l->trip_count, {}, l->stream_pool};
      if (specialize(p, l->body, rank, handles, loop.body)) {
        out.push_back(std::move(loop));
        work = true;
      }
    } else if (n.is<hir::SetCurrentStream>() || n.is<hir::RecordEvent>() || n.is<hir::WaitEvent>() ||
               n.is<hir::HostWaitEvent>() || n.is<hir::Synchronize>()) {
      out.push_back(n);
    } else if (const auto* c = n.as<hir::Communication>()) {
      if (std::optional<hir::Communication> s = specializeCommunication(p, *c, rank)) {
        out.push_back(std::move(*s));
        handles.push_back(c->handle);
        work = true;
      }
    } else if (onRank(anchorOf(p, n), rank)) {
      out.push_back(n);
      work = true;
    }
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
