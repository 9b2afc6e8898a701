// Host IR: the per-rank program the runtime interprets (DESIGN.md "Host IR").
//
// Node kinds are listed once (host_nodes.def), each a small struct of named fields (namespace
// hir) held in HostNode's std::variant; the printer, parser, verifier and evaluator dispatch with
// std::visit, and every pass makes nodes through one builder (host_builder.h). Nodes name TensorViews of the decomposed Fusion; the runtime gives each
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
//   gemm #3 (%q, %k~1, %v~1) -> (%o, %lse) {sdpa, sdpa_lse} accumulate rows (%q[r of 4])
//     keys (%k[(r - i - 1) % 4 of 4])         a ring attention step: positions of its rows,
//                                             merged into the online softmax its outputs hold
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
#include <type_traits>
#include <variant>
#include <vector>

#include "meshfuse/ir/extent.h"
#include "meshfuse/options.h"
#include "meshfuse/ir/collective.h"
#include "lower/segment.h"

namespace meshfuse {

class Fusion;
class Expr;
class TensorView;

// A tensor, or one block of the rows (dim 0) of its local buffer. The rows are cut as
// torch.chunk cuts them (leading blocks ceil(rows / parts), trailing ones less, possibly none),
// in two levels: into blocks / sub_blocks blocks (a rank's block of a gathered tensor, say), each
// cut again into sub_blocks (a stream chunk of it). The block's flat index is (sum_j
// loop_coeffs[j] * i_j + rank_coeff * r + offset) mod blocks, with i_j the variables of the
// enclosing loops (outermost first) and r this rank's index along `mesh_axis` (ring algorithms
// walk the blocks of other ranks); flat index f is sub-block f % sub_blocks of block
// f / sub_blocks. With even sizes the two levels are `blocks` equal blocks.
// With `heads`, the blocks cut the flattened leading dims [batch, heads] of an attention operand
// instead (a ring's head groups, lower_ring_attention.h): `blocks` equal groups of
// batch * heads / blocks consecutive (batch, head) pairs, seen as [1, F, ...] or [F / heads,
// heads, ...] (headGroupShape); they are contiguous, so no staging is needed to send one.
struct BlockRef {
  const TensorView* tv = nullptr;
  int64_t slot = 0;  // 0: the tensor's buffer; k > 0: a temporary of the same type (ring steps)
  int64_t blocks = 1;
  int64_t sub_blocks = 1;  // divides blocks
  std::vector<int64_t> loop_coeffs;
  int64_t rank_coeff = 0, offset = 0;
  int64_t mesh_axis = -1;
  bool heads = false;
  static BlockRef of(const TensorView* tv, int64_t slot = 0) {  // the whole tensor
    BlockRef r;
    r.tv = tv;
    r.slot = slot;
    return r;
  }
  bool whole() const { return blocks == 1; }
  // "%x", "%x~1" (slot 1), "%x[(2*i0 - 2*r + i1) % 4 of 4]", "%x[(2*i0 + i1) % 4 of 2x2]" (2
  // blocks of 2 sub-blocks), "%x[i0 of 4 heads]" (head group i0 of 4)
  std::string toString(const Fusion& f) const;
};

struct HostNode;

// The node structs (host_nodes.def lists them). Each comment says what the node does on the rank
// that runs it; every field is named.
namespace hir {

// A buffer of `tv` (or, with slot k > 0, a second buffer of the same type: ring steps).
// chunk_blocks = c > 1: a per-iteration buffer inside a loop: in iteration i of the innermost
// loop it holds chunk i of c of the tensor's rows, or with row_blocks = n > 1 chunk i of c of each
// of the n blocks of its rows (the i-th chunks of every rank's block, which one collective of an
// overlap loop moves). A BlockRef into such a buffer names the rows of its block it holds.
// head_groups = g > 1: a buffer of one head group of g (BlockRef::heads) of the tensor, which
// every ring step of a head group fills whole (lower_ring_attention.h).
struct BufferNode {
  const TensorView* tv = nullptr;
  int64_t slot = 0;
  int64_t chunk_blocks = 1;
  int64_t row_blocks = 1;
  int64_t head_groups = 1;
};
//   allocate %3 : f32[?t, 64]   a local buffer of the rank's shape of %3
struct Allocate : BufferNode {};
//   deallocate %3               frees it after its last use (tasks already submitted keep it alive)
struct Deallocate : BufferNode {};

// A segment (HostProgram::segments) run on the current stream; `views` are the blocks it touches,
// aligned with the segment's inputs then outputs (empty: every tensor whole).
struct SegmentCall {
  int64_t segment = -1;
  std::vector<BlockRef> views;
  // An attention segment run as a ring step (lower_ring_attention.h), printed
  //   gemm #3 (%q, %k~1, %v~1) -> (%o, %lse) {sdpa, sdpa_lse} accumulate rows (%q[r of 4]) keys (...)
  // accumulate: merge into the online softmax its outputs hold (the output and log-sum-exp of
  // earlier ring steps) by log-sum-exp instead of starting afresh.
  bool accumulate = false;
  // The blocks of the global sequence that its local query rows (key rows) are, in local order:
  // BlockRefs of the query's (key's) tensor that index its global sequence dim (positions, not
  // buffers). Its causal mask compares those positions and skips a block pair with nothing to
  // attend. Empty: a plain launch, whose local rows are the sequence.
  std::vector<BlockRef> query_blocks = {}, key_blocks = {};
};
//   launch #2 %4 = gelu(%3)     a generated kernel
struct LaunchKernel : SegmentCall {};
//   gemm #1 %3 = linear(%inp, %w)   a library GEMM (BLAS / cuBLASLt), with its fused epilogue
struct Gemm : SegmentCall {};

//   comm h0 allreduce %4 -> %5 axis 0 team [0, 1]
// Starts collective `kind` from `in` to `out` among `team` (the mesh slice along `mesh_axis`
// through this rank) on the current stream and returns handle `handle`; a Wait finishes it.
// Per-rank pictures of each kind: meshfuse/communicator.h.
struct Communication {
  CommKind kind = CommKind::Allreduce;
  BlockRef in, out;
  ReduceOp reduce_op = ReduceOp::Sum;
  int64_t mesh_axis = -1;  // the mesh axis whose slice is the team (-1: between meshes)
  Team team;               // global ranks (filled by specialize-for-rank)
  int64_t root = -1;       // broadcast, scatter, gather, reduce: the root's global rank
  // dims() index sharded in `in` (allgather, all-to-all, gather); SendRecv: the dim its
  // BlockRefs' blocks run along (packed through a staging buffer) instead of dim 0.
  int64_t in_dim = -1;
  int64_t out_dim = -1;    // dims() index sharded in `out` (reduce-scatter, all-to-all, scatter)
  // SendRecv: a ring step along mesh_axis sends to the rank `shift` places ahead and receives
  // from the one `shift` behind; a stage boundary sends to `send_to`'s rank and receives from
  // `recv_from`'s (global ranks, resolved by specialize-for-rank; -1: no send / no receive).
  // `mirror`: exchanges with the rank at the mirrored place along mesh_axis (n - 1 - r; the middle
  // rank of an odd team keeps its block), as causal ring attention balances its work.
  int64_t shift = 0;
  bool mirror = false;
  int64_t send_to = -1, recv_from = -1;
  int64_t handle = -1;
};
//   wait h0                     the current stream waits until communication h0 completed
struct Wait {
  int64_t handle = -1;
};
//   slice %6 = %5 dim 0 axis 0  Replicate -> Shard: this rank keeps its block of `in` along
//                               `out_dim` (its index along `mesh_axis`); no communication
//   slice %p = %r partial axis 0                a whole value made a pending sum (Replicate ->
//                                               Partial): the axis's first device keeps it, the
//                                               others hold zeros (exact, unlike dividing by n)
struct ShardSlice {
  static constexpr int64_t kPartition = -1;  // out_dim of a Replicate -> Partial partition
  BlockRef in, out;
  int64_t mesh_axis = -1;
  int64_t out_dim = kPartition;
};
//   copy %x -> %g[r of 4]  /  add %t -> %acc   out = in, or out += in (ring reductions)
//   copy %q~1 -> %q[1 of 2] along dim 2         blocks along another dim than 0 (strided)
struct Copy {
  BlockRef in, out;
  bool accumulate = false;
  int64_t along_dim = -1;  // >= 0: the dim the BlockRefs' blocks run along instead of dim 0
};
//   for i in [0, 4) { ... }     runs `body` once per i (chunks, ring steps, microbatches).
// stream_pool > 0 (before assign-streams): the iterations are independent and rotate through
// that many streams; assign-streams makes that explicit (stream, event and join nodes).
struct ForLoop {
  int64_t trip_count = 0;
  std::vector<HostNode> body;
  int64_t stream_pool = 0;
};
//   stream 2  /  stream 1 + i % 2   later nodes run on `stream` (+ i mod stream_pool for the
//                                   innermost loop's i when stream_pool > 0); 0: the main stream
struct SetCurrentStream {
  int64_t stream = 0;
  int64_t stream_pool = 0;
};
// Instance (sum_j coeffs[j] * i_j + offset) of event `event` (i_j: the enclosing loops'
// variables, outermost first); a wait for a negative instance is a no-op. So an event recorded
// per iteration of `for i` is waited for by the next iteration with coeffs {1}, offset -1.
struct EventNode {
  int64_t event = -1;
  std::vector<int64_t> coeffs;
  int64_t offset = 0;
};
//   record e0[i]                the instance happens when the current stream reaches this point
struct RecordEvent : EventNode {};
//   wait_event e0[i - 1]        the current stream waits for the instance
struct WaitEvent : EventNode {};
//   host_wait e1[i - 2]         the host waits for it: it runs at most 2 iterations ahead (their
//                               buffers bound the memory)
struct HostWaitEvent : EventNode {};
//   sync                        the main stream waits for every stream (a join)
struct Synchronize {};

template <typename, typename... Nodes>
struct VariantOfRest {
  using type = std::variant<Nodes...>;
};

}  // namespace hir

// The kinds, in host_nodes.def's order (HostNode::kind() is the variant's index).
enum class HostNodeKind {
#define MESHFUSE_HOST_NODE(type, keyword) type,
#include "lower/host_nodes.def"
#undef MESHFUSE_HOST_NODE
};
// "allocate", "comm", "for", ...: the node's keyword in the text form.
const char* hostNodeKeyword(HostNodeKind kind);

// One node: a std::variant of the node structs. Dispatch with visit() (every kind handled, or it
// does not compile) or test one kind with as<T>().
struct HostNode {
#define MESHFUSE_HOST_NODE(type, keyword) , hir::type
  using Variant = hir::VariantOfRest<void
#include "lower/host_nodes.def"
                                     >::type;
#undef MESHFUSE_HOST_NODE
  Variant node;

