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

HostNode allocate(const TensorView* tv, int64_t chunk_blocks, int64_t slot, int64_t row_blocks) {
  HostNode n = node(HostNodeKind::Allocate);
  n.tv = tv;
  n.chunk_blocks = chunk_blocks;
  n.slot = slot;
  n.row_blocks = row_blocks;
  return n;
}

HostNode deallocate(const TensorView* tv, int64_t chunk_blocks, int64_t slot, int64_t row_blocks) {
  HostNode n = allocate(tv, chunk_blocks, slot, row_blocks);
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

HostNode copy(BlockRef in, BlockRef out, bool accumulate) {
  HostNode n = node(HostNodeKind::Copy);
  n.in = std::move(in);
  n.out = std::move(out);
  n.accumulate = accumulate;
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
               int64_t mesh_axis, int64_t slot, int64_t sub_blocks) {
  BlockRef b = BlockRef::of(tv, slot);
  b.blocks = blocks;
  b.sub_blocks = sub_blocks;
  b.loop_coeffs = std::move(coeffs);
  b.rank_coeff = rank_coeff;
  b.offset = offset;
  b.mesh_axis = mesh_axis;
  return b;
}

}  // namespace meshfuse::host
