// Host IR: the per-rank program the runtime interprets (DESIGN.md "Host IR").
//
// Node kinds are listed once (MESHFUSE_HOST_NODES); the printer, the passes and the evaluator
// dispatch on that list. Nodes name TensorViews of the decomposed Fusion; the runtime gives each
// TensorView a local (per-rank) buffer of localShape(tv). Inside a `for` loop a node may touch a
// block of a tensor's dim 0 (a BlockRef), which is how stream chunks and ring steps are written.
//
//   allocate %3 : f32[?t, 64]                 a local buffer for %3 (or one block of it)
//   gemm #1 %3 = linear(%inp, %up_w)          segment #1: a library GEMM (BLAS / cuBLASLt)
//   launch #2 %4 = gelu(%3)                   segment #2: a generated kernel
//   comm h0 allreduce %4 -> %5 ...            starts a collective; returns handle h0
//   wait h0                                   blocks the current stream until h0 completes
//   slice %6 = %5 dim 0 axis 0                Replicate -> Shard: keeps this rank's block, no comm
//   copy %x -> %g[r of 4]  /  add %t -> %acc   a local copy, or an accumulation (ring reductions)
//   deallocate %3                             frees %3 after its last use
//   for i in [0, 4) { ... }                   a Stream-parallel loop (chunks, ring steps, microbatches)
//   for i in [0, 4) on 2 streams { ... }      independent iterations on a pool of streams (before
//                                             assign-streams places them)
//   stream 2                                  later nodes run on stream 2 (0: the main stream)
//   record e0 / wait e0                       cross-stream order: an event and a wait for it
//   host_wait e1[i - 2]                       the host waits for the event: it runs at most 2
//                                             iterations ahead (their buffers bound the memory)
//   sync                                      the main stream waits for every stream (join)
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "meshfuse/ir/extent.h"
#include "meshfuse/options.h"
#include "meshfuse/runtime/communicator.h"
#include "meshfuse/segment.h"

