// lower-to-host-ir: one host node sequence for a decomposed fusion (all ranks together).
//
// requires: decompose-reshardings (each `set` changes at most one mesh axis).
// guarantees: every computed TensorView is allocated before it is written; every `set` that
//   changes a sharding is one Communication (+ its Wait) or a ShardSlice; linear/matmul are
//   Gemm nodes, every other op a LaunchKernel. Waits follow their communication at once (the
//   overlap issue moves them).
#include "meshfuse/host_ir.h"
#include "meshfuse/ir/fusion.h"
#include "propagation/sharding.h"

namespace meshfuse {
namespace {

// Fills `n` for the resharding set `e`; returns false when the set moves no data (a copy).
bool classifySet(const Expr* e, HostNode& n) {
  const TensorView* in = static_cast<const TensorView*>(e->input(size_t{0}));
  const TensorView* out = e->output();
  Sharding from = readSharding(in), to = readSharding(out);
  MF_USER_CHECK(in->mesh() && out->mesh() && *in->mesh() == *out->mesh(), ErrorKind::Unsupported,
                "set: moving data between meshes (pipeline stages) is not supported yet");
  n.in = BlockRef::of(in);
  n.out = BlockRef::of(out);
  int64_t axis = -1;
  for (size_t a = 0; a < to.axes.size(); ++a) {
    if (from.axes[a] == to.axes[a]) continue;
    MF_CHECK(axis < 0, "set changes several mesh axes: run decompose-reshardings first");
    axis = static_cast<int64_t>(a);
  }
  if (axis < 0) return false;
  n.mesh_axis = axis;
  const Placement& f = from.axes[axis];
  const Placement& t = to.axes[axis];
  n.kind = HostNodeKind::Communication;
  if (f.kind == Placement::Shard && t.kind == Placement::Replicate) {
    n.comm = CommKind::Allgather;
    n.in_dim = f.dim;
  } else if (f.kind == Placement::Replicate && t.kind == Placement::Shard) {
    n.kind = HostNodeKind::ShardSlice;
    n.out_dim = t.dim;
  } else if (f.kind == Placement::Shard && t.kind == Placement::Shard) {
    n.comm = CommKind::AllToAll;
    n.in_dim = f.dim;
    n.out_dim = t.dim;
  } else if (f.kind == Placement::Partial && t.kind == Placement::Replicate) {
    n.comm = CommKind::Allreduce;
  } else if (f.kind == Placement::Partial && t.kind == Placement::Shard) {
    n.comm = CommKind::ReduceScatter;
    n.out_dim = t.dim;
  } else {
    MF_CHECK(false, "no communication turns {} into {}", f.toString(), t.toString());
  }
  return true;
}

}  // namespace

HostProgram lowerToHostIr(std::shared_ptr<Fusion> fusion) {
  HostProgram p;
  p.fusion = fusion;
  auto segments = std::make_shared<std::vector<Segment>>(segmentFusion(*fusion));
  // A resharding on a mesh axis of one device moves no data: a local copy kernel.
  for (Segment& seg : *segments) {
    HostNode n;
    if (seg.kind == Segment::Kind::Communication && classifySet(seg.exprs.at(0), n) &&
        seg.exprs[0]->output()->mesh()->size(n.mesh_axis) == 1)
      seg.kind = Segment::Kind::Kernel;
  }
  p.segments = segments;
  int64_t handles = 0;
  for (size_t i = 0; i < segments->size(); ++i) {
    const Segment& seg = (*segments)[i];
    for (const TensorView* out : seg.outputs) {
      HostNode alloc;
      alloc.kind = HostNodeKind::Allocate;
      alloc.tv = out;
      p.nodes.push_back(alloc);
    }
    HostNode n;
    n.segment = static_cast<int64_t>(i);
    if (seg.kind == Segment::Kind::Communication) {
      bool moves_data = classifySet(seg.exprs.at(0), n);
      MF_CHECK(moves_data, "a communication segment whose set moves no data");
      n.segment = -1;
      if (n.kind == HostNodeKind::Communication) {
        n.handle = handles++;
        p.nodes.push_back(n);
        HostNode w;
        w.kind = HostNodeKind::Wait;
        w.handle = n.handle;
        p.nodes.push_back(w);
        continue;
      }
    } else {
      n.kind = seg.kind == Segment::Kind::Gemm ? HostNodeKind::Gemm : HostNodeKind::LaunchKernel;
    }
    p.nodes.push_back(n);
  }
  return p;
}

}  // namespace meshfuse