  template <typename T, typename = std::enable_if_t<std::is_constructible_v<Variant, T&&>>>
  HostNode(T&& n) : node(std::forward<T>(n)) {}  // NOLINT: every node struct converts implicitly

  HostNodeKind kind() const { return static_cast<HostNodeKind>(node.index()); }
  template <typename T>
  bool is() const {
    return std::holds_alternative<T>(node);
  }
  template <typename T>
  T* as() {
    return std::get_if<T>(&node);
  }
  template <typename T>
  const T* as() const {
    return std::get_if<T>(&node);
  }
  template <typename F>
  decltype(auto) visit(F&& f) const {
    return std::visit(std::forward<F>(f), node);
  }
  template <typename F>
  decltype(auto) visit(F&& f) {
    return std::visit(std::forward<F>(f), node);
  }
  // The body of a ForLoop, else nullptr.
  const std::vector<HostNode>* body() const {
    const hir::ForLoop* l = as<hir::ForLoop>();
    return l ? &l->body : nullptr;
  }
};

// A visitor from lambdas, one per node struct (or a generic one for the rest):
//   n.visit(Overloaded{[&](const hir::Allocate& a) {...}, [&](const auto&) {}});
template <typename... Fs>
struct Overloaded : Fs... {
  using Fs::operator()...;
};
template <typename... Fs>
Overloaded(Fs...) -> Overloaded<Fs...>;

struct HostProgram {
  std::shared_ptr<Fusion> fusion;  // the decomposed fusion the nodes refer to
  std::shared_ptr<const std::vector<Segment>> segments;  // what LaunchKernel/Gemm nodes run
  int64_t rank = -1;               // -1: the collective program of all ranks
  std::vector<HostNode> nodes;
  const Segment& segment(const hir::SegmentCall& n) const { return segments->at(n.segment); }
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
std::vector<CollectiveInfo> collectives(const HostProgram& program, const SymbolBindings& bindings);
// Why communication `n` exists (CollectiveInfo::provenance): its output's provenance; for the
// send/recv steps of ring attention, which move blocks of the keys, values, query or output
// themselves, the reason of the attention's ring.
std::string communicationReason(const hir::Communication& n);

// The causal work of each ring attention of a specialized program (lower_ring_attention.h), for
// reports: over its steps, the pairs of (query chunk, key chunk) this rank attends, whole or
// along the diagonal, and those it skips (entirely after the query chunk), chunks being the
// ring's sequence chunks (`chunk` rows: s/2n when the work is balanced, else s/n).
struct AttentionBlocks {
  std::string tensor;       // the attention's output
  int64_t head_groups = 1;  // rings run one after the other, one per group of heads
  int64_t steps = 0;        // attention launches (ring steps) of one head group
  // (chunk pairs of one head group: every group attends the same ones)
  int64_t chunk = 0;
  int64_t attended = 0, skipped = 0;
};
std::vector<AttentionBlocks> attentionBlocks(const HostProgram& program, const SymbolBindings& bindings);

class BufferSizes;
// The elements each member of communication n's team passes for the block `ref` (in team
// order: a v-collective's counts), in the iteration `loops` of the enclosing loops.
std::vector<int64_t> memberElements(const BufferSizes& sizes, const hir::Communication& n, const BlockRef& ref,
                                    const std::vector<int64_t>& loops);
// CollectiveInfo::padded_bytes of communication n on `sizes`' rank, in iteration `loops`.
int64_t paddedBytes(const BufferSizes& sizes, const hir::Communication& n, const std::vector<int64_t>& loops);

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
  // The flat index in [0, ref.blocks) of the block `ref` names on `rank` in iteration `loops`.
  static int64_t blockIndex(const BlockRef& ref, int64_t rank, const std::vector<int64_t>& loops);
  // The rows of its buffer that `ref` names (its first row there, and how many); for a head
  // group (BlockRef::heads), its (batch, head) pairs of the buffer's flattened leading dims.
  Span rows(const BlockRef& ref, int64_t rank, const std::vector<int64_t>& loops) const;
  // The shape of the block `ref` names: rows of dim 0, or (dim > 0: a send/recv whose blocks run
  // along another dim, Communication::in_dim) a block of that dim of the whole buffer.
  std::vector<int64_t> shape(const BlockRef& ref, int64_t rank, const std::vector<int64_t>& loops,
                             int64_t dim = 0) const;
  int64_t elements(const BlockRef& ref, int64_t rank, const std::vector<int64_t>& loops) const;
  int64_t bytes(const BlockRef& ref, int64_t rank, const std::vector<int64_t>& loops, int64_t dim = 0) const;
  // Bytes of the buffer an Allocate node makes, in the loops' first iteration (the largest).
  int64_t allocationBytes(const hir::BufferNode& allocate, int64_t rank) const;

