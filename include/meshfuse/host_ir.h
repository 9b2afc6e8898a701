// Host IR: the per-rank program the runtime interprets (DESIGN.md "Host IR").
//
// Node kinds are listed once (MESHFUSE_HOST_NODES); the printer and the evaluator dispatch on
// that list. Each node names the TensorViews of the decomposed Fusion it reads and writes; the
// runtime gives each TensorView a local (per-rank) buffer of localShape(tv).
//
//   allocate %3                         a local buffer for %3
//   gemm #1 (%inp, %up_w) -> (%3)       segment #1: a library GEMM (BLAS / cuBLASLt)
//   launch #2 (%3) -> (%4)              segment #2: a generated kernel (gelu, ...)
//   comm h0 allreduce %4 -> %5 axis 0 team [0, 1, 2, 3]   starts a collective; returns handle h0
//   wait h0                             blocks until handle h0 completes
//   slice %6 = %5 dim 0 axis 0          Replicate -> Shard: keeps this rank's slice, no comm
//   deallocate %3                       frees %3 after its last use
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "meshfuse/ir/extent.h"
#include "meshfuse/runtime/communicator.h"
#include "meshfuse/segment.h"

namespace meshfuse {

class Fusion;
class Expr;
class TensorView;

#define MESHFUSE_HOST_NODES(X) \
  X(Allocate, "allocate")      \
  X(Deallocate, "deallocate")  \
  X(LaunchKernel, "launch")    \
  X(Gemm, "gemm")              \
  X(Communication, "comm")     \
  X(Wait, "wait")              \
  X(ShardSlice, "slice")

enum class HostNodeKind {
#define MESHFUSE_X(e, s) e,
  MESHFUSE_HOST_NODES(MESHFUSE_X)
#undef MESHFUSE_X
};

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

struct HostNode {
  HostNodeKind kind = HostNodeKind::Allocate;
  int64_t segment = -1;            // LaunchKernel, Gemm: index into HostProgram::segments
  const TensorView* tv = nullptr;  // Allocate, Deallocate
  const TensorView* in = nullptr;  // Communication, ShardSlice
  const TensorView* out = nullptr; // Communication, ShardSlice
  // Communication
  CommKind comm = CommKind::Allreduce;
  ReduceOp reduce_op = ReduceOp::Sum;
  int64_t mesh_axis = -1;  // also ShardSlice
  Team team;               // global ranks (filled by specialize-for-rank)
  int64_t root = -1;
  int64_t in_dim = -1;     // the dims() index sharded in `in` (allgather, all-to-all)
  int64_t out_dim = -1;    // the dims() index sharded in `out` (reduce-scatter, all-to-all, slice)
  int64_t handle = -1;     // Communication, Wait
};

struct HostProgram {
  std::shared_ptr<Fusion> fusion;  // the decomposed fusion the nodes refer to
  std::shared_ptr<const std::vector<Segment>> segments;  // what LaunchKernel/Gemm nodes run
  int64_t rank = -1;               // -1: the collective program of all ranks
  std::vector<HostNode> nodes;
  const Segment& segment(const HostNode& n) const { return segments->at(n.segment); }
  std::string toString() const;
};

// lower-to-host-ir: the collective host program of a decomposed fusion.
HostProgram lowerToHostIr(std::shared_ptr<Fusion> fusion);
// specialize-for-rank: keeps only `rank`'s work (MPMD) and resolves every team to global ranks.
HostProgram specializeForRank(const HostProgram& program, int64_t rank);
// insert-deallocations: frees each intermediate right after its last use.
void insertDeallocations(HostProgram& program);

// Bytes `rank` holds at its peak while running `program` (inputs included), for the given
// bindings of symbolic sizes.
int64_t peakMemoryBytes(const HostProgram& program, const SymbolBindings& bindings);

// The communications of a specialized program, for reports.
struct CollectiveInfo {
  CommKind kind;
  int64_t mesh_axis;
  Team team;
  int64_t bytes;  // bytes this rank contributes (its send buffer)
  std::string tensor;      // the output's name
  std::string source;      // the input's name
  std::string provenance;  // why this collective exists
};
std::vector<CollectiveInfo> collectives(const HostProgram& program, const SymbolBindings& bindings);

}  // namespace meshfuse
