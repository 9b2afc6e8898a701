// lower-to-host-ir: one host node sequence for a decomposed fusion (all ranks together).
//
// requires: decompose-reshardings (each `set` changes at most one mesh axis, or moves between
//   meshes in one step).
// guarantees: every computed TensorView is allocated before it is written; every `set` that
//   changes a sharding is one Communication (+ its Wait) or a ShardSlice, except one among a
//   single device, which is a copy kernel; a set between meshes of different shapes is a
//   broadcast, scatter, gather or reduce with its root (a global rank) in its team, or a
//   send/recv of a replicated value to a single device; Gemm segments are
//   Gemm nodes, kernel segments LaunchKernel nodes; a set marked by decompose-for-overlap and
//   its GEMM become one Stream-parallel loop (lower_overlap.h); a GEMM whose output rows the
//   schedule splits on Stream (and that no collective is paired with) runs as a loop over those
//   chunks, its iterations on the stream pool (assign-streams places them).
//
//   before: %0 = set(%inp) : f32[?t, 64] @tp {}        (Shard(0) -> Replicate on axis 0)
//           %up = linear(%0, %up_w) ...
//   after:  allocate %0 : f32[?t, 64] ; comm h0 allgather %inp -> %0 axis 0 from dim 0 ; wait h0 ;
//           allocate %up : f32[?t, 64] ; gemm #1 %up = linear(%0, %up_w)
#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "decompose/decompose_ring_attention.h"
#include "lower/host_builder.h"
#include "lower/lower_microbatches.h"
#include "lower/lower_overlap.h"
#include "lower/lower_ring_attention.h"
#include "lower/lower_segment.h"
#include "lower/host_ir.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/placement.h"
#include "propagation/sharding.h"