 private:
  struct Chunking {
    int64_t chunk_blocks, row_blocks;
  };
  std::vector<Span> bufferRows(const TensorView* tv, int64_t slot, int64_t rank,
                               const std::vector<int64_t>& loops) const;

  const SymbolBindings& bindings_;
  std::map<std::pair<const TensorView*, int64_t>, Chunking> chunked_;     // per-iteration buffers
  std::map<std::pair<const TensorView*, int64_t>, int64_t> head_groups_;  // one head group's buffers
  mutable std::map<std::pair<const TensorView*, int64_t>, std::vector<int64_t>> shapes_;
};

// The shape of one of `groups` head groups (BlockRef::heads) of a tensor of `shape` [batch,
// heads, ...]: F = batch * heads / groups (batch, head) pairs, [1, F, ...] when F divides heads,
// [F / heads, heads, ...] when heads divides F.
std::vector<int64_t> headGroupShape(std::vector<int64_t> shape, int64_t groups);

// Calls `fn` on every node, loop bodies included (pre-order); `nodes` may be const.
template <typename Nodes, typename F>
void forEachNode(Nodes& nodes, F&& fn) {
  for (auto& n : nodes) {
    fn(n);
    if (auto* loop = n.template as<hir::ForLoop>()) forEachNode(loop->body, fn);
  }
}

}  // namespace meshfuse
