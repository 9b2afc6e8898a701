// What a communication is, independent of who runs it: the collective kinds, the reduction of a
// pending sum (or max), a team of ranks, and one collective as reports list it. Decomposition
// emits these, the host IR carries them, and a Communicator (meshfuse/communicator.h) runs them;
// they live in the IR layer so that none of those layers reaches up into another for them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshfuse {

// How the contributions of a team are combined (Partial() is a pending Sum).
enum class ReduceOp { Sum, Max };

using Team = std::vector<int64_t>;  // global ranks, in mesh order; must contain this rank

// The collectives of the host IR, listed once. Per-rank pictures: meshfuse/communicator.h.
#define MESHFUSE_COMM_KINDS(X)                                                              \
  X(Allgather, "allgather") X(ReduceScatter, "reduce_scatter") X(Allreduce, "allreduce")   \
  X(AllToAll, "all_to_all") X(SendRecv, "send_recv") X(Broadcast, "broadcast")             \
  X(Reduce, "reduce") X(Gather, "gather") X(Scatter, "scatter")

enum class CommKind {
#define MESHFUSE_X(e, s) e,
  MESHFUSE_COMM_KINDS(MESHFUSE_X)
#undef MESHFUSE_X
};
const char* commKindName(CommKind k);

// One communication of a rank's program, as reports list it (a loop's count once per trip).
struct CollectiveInfo {
  CommKind kind;
  int64_t mesh_axis;
  Team team;
  int64_t bytes;           // bytes this rank contributes (0: a broadcast's or scatter's non-root)
  std::string tensor;      // the output's name
  std::string source;      // the input's name
  std::string provenance;  // why this collective exists
  int64_t root = -1;       // broadcast, scatter, gather, reduce: the root's global rank
  // An allgather or reduce-scatter of blocks of different sizes (uneven shards): the bytes this
  // rank sends where the backend needs equal counts and pads every block to the largest (NCCL);
  // 0 when the blocks are equal. (MPI sends `bytes`: its v-collectives take counts per rank.)
  int64_t padded_bytes = 0;
};

}  // namespace meshfuse
