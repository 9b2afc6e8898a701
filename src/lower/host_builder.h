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
// A communication of `kind` from `in` to `out` along `mesh_axis` (-1: between meshes) that
// returns handle `handle`; the other fields (dims, root, peers, team) are the caller's.
hir::Communication communication(CommKind kind, BlockRef in, BlockRef out, int64_t mesh_axis, int64_t handle);
HostNode wait(int64_t handle);
HostNode copy(BlockRef in, BlockRef out, bool accumulate);
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

}  // namespace meshfuse::host
