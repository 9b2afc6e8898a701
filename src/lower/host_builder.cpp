// The host-node builder (host_builder.h).
#include "lower/host_builder.h"

#include "meshfuse/error.h"

namespace meshfuse::host {

HostNode allocate(const TensorView* tv, int64_t chunk_blocks, int64_t slot, int64_t row_blocks) {
  return hir::Allocate{{tv, slot, chunk_blocks, row_blocks}};
}

HostNode deallocate(const TensorView* tv, int64_t chunk_blocks, int64_t slot, int64_t row_blocks) {
  return hir::Deallocate{{tv, slot, chunk_blocks, row_blocks}};
}

hir::Communication communication(CommKind kind, BlockRef in, BlockRef out, int64_t mesh_axis, int64_t handle) {
  hir::Communication c;
  c.kind = kind;
  c.in = std::move(in);
  c.out = std::move(out);
  c.mesh_axis = mesh_axis;
  c.handle = handle;
  return c;
}

HostNode wait(int64_t handle) { return hir::Wait{handle}; }

hir::Communication sendRecv(BlockRef in, BlockRef out, int64_t mesh_axis, int64_t handle, int64_t shift, bool mirror,
                            int64_t along_dim) {
  hir::Communication c = communication(CommKind::SendRecv, std::move(in), std::move(out), mesh_axis, handle);
  c.shift = shift;
  c.mirror = mirror;
  c.in_dim = along_dim;
  return c;
}

HostNode copy(BlockRef in, BlockRef out, bool accumulate, int64_t along_dim) {
  hir::Copy c{std::move(in), std::move(out), accumulate};
  c.along_dim = along_dim;
  return c;
}

HostNode attentionStep(int64_t segment, std::vector<BlockRef> views, bool accumulate,
                       std::vector<BlockRef> query_blocks, std::vector<BlockRef> key_blocks) {
  hir::Gemm g;
  g.segment = segment;
  g.views = std::move(views);
  g.accumulate = accumulate;
  g.query_blocks = std::move(query_blocks);
  g.key_blocks = std::move(key_blocks);
  return g;
}

HostNode loop(int64_t trips, std::vector<HostNode> body, int64_t stream_pool) {
  return hir::ForLoop{trips, std::move(body), stream_pool};
}

HostNode onStream(int64_t stream, int64_t pool) { return hir::SetCurrentStream{stream, pool}; }

HostNode event(HostNodeKind kind, int64_t id, std::vector<int64_t> coeffs, int64_t offset) {
  hir::EventNode e{id, std::move(coeffs), offset};
  switch (kind) {
    case HostNodeKind::RecordEvent: return hir::RecordEvent{std::move(e)};
    case HostNodeKind::WaitEvent: return hir::WaitEvent{std::move(e)};
    case HostNodeKind::HostWaitEvent: return hir::HostWaitEvent{std::move(e)};
    default: MF_CHECK(false, "host::event of a {} node", hostNodeKeyword(kind));
  }
}

HostNode sync() { return hir::Synchronize{}; }

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

HostNode allocateHeadGroup(const TensorView* tv, int64_t groups, int64_t slot) {
  hir::Allocate a{{tv, slot, 1, 1}};
  a.head_groups = groups;
  return a;
}

BlockRef headGroup(const TensorView* tv, int64_t groups, std::vector<int64_t> coeffs, int64_t offset, int64_t slot) {
  BlockRef b = block(tv, groups, std::move(coeffs), 0, offset, -1, slot);
  b.heads = true;
  return b;
}

}  // namespace meshfuse::host
