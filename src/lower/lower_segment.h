// Pieces of lower-to-host-ir shared by its loop lowerings (overlap, microbatches).
#pragma once

#include <cstdint>
#include <vector>

#include "lower/host_ir.h"
#include "meshfuse/ir/device_mesh.h"

namespace meshfuse {

// (Plain node builders: lower/host_builder.h.)

// A Gemm node that launches GEMM segment `index` on blocks of rows: `row_in` is the block of
// the GEMM's row operand (its first operand), `row_out` the block its first output goes to (a
// fused epilogue's outputs follow the same rows); every other input is whole.
HostNode gemmOnRows(const Segment& seg, int64_t index, const BlockRef& row_in, const BlockRef& row_out);
// The mesh whose devices a Communication node's team is drawn from: the source mesh of a gather
// or reduce, the target mesh of everything else. The team is that mesh's slice along
// `mesh_axis` through the root (through this rank when there is none), or the whole mesh when
// mesh_axis < 0.
const DeviceMesh& teamMesh(const hir::Communication& n);
// The segments lower-to-host-ir runs: segmentFusion's, with a resharding that moves no data (a
// team of one device) made a local copy kernel. (The host-IR parser segments a parsed fusion
// the same way.)
std::vector<Segment> hostSegments(const Fusion& fusion);
// The nodes that run segment `index`: a Gemm or LaunchKernel node; a Communication and its
// Wait (taking the next handle); or a local slice.
std::vector<HostNode> segmentNodes(const Segment& seg, int64_t index, int64_t& handles);

}  // namespace meshfuse
