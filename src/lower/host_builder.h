// The one builder of host nodes: every pass that makes nodes (lowering, its overlap and
// microbatch loops, assign-streams, insert-deallocations, the parser) makes them here, so a
// node's fields are filled the same way wherever it is made.
#pragma once

#include <cstdint>
#include <vector>

#include "lower/host_ir.h"

namespace meshfuse::host {

// A buffer of `tv`; with chunk_blocks > 1 a per-iteration buffer of chunk i of its rows (of each
// of `row_blocks` blocks of them: HostNode::row_blocks); `slot` > 0: a second buffer of the same
// type (ring steps).
HostNode allocate(const TensorView* tv, int64_t chunk_blocks = 1, int64_t slot = 0, int64_t row_blocks = 1);
HostNode deallocate(const TensorView* tv, int64_t chunk_blocks = 1, int64_t slot = 0, int64_t row_blocks = 1);
// A buffer in `slot` > 0 of one head group of `groups` of `tv` (BufferNode::head_groups).
HostNode allocateHeadGroup(const TensorView* tv, int64_t groups, int64_t slot);
// A communication of `kind` from `in` to `out` along `mesh_axis` (-1: between meshes) that
// returns handle `handle`; the other fields (dims, root, peers, team) are the caller's.
hir::Communication communication(CommKind kind, BlockRef in, BlockRef out, int64_t mesh_axis, int64_t handle);
HostNode wait(int64_t handle);
// A point-to-point exchange along `mesh_axis` returning handle `handle`: a ring step (`shift`
// places ahead; behind for what arrives) or, with `mirror`, with the rank at the mirrored place.
// `along_dim` >= 0: the blocks run along that dim (packed by the runtime), not dim 0.
hir::Communication sendRecv(BlockRef in, BlockRef out, int64_t mesh_axis, int64_t handle, int64_t shift,
                            bool mirror = false, int64_t along_dim = -1);
// `along_dim` >= 0: the blocks run along that dim, not dim 0 (a strided block copy).
HostNode copy(BlockRef in, BlockRef out, bool accumulate, int64_t along_dim = -1);
// A ring attention step: attention segment `segment` on `views` (its inputs then outputs), its
// rows at the global positions `query_blocks` and `key_blocks`, merged into what its outputs hold
// when `accumulate`.
HostNode attentionStep(int64_t segment, std::vector<BlockRef> views, bool accumulate,
                       std::vector<BlockRef> query_blocks, std::vector<BlockRef> key_blocks);
// A loop of `trips` iterations; `stream_pool` > 0: its iterations are independent and
// assign-streams runs them on a pool of that many streams.
HostNode loop(int64_t trips, std::vector<HostNode> body, int64_t stream_pool = 0);
// Later nodes run on `stream` (+ i % pool for the innermost loop's i when pool > 0).
HostNode onStream(int64_t stream, int64_t pool = 0);
// A RecordEvent, WaitEvent or HostWaitEvent of instance sum(coeffs[j] * i_j) + offset of `id`.
HostNode event(HostNodeKind kind, int64_t id, std::vector<int64_t> coeffs = {}, int64_t offset = 0);
HostNode sync();
// Block `(coeffs . i + rank_coeff * r + offset) mod blocks` of `tv` (r: this rank's index along
// `mesh_axis`); with sub_blocks > 1 the flat index of a grid of blocks / sub_blocks blocks, each
// cut into sub_blocks (BlockRef).
BlockRef block(const TensorView* tv, int64_t blocks, std::vector<int64_t> coeffs, int64_t rank_coeff, int64_t offset,
               int64_t mesh_axis, int64_t slot = 0, int64_t sub_blocks = 1);
// Head group `(coeffs . i + offset) mod groups` of `tv`'s buffer in `slot` (BlockRef::heads).
BlockRef headGroup(const TensorView* tv, int64_t groups, std::vector<int64_t> coeffs, int64_t offset, int64_t slot = 0);

}  // namespace meshfuse::host