namespace meshfuse {
namespace {

// The one axis of `s` that is not Replicate, or -1 when every axis is.
int64_t soleNonReplicateAxis(const Sharding& s) {
  int64_t axis = -1;
  for (size_t a = 0; a < s.axes.size(); ++a) {
    if (s.axes[a].kind == Placement::Replicate) continue;
    MF_CHECK(axis < 0, "a move between meshes from or to {}: run decompose-reshardings first", toString(s));
    axis = static_cast<int64_t>(a);
  }
  return axis;
}

// Fills `n` for a set between meshes of different shapes, which decompose-reshardings makes one
// rooted collective whose root is in its team: from one device, a broadcast (to Replicate) or a
// scatter (to Shard on one axis); to one device, a gather (from Shard on one axis), a reduce
// (from Partial), or a send/recv of a replicated value from the source mesh's first device.
void classifyRooted(const TensorView* in, const TensorView* out, const Sharding& from, const Sharding& to,
                    hir::Communication& n) {
  const DeviceMesh &a = *in->mesh(), &b = *out->mesh();
  if (a.size() == 1) {
    MF_CHECK(soleNonReplicateAxis(from) < 0, "a broadcast or scatter of {}, which is not whole on its device",
             toString(from));
    n.root = a.devices()[0];
    MF_CHECK(b.contains(n.root), "a broadcast or scatter whose root {} is outside mesh {}", n.root, b.toString());
    n.mesh_axis = soleNonReplicateAxis(to);
    if (n.mesh_axis < 0) {
      n.kind = CommKind::Broadcast;  // over every device of b
      return;
    }
    MF_CHECK(to.axes[n.mesh_axis].kind == Placement::Shard, "a move from one device to {}", toString(to));
    n.kind = CommKind::Scatter;
    n.out_dim = to.axes[n.mesh_axis].dim;
    return;
  }
  MF_CHECK(b.size() == 1, "a move between meshes {} and {} of different shapes and several devices", a.toString(),
           b.toString());
  MF_CHECK(soleNonReplicateAxis(to) < 0, "a gather or reduce to {}", toString(to));
  n.mesh_axis = soleNonReplicateAxis(from);
  if (n.mesh_axis < 0) {
    n.kind = CommKind::SendRecv;  // a replicated value: specialize-for-rank picks the sender
    return;
  }
  n.root = b.devices()[0];
  MF_CHECK(a.contains(n.root), "a gather or reduce whose root {} is outside mesh {}", n.root, a.toString());
  const Placement& p = from.axes[n.mesh_axis];
  n.kind = p.kind == Placement::Partial ? CommKind::Reduce : CommKind::Gather;
  if (p.kind == Placement::Shard) n.in_dim = p.dim;
}

// The node of the resharding set `e`: a Communication, or a ShardSlice (a local block); nullopt
// when the set moves no data (a copy).
std::optional<HostNode> classifySet(const Expr* e) {
  const TensorView* in = static_cast<const TensorView*>(e->input(size_t{0}));
  const TensorView* out = e->output();
  Sharding from = readSharding(in), to = readSharding(out);
  MF_CHECK(in->mesh() && out->mesh(), "a resharding set without meshes");
  hir::Communication n;
  n.in = BlockRef::of(in);
  n.out = BlockRef::of(out);
  if (*in->mesh() != *out->mesh()) {
    if (in->mesh()->shape() != out->mesh()->shape()) {
      classifyRooted(in, out, from, to, n);
      return n;
    }
    // A stage boundary: the same sharding, on another mesh (decompose-reshardings guarantees it).
    MF_CHECK(from.axes == to.axes, "a set that changes both the mesh and the sharding");
    n.kind = CommKind::SendRecv;  // send_to / recv_from are per rank: specialize-for-rank fills them
    return n;
  }
  int64_t axis = -1;
  for (size_t a = 0; a < to.axes.size(); ++a) {
    if (from.axes[a] == to.axes[a]) continue;
    MF_CHECK(axis < 0, "set changes several mesh axes: run decompose-reshardings first");
    axis = static_cast<int64_t>(a);
  }
  if (axis < 0) return std::nullopt;
  n.mesh_axis = axis;
  const Placement& f = from.axes[axis];
  const Placement& t = to.axes[axis];
  if (f.kind == Placement::Shard && t.kind == Placement::Replicate) {
    n.kind = CommKind::Allgather;
    n.in_dim = f.dim;
  } else if (f.kind == Placement::Replicate && t.kind == Placement::Shard) {
    return hir::ShardSlice{n.in, n.out, axis, t.dim};
  } else if (f.kind == Placement::Replicate && t.kind == Placement::Partial) {
    return hir::ShardSlice{n.in, n.out, axis, hir::ShardSlice::kPartition};
  } else if (f.kind == Placement::Shard && t.kind == Placement::Shard) {
    n.kind = CommKind::AllToAll;
    n.in_dim = f.dim;
    n.out_dim = t.dim;
  } else if (f.kind == Placement::Partial && t.kind == Placement::Replicate) {
    n.kind = CommKind::Allreduce;
  } else if (f.kind == Placement::Partial && t.kind == Placement::Shard) {
    n.kind = CommKind::ReduceScatter;
    n.out_dim = t.dim;
  } else {
    MF_CHECK(false, "no communication turns {} into {}", f.toString(), t.toString());
  }
  return n;
}

// Whether the set's node moves no data: a communication whose team is one device (a size-1 mesh
// axis), or where the device sending a replicated value to a single-device mesh is that device
// itself; a local slice among one device.
bool movesNoData(const HostNode& node) {
  if (const auto* s = node.as<hir::ShardSlice>()) return s->out.tv->mesh()->size(s->mesh_axis) == 1;
  const auto& n = std::get<hir::Communication>(node.node);
  if (n.kind == CommKind::SendRecv) {
    const DeviceMesh &a = *n.in.tv->mesh(), &b = *n.out.tv->mesh();
    return a.shape() != b.shape() && a.contains(b.devices()[0]);
  }
  const DeviceMesh& m = teamMesh(n);
  return (n.mesh_axis >= 0 ? m.size(n.mesh_axis) : m.size()) == 1;
}

}  // namespace

const DeviceMesh& teamMesh(const hir::Communication& n) {
  return n.kind == CommKind::Gather || n.kind == CommKind::Reduce ? *n.in.tv->mesh() : *n.out.tv->mesh();
}

HostNode gemmOnRows(const Segment& seg, int64_t index, const BlockRef& row_in, const BlockRef& row_out) {
  hir::Gemm n;
  n.segment = index;
  const Expr* gemm = seg.exprs.at(0);
  MF_CHECK(gemm->info().category == OpCategory::Gemm &&
               std::find(seg.inputs.begin(), seg.inputs.end(), gemm->input(size_t{0})) != seg.inputs.end(),
           "a GEMM launched on row blocks must read its row operand from outside its segment");
  for (const TensorView* in : seg.inputs) n.views.push_back(in == gemm->input(size_t{0}) ? row_in : BlockRef::of(in));
  for (const TensorView* o : seg.outputs) {
    BlockRef b = row_out;
    if (b.tv == seg.outputs.at(0)) b.tv = o;  // (a ring writes its last partial straight into the result)
    n.views.push_back(b);
  }
  return n;
}

std::vector<HostNode> segmentNodes(const Segment& seg, int64_t index, int64_t& handles) {
  if (seg.kind == Segment::Kind::Gemm) return {hir::Gemm{{index, {}}}};
  if (seg.kind == Segment::Kind::Kernel) return {hir::LaunchKernel{{index, {}}}};
  std::optional<HostNode> n = classifySet(seg.exprs.at(0));
  MF_CHECK(n.has_value(), "a communication segment whose set moves no data");
  auto* c = n->as<hir::Communication>();
  if (c == nullptr) return {*n};  // a local slice
  c->handle = handles++;
  return {*n, host::wait(c->handle)};
}

namespace {

// The segment whose exprs contain `e`.
int64_t segmentOf(const std::vector<Segment>& segments, const Expr* e) {
  for (size_t i = 0; i < segments.size(); ++i)
    if (std::find(segments[i].exprs.begin(), segments[i].exprs.end(), e) != segments[i].exprs.end())
      return static_cast<int64_t>(i);
  MF_CHECK(false, "{} is in no segment", e->name());
}

// A set that decompose-for-overlap paired with a GEMM (ring attention's sets are not: their loop
// is the attention's, lower_ring_attention.h).
bool overlapped(const Segment& seg) {
  return seg.kind == Segment::Kind::Communication && seg.exprs.at(0)->attr<std::string>("overlap") != "none" &&
         ringAttentionOf(seg.exprs.at(0)) == nullptr;
}
bool rotatesKeys(const Segment& seg) {
  return seg.kind == Segment::Kind::Communication && ringAttentionOf(seg.exprs.at(0)) != nullptr;
}

// The stream chunks of a GEMM segment whose output rows the user's schedule splits (a Stream
// split of dim 0; decompose-for-overlap checked it), or 1.
int64_t streamChunks(const Segment& seg) {
  if (seg.kind != Segment::Kind::Gemm || seg.exprs.at(0)->info().category != OpCategory::Gemm) return 1;
  std::optional<StreamSplit> s = streamSplitOf(seg.exprs[0]->output());
  return s && s->dim == 0 ? s->chunks : 1;
}

// A GEMM on stream chunks of its rows: iteration i computes rows [i of s] of the output from
// rows [i of s] of the row operand, the iterations on the stream pool.
void lowerStreamChunks(const Segment& seg, int64_t index, int64_t chunks, int64_t pool, std::vector<HostNode>& out) {
  for (const TensorView* o : seg.outputs) out.push_back(host::allocate(o));
  BlockRef rows = BlockRef::of(static_cast<const TensorView*>(seg.exprs.at(0)->input(size_t{0})));
  rows.blocks = chunks;
  rows.loop_coeffs = {1};
  BlockRef result = rows;
  result.tv = seg.outputs.at(0);
  out.push_back(host::loop(chunks, {gemmOnRows(seg, index, rows, result)}, pool));
}

}  // namespace

std::vector<Segment> hostSegments(const Fusion& fusion) {
  std::vector<Segment> segments = segmentFusion(fusion);
  // A resharding among one device moves no data: a local copy kernel.
  for (Segment& seg : segments) {
    if (seg.kind != Segment::Kind::Communication) continue;
    std::optional<HostNode> n = classifySet(seg.exprs.at(0));
    if (n && movesNoData(*n)) seg.kind = Segment::Kind::Kernel;
  }
  return segments;
}

HostProgram lowerToHostIr(std::shared_ptr<Fusion> fusion, const OverlapOptions& overlap) {
  HostProgram p;
  p.fusion = fusion;
  auto segments = std::make_shared<std::vector<Segment>>(hostSegments(*fusion));
  p.segments = segments;
  // Overlapped pairs: the loop replaces both segments, at the position of the first of them.
  std::map<int64_t, int64_t> partner;  // first segment of a pair -> the other
  for (size_t i = 0; i < segments->size(); ++i) {
    const Segment& seg = (*segments)[i];
    if (!overlapped(seg)) continue;
    const Expr* set = seg.exprs[0];
    bool gathers = set->output()->uses().size() == 1 && set->output()->uses()[0]->info().category == OpCategory::Gemm;
    const Expr* gemm = gathers ? set->output()->uses()[0] : set->input(size_t{0})->definition();
    int64_t g = segmentOf(*segments, gemm);
    MF_CHECK((*segments)[g].kind == Segment::Kind::Gemm && (*segments)[g].exprs[0] == gemm,
             "the GEMM of an overlapped set must start its own segment");
    partner[std::min<int64_t>(g, i)] = std::max<int64_t>(g, i);
  }
  if (isMicrobatched(*fusion)) {
    MF_USER_CHECK(partner.empty(), ErrorKind::Unsupported,
                  "overlap decomposition inside a microbatched pipeline is not supported");
    MF_USER_CHECK(std::none_of(segments->begin(), segments->end(), rotatesKeys), ErrorKind::Unsupported,
                  "ring attention inside a microbatched pipeline is not supported (use --cp=ulysses or gather)");
    lowerMicrobatched(*fusion, *segments, p.nodes);
    return p;
  }
  std::set<int64_t> done;
  OverlapLoweringState state;
  for (size_t i = 0; i < segments->size(); ++i) {
    if (done.count(i)) continue;
    const Segment& seg = (*segments)[i];
    if (auto it = partner.find(i); it != partner.end()) {
      int64_t comm = overlapped(seg) ? i : it->second, gemm = overlapped(seg) ? it->second : i;
      lowerOverlappedPair((*segments)[comm], (*segments)[gemm], gemm, overlap.streams, state, p.nodes);
      done.insert(it->second);
      continue;
    }
    if (rotatesKeys(seg)) continue;  // part of its attention's ring
    if (isRingAttention(seg)) {
      lowerRingAttention(*segments, static_cast<int64_t>(i), overlap.ring_groups, state, p.nodes);
      continue;
    }
    if (int64_t chunks = streamChunks(seg); chunks > 1) {
      lowerStreamChunks(seg, static_cast<int64_t>(i), chunks, overlap.streams, p.nodes);
      continue;
    }
    for (const TensorView* out : seg.outputs) p.nodes.push_back(host::allocate(out));
    for (HostNode& n : segmentNodes(seg, static_cast<int64_t>(i), state.handles)) p.nodes.push_back(std::move(n));
  }
  return p;
}

}  // namespace meshfuse