namespace meshfuse {

class Fusion;
class Expr;
class TensorView;

#define MESHFUSE_HOST_NODES(X)    \
  X(Allocate, "allocate")         \
  X(Deallocate, "deallocate")     \
  X(LaunchKernel, "launch")       \
  X(Gemm, "gemm")                 \
  X(Communication, "comm")        \
  X(Wait, "wait")                 \
  X(ShardSlice, "slice")          \
  X(Copy, "copy")                 \
  X(ForLoop, "for")               \
  X(SetCurrentStream, "stream")   \
  X(RecordEvent, "record")        \
  X(WaitEvent, "wait_event")      \
  X(HostWaitEvent, "host_wait")   \
  X(Synchronize, "sync")

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

// A tensor, or one block of the rows (dim 0) of its local buffer. The rows are cut as
// torch.chunk cuts them (leading blocks ceil(rows / parts), trailing ones less, possibly none),
// in two levels: into blocks / sub_blocks blocks (a rank's block of a gathered tensor, say), each
// cut again into sub_blocks (a stream chunk of it). The block's flat index is (sum_j
// loop_coeffs[j] * i_j + rank_coeff * r + offset) mod blocks, with i_j the variables of the
// enclosing loops (outermost first) and r this rank's index along `mesh_axis` (ring algorithms
// walk the blocks of other ranks); flat index f is sub-block f % sub_blocks of block
// f / sub_blocks. With even sizes the two levels are `blocks` equal blocks.
struct BlockRef {
  const TensorView* tv = nullptr;
  int64_t slot = 0;  // 0: the tensor's buffer; k > 0: a temporary of the same type (ring steps)
  int64_t blocks = 1;
  int64_t sub_blocks = 1;  // divides blocks
  std::vector<int64_t> loop_coeffs;
  int64_t rank_coeff = 0, offset = 0;
  int64_t mesh_axis = -1;
  static BlockRef of(const TensorView* tv, int64_t slot = 0) {  // the whole tensor
    BlockRef r;
    r.tv = tv;
    r.slot = slot;
    return r;
  }
  bool whole() const { return blocks == 1; }
  // "%x", "%x~1" (slot 1), "%x[(2*i0 - 2*r + i1) % 4 of 4]", "%x[(2*i0 + i1) % 4 of 2x2]" (2
  // blocks of 2 sub-blocks)
  std::string toString(const Fusion& f) const;
};

struct HostNode {
  HostNodeKind kind = HostNodeKind::Allocate;
  // Allocate / Deallocate: the tensor. Allocate with chunk_blocks = c > 1 makes a per-iteration
  // buffer inside a loop: in iteration i of the innermost loop it holds chunk i of c of the
  // tensor's rows, or with row_blocks = n > 1 chunk i of c of each of the n blocks of its rows
  // (the i-th chunks of every rank's block, which one collective of an overlap loop moves). A
  // BlockRef into such a buffer names the rows of its block that the buffer holds.
  const TensorView* tv = nullptr;
  int64_t slot = 0;  // see BlockRef::slot
  int64_t chunk_blocks = 1;
  int64_t row_blocks = 1;
  // LaunchKernel, Gemm: index into HostProgram::segments, and the blocks it touches, aligned
  // with the segment's inputs then outputs (empty: every tensor whole).
  int64_t segment = -1;
  std::vector<BlockRef> views;
  // Communication, ShardSlice, Copy: what it reads and writes.
  BlockRef in, out;
  bool accumulate = false;  // Copy: out += in instead of out = in
  CommKind comm = CommKind::Allreduce;
  ReduceOp reduce_op = ReduceOp::Sum;
  int64_t mesh_axis = -1;  // the mesh axis whose slice is the team (also ShardSlice)
  Team team;               // global ranks (filled by specialize-for-rank)
  int64_t root = -1;
  int64_t in_dim = -1;     // dims() index sharded in `in` (allgather, all-to-all)
  int64_t out_dim = -1;    // dims() index sharded in `out` (reduce-scatter, all-to-all, slice)
  // SendRecv: a ring step along mesh_axis sends to the rank `shift` places ahead and receives
  // from the one `shift` behind; a stage boundary sends to `send_to`'s rank and receives from
  // `recv_from`'s (global ranks; -1: this rank does not send / receive).
  int64_t shift = 0;
  int64_t send_to = -1, recv_from = -1;
  int64_t handle = -1;     // Communication, Wait
  // ForLoop
  int64_t trip_count = 0;
  std::vector<HostNode> body;
  // SetCurrentStream: `stream`, or with stream_pool > 0 stream + (i mod stream_pool) for the
  // innermost loop's variable i (each iteration on its own stream of a bounded pool).
  // ForLoop: stream_pool > 0 says its iterations are independent and rotate through that many
  // streams; assign-streams makes it explicit (stream, event and join nodes) and clears it.
  int64_t stream = 0;
  int64_t stream_pool = 0;
  // RecordEvent / WaitEvent / HostWaitEvent: instance (sum_j event_coeffs[j] * i_j + event_offset) of event
  // `event` (i_j: the enclosing loops' variables, outermost first); a wait for a negative
  // instance is a no-op. So an event recorded per iteration of `for i` is waited for by the next
  // iteration with coeffs {1}, offset -1.
  int64_t event = -1;
  std::vector<int64_t> event_coeffs;
  int64_t event_offset = 0;
};

struct HostProgram {
  std::shared_ptr<Fusion> fusion;  // the decomposed fusion the nodes refer to
  std::shared_ptr<const std::vector<Segment>> segments;  // what LaunchKernel/Gemm nodes run
  int64_t rank = -1;               // -1: the collective program of all ranks
  std::vector<HostNode> nodes;
  const Segment& segment(const HostNode& n) const { return segments->at(n.segment); }
  std::string toString() const;
};

// lower-to-host-ir: the collective host program of a decomposed fusion; sets marked by
// decompose-for-overlap and GEMMs whose rows a Stream split chunks become Stream-parallel loops
// (chunks on a pool of `overlap.streams` streams, ring steps beside the GEMMs).
HostProgram lowerToHostIr(std::shared_ptr<Fusion> fusion, const OverlapOptions& overlap = {});
// specialize-for-rank: keeps only `rank`'s work (MPMD) and resolves every team to global ranks.
HostProgram specializeForRank(const HostProgram& program, int64_t rank);
// insert-deallocations: frees each intermediate right after its last use.
void insertDeallocations(HostProgram& program);

// Bytes `rank` holds at its peak while running `program` (inputs included), for the given
// bindings of symbolic sizes. Allocations count in program order, except in loops: the host runs
// ahead of the streams, and an iteration's buffers stay alive until its tasks ran, so a loop
// holds the buffers of as many iterations as may be in flight (the k of a `host_wait e[i - k]`
// that starts its body, else every iteration).
int64_t peakMemoryBytes(const HostProgram& program, const SymbolBindings& bindings);

// The communications of a specialized program, for reports (a loop's count once per trip).
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
std::vector<CollectiveInfo> collectives(const HostProgram& program, const SymbolBindings& bindings);

class BufferSizes;
// The elements each member of communication n's team passes for the block `ref` (in team
// order: a v-collective's counts), in the iteration `loops` of the enclosing loops.
std::vector<int64_t> memberElements(const BufferSizes& sizes, const HostNode& n, const BlockRef& ref,
                                    const std::vector<int64_t>& loops);
// CollectiveInfo::padded_bytes of communication n on `sizes`' rank, in iteration `loops`.
int64_t paddedBytes(const BufferSizes& sizes, const HostNode& n, const std::vector<int64_t>& loops);

// The parsable text of a host program (parseHostModule reads it back): the decomposed fusion
// its nodes refer to, then the program.
std::string printHostModule(const HostProgram& program);
// Reads printHostModule's text back (src/lower/host_ir_parser.cpp): the fusion is parsed and
// segmented as lower-to-host-ir segments it; every node is checked against it. Malformed text
// is a ParseError with the line; the program is not verified (verifyHostIr does that).
HostProgram parseHostModule(std::string_view text, std::string_view path = "<input>");

// One node as the host program prints it (a loop as its header only), for messages.
std::string printHostNode(const HostProgram& program, const HostNode& node);

// The geometry of blocks and buffers, on any rank of a program, for given size bindings: the
// one place that says which rows a BlockRef or a per-iteration buffer covers. The evaluator
// slices its buffers with it, and the reports and check-collectives count with it, so every
// count a rank passes to a collective is the one its peers expect of it. `rank` is a global
// rank (a tensor's local shape, and a rank-relative block index, depend on it); `loops` are the
// values of the enclosing loop variables, outermost first (empty, or zeros: a per-iteration
// buffer's first chunk, which is the largest).
class BufferSizes {
 public:
  BufferSizes(const HostProgram& program, const SymbolBindings& bindings);
  // The local shape of `tv` on `rank` (cached).
  const std::vector<int64_t>& localShape(const TensorView* tv, int64_t rank) const;
  // The shape of the buffer of (tv, slot) allocated in iteration `loops`.
  std::vector<int64_t> bufferShape(const TensorView* tv, int64_t slot, int64_t rank,
                                   const std::vector<int64_t>& loops) const;
  // The rows of its buffer that `ref` names (its first row there, and how many).
  Span rows(const BlockRef& ref, int64_t rank, const std::vector<int64_t>& loops) const;
  std::vector<int64_t> shape(const BlockRef& ref, int64_t rank, const std::vector<int64_t>& loops) const;
  int64_t elements(const BlockRef& ref, int64_t rank, const std::vector<int64_t>& loops) const;
  int64_t bytes(const BlockRef& ref, int64_t rank, const std::vector<int64_t>& loops) const;
  // Bytes of the buffer an Allocate node makes, in the loops' first iteration (the largest).
  int64_t allocationBytes(const HostNode& allocate, int64_t rank) const;

 private:
  struct Chunking {
    int64_t chunk_blocks, row_blocks;
  };
  std::vector<Span> bufferRows(const TensorView* tv, int64_t slot, int64_t rank,
                               const std::vector<int64_t>& loops) const;

  const SymbolBindings& bindings_;
  std::map<std::pair<const TensorView*, int64_t>, Chunking> chunked_;  // per-iteration buffers
  mutable std::map<std::pair<const TensorView*, int64_t>, std::vector<int64_t>> shapes_;
};

// Calls `fn` on every node, loop bodies included (pre-order); `nodes` may be const.
template <typename Nodes, typename F>
void forEachNode(Nodes& nodes, F&& fn) {
  for (auto& n : nodes) {
    fn(n);
    forEachNode(n.body, fn);
  }
}

}  // namespace meshfuse
