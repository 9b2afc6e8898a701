// Pieces of lower-to-host-ir shared by its loop lowerings (overlap, microbatches).
#pragma once

#include <cstdint>
#include <vector>

#include "meshfuse/host_ir.h"
#include "meshfuse/ir/device_mesh.h"

namespace meshfuse {

// An Allocate of `tv` (one block of `chunk_blocks` along dim 0 when > 1).
HostNode allocateNode(const TensorView* tv, int64_t chunk_blocks = 1);
// The mesh whose devices a Communication node's team is drawn from: the source mesh of a gather
// or reduce, the target mesh of everything else. The team is that mesh's slice along
// `mesh_axis` through the root (through this rank when there is none), or the whole mesh when
// mesh_axis < 0.
const DeviceMesh& teamMesh(const HostNode& n);
// The nodes that run segment `index`: a Gemm or LaunchKernel node; a Communication and its
// Wait (taking the next handle); or a local slice.
std::vector<HostNode> segmentNodes(const Segment& seg, int64_t index, int64_t& handles);

}  // namespace meshfuse
