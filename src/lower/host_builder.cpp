// The host-node builder (host_builder.h).
#include "lower/host_builder.h"

namespace meshfuse::host {
namespace {

HostNode node(HostNodeKind kind) {
  HostNode n;
  n.kind = kind;
  return n;
}

}  // namespace

HostNode allocate(const TensorView* tv, int64_t chunk_blocks, int64_t slot) {
  HostNode n = node(HostNodeKind::Allocate);
  n.tv = tv;
  n.chunk_blocks = chunk_blocks;
  n.slot = slot;
  return n;
}

HostNode deallocate(const TensorView* tv, int64_t chunk_blocks, int64_t slot) {
  HostNode n = allocate(tv, chunk_blocks, slot);
  n.kind = HostNodeKind::Deallocate;
  return n;
}

HostNode communication(CommKind kind, BlockRef in, BlockRef out, int64_t mesh_axis, int64_t handle) {
  HostNode n = node(HostNodeKind::Communication);
  n.comm = kind;
  n.in = std::move(in);
  n.out = std::move(out);
  n.mesh_axis = mesh_axis;
  n.handle = handle;
  return n;
}

HostNode wait(int64_t handle) {
  HostNode n = node(HostNodeKind::Wait);
  n.handle = handle;
  return n;
}

HostNode sendRecv(BlockRef in, BlockRef out, int64_t mesh_axis, int64_t handle, int64_t shift, bool mirror,
                  int64_t along_dim) {
  HostNode n = communication(CommKind::SendRecv, std::move(in), std::move(out), mesh_axis, handle);
  n.shift = shift;
  n.mirror = mirror;
  n.in_dim = along_dim;
  return n;
}

HostNode copy(BlockRef in, BlockRef out, bool accumulate, int64_t along_dim) {
  HostNode n = node(HostNodeKind::Copy);
  n.in = std::move(in);
  n.out = std::move(out);
  n.accumulate = accumulate;
  n.in_dim = along_dim;
  return n;
}

HostNode attentionStep(int64_t segment, std::vector<BlockRef> views, bool accumulate,
                       std::vector<BlockRef> query_blocks, std::vector<BlockRef> key_blocks) {
  HostNode n = node(HostNodeKind::Gemm);
  n.segment = segment;
  n.views = std::move(views);
  n.accumulate = accumulate;
  n.query_blocks = std::move(query_blocks);
  n.key_blocks = std::move(key_blocks);
  return n;
}

HostNode loop(int64_t trips, std::vector<HostNode> body, int64_t stream_pool) {
  HostNode n = node(HostNodeKind::ForLoop);
  n.trip_count = trips;
  n.body = std::move(body);
  n.stream_pool = stream_pool;
  return n;
}

HostNode onStream(int64_t stream, int64_t pool) {
  HostNode n = node(HostNodeKind::SetCurrentStream);
  n.stream = stream;
  n.stream_pool = pool;
  return n;
}

HostNode event(HostNodeKind kind, int64_t id, std::vector<int64_t> coeffs, int64_t offset) {
  HostNode n = node(kind);
  n.event = id;
  n.event_coeffs = std::move(coeffs);
  n.event_offset = offset;
  return n;
}

HostNode sync() { return node(HostNodeKind::Synchronize); }

BlockRef block(const TensorView* tv, int64_t blocks, std::vector<int64_t> coeffs, int64_t rank_coeff, int64_t offset,
               int64_t mesh_axis, int64_t slot) {
  BlockRef b = BlockRef::of(tv, slot);
  b.blocks = blocks;
  b.loop_coeffs = std::move(coeffs);
  b.rank_coeff = rank_coeff;
  b.offset = offset;
  b.mesh_axis = mesh_axis;
  return b;
}

}  // namespace meshfuse::host
