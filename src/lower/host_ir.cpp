// Host IR printing, reports and memory accounting.
#include "lower/host_ir.h"

#include <algorithm>
#include <map>

#include "decompose/decompose_ring_attention.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/placement.h"
#include "meshfuse/ir/printer.h"

namespace meshfuse {

namespace {

// "2*i0 - 2*r + i1 - 2" for coefficients of the loop variables, the rank index and a constant;
// `wraps` is set when the value may need a modulo to be a valid index.
// The rank index is `r` along mesh axis 0 (every ring so far), `rK` along axis K.
std::string indexExpr(const std::vector<int64_t>& loop_coeffs, int64_t rank_coeff, int64_t offset, bool& wraps,
                      int64_t rank_axis = 0) {
  std::string index;
  wraps = rank_coeff != 0;
  auto term = [&](int64_t c, const std::string& var) {
    if (c == 0) return;
    wraps |= c < 0;
    std::string t = c == 1 ? var : c == -1 ? "-" + var : fmt::format("{}*{}", c, var);
    index += index.empty() ? t : (t[0] == '-' ? " - " + t.substr(1) : " + " + t);
  };
  for (size_t j = 0; j < loop_coeffs.size(); ++j)
    term(loop_coeffs[j], loop_coeffs.size() == 1 ? std::string("i") : fmt::format("i{}", j));
  term(rank_coeff, rank_axis > 0 ? fmt::format("r{}", rank_axis) : std::string("r"));
  if (offset < 0) wraps = true;
  if (offset != 0 || index.empty())
    index +=
        index.empty() ? fmt::format("{}", offset) : fmt::format(" {} {}", offset < 0 ? '-' : '+', std::abs(offset));
  return index;
}

}  // namespace

const char* hostNodeKeyword(HostNodeKind k) {
  switch (k) {
#define MESHFUSE_HOST_NODE(type, keyword) \
  case HostNodeKind::type: return keyword;
#include "lower/host_nodes.def"
#undef MESHFUSE_HOST_NODE
  }
  return "?";
}

std::string BlockRef::toString(const Fusion& f) const {
  std::string name = f.displayName(tv) + (slot > 0 ? fmt::format("~{}", slot) : "");
  if (whole()) return name;
  bool wraps = false;
  std::string index = indexExpr(loop_coeffs, rank_coeff, offset, wraps, mesh_axis);
  std::string parts = sub_blocks > 1 ? fmt::format("{}x{}", blocks / sub_blocks, sub_blocks) : std::to_string(blocks);
  return fmt::format("{}[{} of {}{}]", name, wraps ? "(" + index + ") % " + std::to_string(blocks) : index, parts,
                     heads ? " heads" : "");
}

namespace {

// "f32[?t/4, 64]": the per-rank type of a TensorView (one block of `blocks` along dim 0: its
// leading ranks' size; or one of `head_groups` head groups, whose [batch, heads] are static).
std::string localType(const TensorView* tv, int64_t blocks = 1, int64_t head_groups = 1) {
  std::vector<std::string> dims;
  std::vector<Extent> shape = tv->allocatedShape();
  if (head_groups > 1) {
    const std::vector<int64_t> group = headGroupShape({shape.at(0).value(), shape.at(1).value()}, head_groups);
    shape[0] = group[0], shape[1] = group[1];
  }
  for (size_t d = 0; d < shape.size(); ++d) dims.push_back(shape[d].divided(d == 0 ? blocks : 1).toString());
  return fmt::format("{}[{}]", dtypeName(tv->dtype()), fmt::join(dims, ", "));
}

// "#2 %act = gelu(%up)" for a one-op segment; "#2 (%a, %b) -> (%c, %d) {add, gelu, sum}" else.
// With views, the tensors are written as the blocks the node touches.
std::string segmentCall(const Fusion& f, const hir::SegmentCall& n, const Segment& seg) {
  std::vector<std::string> ins, outs, ops;
  for (size_t i = 0; i < seg.inputs.size(); ++i)
    ins.push_back(n.views.empty() ? f.displayName(seg.inputs[i]) : n.views[i].toString(f));
  for (size_t i = 0; i < seg.outputs.size(); ++i)
    outs.push_back(n.views.empty() ? f.displayName(seg.outputs[i]) : n.views[seg.inputs.size() + i].toString(f));
  if (seg.exprs.size() == 1 && n.views.empty())
    return fmt::format("#{} {} = {}", n.segment, outs[0], printExprCall(f, seg.exprs[0]));
  for (const Expr* e : seg.exprs) ops.push_back(std::string(e->name()));
  return fmt::format("#{} ({}) -> ({}) {{{}}}", n.segment, fmt::join(ins, ", "), fmt::join(outs, ", "),
                     fmt::join(ops, ", "));
}

// "%q[r of 4], %q[(7 - r) % 8 of 8]"
std::string refs(const Fusion& f, const std::vector<BlockRef>& blocks) {
  std::vector<std::string> out;
  for (const BlockRef& b : blocks) out.push_back(b.toString(f));
  return fmt::format("{}", fmt::join(out, ", "));
}

// A segment call, and what a ring attention step adds to it (lower_ring_attention.h).
std::string segmentCallLine(const HostProgram& p, const hir::SegmentCall& n) {
  const Fusion& f = *p.fusion;
  std::string line = " " + segmentCall(f, n, p.segment(n));
  if (n.accumulate) line += " accumulate";
  if (!n.query_blocks.empty())
    line += fmt::format(" rows ({}) keys ({})", refs(f, n.query_blocks), refs(f, n.key_blocks));
  return line;
}

bool hasNestedLoop(const hir::ForLoop& loop) {
  for (const HostNode& b : loop.body)
    if (b.is<hir::ForLoop>()) return true;
  return false;
}

std::string communicationLine(const Fusion& f, const hir::Communication& n) {
  std::string line =
      fmt::format(" h{} {} {} -> {}", n.handle, commKindName(n.kind), n.in.toString(f), n.out.toString(f));
  if (n.kind == CommKind::SendRecv) {
    if (n.shift != 0) line += fmt::format(" shift {}", n.shift);
    if (n.mirror) line += " mirror";
    if (n.send_to >= 0) line += fmt::format(" to rank {}", n.send_to);
    if (n.recv_from >= 0) line += fmt::format(" from rank {}", n.recv_from);
  }
  if (n.mesh_axis >= 0) line += fmt::format(" axis {}", n.mesh_axis);
  if (n.in_dim >= 0) line += fmt::format(" {} dim {}", n.kind == CommKind::SendRecv ? "along" : "from", n.in_dim);
  if (n.out_dim >= 0) line += fmt::format(" to dim {}", n.out_dim);
  if (n.root >= 0) line += fmt::format(" root {}", n.root);
  if (!n.team.empty()) line += fmt::format(" team [{}]", fmt::join(n.team, ", "));
  return line;
}

// What follows a node's keyword on its line (a loop's header is printed by printNodes).
std::string nodeLine(const HostProgram& p, const HostNode& node) {
  const Fusion& f = *p.fusion;
  std::string line = hostNodeKeyword(node.kind());
  auto event = [&](const hir::EventNode& e) {
    bool wraps = false;
    line += fmt::format(" e{}[{}]", e.event, indexExpr(e.coeffs, 0, e.offset, wraps));
  };
  node.visit(Overloaded{
      [&](const hir::Allocate& n) {
        line += fmt::format(" {} : {}", BlockRef::of(n.tv, n.slot).toString(f),
                            localType(n.tv, n.chunk_blocks, n.head_groups));
        if (n.chunk_blocks > 1 && n.row_blocks > 1)
          line += fmt::format(" (chunk i of {} of each of {} blocks)", n.chunk_blocks, n.row_blocks);
        else if (n.chunk_blocks > 1)
          line += fmt::format(" (one block of {})", n.chunk_blocks);
        else if (n.head_groups > 1)
          line += fmt::format(" (one head group of {})", n.head_groups);
        // An in-place output takes its input's buffer (HostIrEvaluator): nothing is allocated.
        if (const TensorView* in = f.aliasedInput(n.tv); in != nullptr && n.slot == 0)
          line += fmt::format(" (in place: the buffer of {})", f.displayName(in));
      },
      [&](const hir::Deallocate& n) { line += " " + BlockRef::of(n.tv, n.slot).toString(f); },
      [&](const hir::LaunchKernel& n) { line += segmentCallLine(p, n); },
      [&](const hir::Gemm& n) { line += segmentCallLine(p, n); },
      [&](const hir::Communication& n) { line += communicationLine(f, n); },
      [&](const hir::Wait& n) { line += fmt::format(" h{}", n.handle); },
      [&](const hir::ShardSlice& n) {
        if (n.out_dim == hir::ShardSlice::kPartition)
          line += fmt::format(" {} = {} partial axis {}", n.out.toString(f), n.in.toString(f), n.mesh_axis);
        else
          line += fmt::format(" {} = {} dim {} axis {}", n.out.toString(f), n.in.toString(f), n.out_dim, n.mesh_axis);
      },
      [&](const hir::Copy& n) {
        line = fmt::format("{} {} -> {}", n.accumulate ? "add" : "copy", n.in.toString(f), n.out.toString(f));
        if (n.along_dim >= 0) line += fmt::format(" along dim {}", n.along_dim);
      },
      [&](const hir::ForLoop&) {},
      [&](const hir::SetCurrentStream& n) {
        line += n.stream_pool > 0 ? fmt::format(" {} + i % {}", n.stream, n.stream_pool) : fmt::format(" {}", n.stream);
      },
      [&](const hir::RecordEvent& n) { event(n); },
      [&](const hir::WaitEvent& n) { event(n); },
      [&](const hir::HostWaitEvent& n) { event(n); },
      [&](const hir::Synchronize&) {},
  });
  return line;
}

void printNodes(const HostProgram& p, const std::vector<HostNode>& nodes, const std::string& indent, std::string& s,
                int depth = 0) {
  for (const HostNode& n : nodes) {
    if (const hir::ForLoop* loop = n.as<hir::ForLoop>()) {
      s += fmt::format("{}for {} in [0, {}){} {{\n", indent,
                       depth == 0 && !hasNestedLoop(*loop) ? "i" : fmt::format("i{}", depth), loop->trip_count,
                       loop->stream_pool > 0 ? fmt::format(" on {} streams", loop->stream_pool) : "");
      printNodes(p, loop->body, indent + "  ", s, depth + 1);
      s += indent + "}\n";
      continue;
    }
    s += indent + nodeLine(p, n) + "\n";
  }
}

}  // namespace

std::string HostProgram::toString() const {
  const Fusion& f = *fusion;
  std::string s = rank < 0 ? "hostir {\n" : fmt::format("hostir rank {} {{\n", rank);
  std::vector<std::string> ins, outs;
  for (const TensorView* tv : f.inputs())
    if (rank < 0 || tv->mesh() == nullptr || tv->mesh()->contains(rank))
      ins.push_back(f.displayName(tv) + " : " + localType(tv));
  for (const TensorView* tv : f.outputs())
    if (rank < 0 || tv->mesh() == nullptr || tv->mesh()->contains(rank)) outs.push_back(f.displayName(tv));
  s += fmt::format("  inputs {}\n", fmt::join(ins, ", "));
  printNodes(*this, nodes, "  ", s);
  s += fmt::format("  outputs {}\n}}\n", fmt::join(outs, ", "));
  return s;
}

namespace {

// Bytes one iteration of a loop body allocates (its nested loops' iterations included), the
// first iteration's, which is the largest (leading chunks are the largest).
int64_t iterationBytes(const std::vector<HostNode>& body, const BufferSizes& sizes, int64_t rank) {
  int64_t bytes = 0;
  for (const HostNode& n : body) {
    if (const auto* a = n.as<hir::Allocate>()) bytes += sizes.allocationBytes(*a, rank);
    if (const auto* l = n.as<hir::ForLoop>()) bytes += l->trip_count * iterationBytes(l->body, sizes, rank);
  }
  return bytes;
}

// How many iterations of `loop` may hold their buffers at once: the host runs ahead of the
// streams unless the body starts by waiting for the iteration k before (host_wait e[i - k]).
int64_t iterationsInFlight(const hir::ForLoop& loop) {
  if (!loop.body.empty()) {
    const auto* first = loop.body.front().as<hir::HostWaitEvent>();
    if (first != nullptr && first->coeffs == std::vector<int64_t>{1} && first->offset < 0)
      return std::min(loop.trip_count, -first->offset);
  }
  return loop.trip_count;
}

// An output that updates an input in place lives in the input's buffer: it costs nothing.
bool inPlace(const hir::BufferNode& n) { return n.slot == 0 && n.tv->fusion()->aliasedInput(n.tv) != nullptr; }

void accountMemory(const std::vector<HostNode>& nodes, const BufferSizes& sizes, int64_t rank, int64_t& live,
                   int64_t& peak) {
  for (const HostNode& n : nodes) {
    if (const auto* a = n.as<hir::Allocate>(); a && !inPlace(*a))
      peak = std::max(peak, live += sizes.allocationBytes(*a, rank));
    if (const auto* d = n.as<hir::Deallocate>(); d && !inPlace(*d)) live -= sizes.allocationBytes(*d, rank);
    // An iteration's buffers are freed by its body but live until its tasks ran (see
    // peakMemoryBytes): the iterations in flight hold theirs at once.
    if (const auto* l = n.as<hir::ForLoop>())
      peak = std::max(peak, live + iterationsInFlight(*l) * iterationBytes(l->body, sizes, rank));
  }
}

}  // namespace

std::vector<int64_t> memberElements(const BufferSizes& sizes, const hir::Communication& n, const BlockRef& ref,
                                    const std::vector<int64_t>& loops) {
  std::vector<int64_t> out;
  for (int64_t member : n.team) out.push_back(sizes.elements(ref, member, loops));
  return out;
}

int64_t paddedBytes(const BufferSizes& sizes, const hir::Communication& n, const std::vector<int64_t>& loops) {
  if ((n.kind != CommKind::Allgather && n.kind != CommKind::ReduceScatter) || n.team.empty()) return 0;
  std::vector<int64_t> counts = memberElements(sizes, n, n.kind == CommKind::Allgather ? n.in : n.out, loops);
  const int64_t largest = *std::max_element(counts.begin(), counts.end());
  if (std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == largest; })) return 0;
  const int64_t blocks = n.kind == CommKind::Allgather ? 1 : static_cast<int64_t>(counts.size());
  return blocks * largest * dtypeSize(n.in.tv->dtype());
}

namespace {

// The collectives in the order the evaluator issues them (loops unrolled), with the bytes this
// rank contributes. A stage boundary's receiving side reports what it receives, so every rank of
// a send/recv lists it (as the evaluator does).
void collect(const HostProgram& p, const std::vector<HostNode>& nodes, const BufferSizes& sizes,
             std::vector<int64_t>& loops, std::vector<CollectiveInfo>& out) {
  for (const HostNode& node : nodes) {
    if (const auto* l = node.as<hir::ForLoop>()) {
      loops.push_back(0);
      for (int64_t t = 0; t < l->trip_count; ++t) {
        loops.back() = t;
        collect(p, l->body, sizes, loops, out);
      }
      loops.pop_back();
      continue;
    }
    const auto* c = node.as<hir::Communication>();
    if (c == nullptr) continue;
    const hir::Communication& n = *c;
    Team team = n.team;
    int64_t bytes = 0;
    if (n.kind == CommKind::SendRecv && p.rank >= 0) {
      // The pair (sender, receiver), as specialize-for-rank resolved it: a ring step counts once
      // per rank (each sends); a stage boundary on both sides, with the bytes that cross.
      const bool sends = n.send_to >= 0;
      team = sends ? Team{p.rank, n.send_to} : Team{n.recv_from, p.rank};
      bytes = sizes.bytes(sends ? n.in : n.out, p.rank, loops, n.in_dim);
    } else if ((n.kind != CommKind::Broadcast && n.kind != CommKind::Scatter) || n.root == p.rank) {
      // What this rank contributes (a broadcast's or scatter's non-root contributes nothing).
      bytes = sizes.bytes(n.in, p.rank, loops);
    }
    CollectiveInfo info{n.kind,
                        n.mesh_axis,
                        team,
                        bytes,
                        p.fusion->displayName(n.out.tv),
                        p.fusion->displayName(n.in.tv),
                        communicationReason(n),
                        n.root};
    if (p.rank >= 0) info.padded_bytes = paddedBytes(sizes, n, loops);
    out.push_back(std::move(info));
  }
}

}  // namespace

int64_t peakMemoryBytes(const HostProgram& p, const SymbolBindings& b) {
  BufferSizes sizes(p, b);
  int64_t live = 0;
  for (const TensorView* tv : p.fusion->inputs())
    if (tv->mesh() == nullptr || p.rank < 0 || tv->mesh()->contains(p.rank))
      live += sizes.bytes(BlockRef::of(tv), p.rank, {});
  int64_t peak = live;
  accountMemory(p.nodes, sizes, p.rank, live, peak);
  return peak;
}

BufferSizes::BufferSizes(const HostProgram& p, const SymbolBindings& b) : bindings_(b) {
  forEachNode(p.nodes, [&](const HostNode& n) {
    const auto* a = n.as<hir::Allocate>();
    if (a != nullptr && a->head_groups > 1) {
      auto [it, fresh] = head_groups_.emplace(std::make_pair(a->tv, a->slot), a->head_groups);
      MF_CHECK(fresh || it->second == a->head_groups, "{} is allocated for {} and for {} head groups",
               BlockRef::of(a->tv, a->slot).toString(*p.fusion), it->second, a->head_groups);
    }
    if (a == nullptr || a->chunk_blocks <= 1) return;
    auto [it, fresh] = chunked_.emplace(std::make_pair(a->tv, a->slot), Chunking{a->chunk_blocks, a->row_blocks});
    MF_CHECK(fresh || (it->second.chunk_blocks == a->chunk_blocks && it->second.row_blocks == a->row_blocks),
             "{} is allocated per iteration in two ways", BlockRef::of(a->tv, a->slot).toString(*p.fusion));
  });
}

const std::vector<int64_t>& BufferSizes::localShape(const TensorView* tv, int64_t rank) const {
  auto key = std::make_pair(tv, rank);
  auto it = shapes_.find(key);
  if (it == shapes_.end()) it = shapes_.emplace(key, meshfuse::localShape(tv, bindings_, rank)).first;
  return it->second;
}

std::vector<Span> BufferSizes::bufferRows(const TensorView* tv, int64_t slot, int64_t rank,
                                          const std::vector<int64_t>& loops) const {
  const std::vector<int64_t>& shape = localShape(tv, rank);
  const int64_t rows = shape.empty() ? 1 : shape[0];
  auto it = chunked_.find({tv, slot});
  if (it == chunked_.end()) return {{0, rows}};
  const auto [chunks, row_blocks] = it->second;
  const int64_t i = loops.empty() ? 0 : loops.back() % chunks;  // the chunk: the innermost loop's variable
  std::vector<Span> out;
  for (int64_t b = 0; b < row_blocks; ++b) {
    Span block = chunkSpan(rows, row_blocks, b), chunk = chunkSpan(block.size, chunks, i);
    out.push_back({block.begin + chunk.begin, chunk.size});
  }
  return out;
}

std::vector<int64_t> BufferSizes::bufferShape(const TensorView* tv, int64_t slot, int64_t rank,
                                              const std::vector<int64_t>& loops) const {
  std::vector<int64_t> shape = localShape(tv, rank);
  if (auto it = head_groups_.find({tv, slot}); it != head_groups_.end()) return headGroupShape(shape, it->second);
  if (shape.empty()) return shape;
  shape[0] = 0;
  for (const Span& s : bufferRows(tv, slot, rank, loops)) shape[0] += s.size;
  return shape;
}

int64_t BufferSizes::blockIndex(const BlockRef& ref, int64_t rank, const std::vector<int64_t>& loops) {
  MF_CHECK(ref.loop_coeffs.size() <= loops.size(), "a block index over {} loops inside {} loops",
           ref.loop_coeffs.size(), loops.size());
  int64_t index = ref.offset;
  const size_t first = loops.size() - ref.loop_coeffs.size();  // the coefficients belong to the innermost loops
  for (size_t j = 0; j < ref.loop_coeffs.size(); ++j) index += ref.loop_coeffs[j] * loops[first + j];
  if (ref.rank_coeff != 0) index += ref.rank_coeff * ref.tv->mesh()->indexAlong(rank, ref.mesh_axis);
  return ((index % ref.blocks) + ref.blocks) % ref.blocks;
}

Span BufferSizes::rows(const BlockRef& ref, int64_t rank, const std::vector<int64_t>& loops) const {
  const std::vector<Span> held = bufferRows(ref.tv, ref.slot, rank, loops);
  if (ref.whole()) return {0, bufferShape(ref.tv, ref.slot, rank, loops).at(0)};
  if (ref.heads) {  // a head group of a whole buffer: (batch, head) pairs
    MF_CHECK(!head_groups_.contains({ref.tv, ref.slot}) && held.size() == 1 && ref.sub_blocks == 1,
             "{}: a head group of a buffer that is not whole", ref.toString(*ref.tv->fusion()));
    const std::vector<int64_t> group = headGroupShape(localShape(ref.tv, rank), ref.blocks);
    return {blockIndex(ref, rank, loops) * group[0] * group[1], group[0] * group[1]};
  }
  // The rows of the whole local tensor the block names: the flat index's block, then sub-block.
  MF_CHECK(ref.sub_blocks >= 1 && ref.blocks % ref.sub_blocks == 0, "{}: {} sub-blocks of {} blocks",
           ref.toString(*ref.tv->fusion()), ref.sub_blocks, ref.blocks);
  const int64_t index = blockIndex(ref, rank, loops);
  const int64_t rows = localShape(ref.tv, rank).at(0);
  Span outer = chunkSpan(rows, ref.blocks / ref.sub_blocks, index / ref.sub_blocks);
  Span inner = chunkSpan(outer.size, ref.sub_blocks, index % ref.sub_blocks);
  const Span named{outer.begin + inner.begin, inner.size};
  // Its rows in the buffer: the buffer holds `held` (sorted, disjoint, packed in that order).
  Span out;
  for (const Span& h : held) {
    out.begin += std::clamp(named.begin, h.begin, h.end()) - h.begin;
    out.size += std::max<int64_t>(0, std::min(named.end(), h.end()) - std::max(named.begin, h.begin));
  }
  return out;
}

std::vector<int64_t> BufferSizes::shape(const BlockRef& ref, int64_t rank, const std::vector<int64_t>& loops,
                                        int64_t dim) const {
  std::vector<int64_t> shape = bufferShape(ref.tv, ref.slot, rank, loops);
  if (shape.empty() || (dim > 0 && ref.whole())) return shape;
  if (ref.heads) {
    MF_CHECK(dim <= 0 && !head_groups_.contains({ref.tv, ref.slot}), "{}: a head group along dim {} or of a group",
             ref.toString(*ref.tv->fusion()), dim);
    return headGroupShape(std::move(shape), ref.blocks);
  }
  if (dim <= 0) {
    shape[0] = rows(ref, rank, loops).size;
    return shape;
  }
  // Blocks along `dim` of a buffer that holds the whole local tensor (the halves a ring's causal
  // balance exchanges), cut as torch.chunk cuts.
  MF_CHECK(dim < static_cast<int64_t>(shape.size()), "a block along dim {} of a {}-dim buffer", dim, shape.size());
  const int64_t index = blockIndex(ref, rank, loops);
  const Span outer = chunkSpan(shape[dim], ref.blocks / ref.sub_blocks, index / ref.sub_blocks);
  shape[dim] = chunkSpan(outer.size, ref.sub_blocks, index % ref.sub_blocks).size;
  return shape;
}

int64_t BufferSizes::elements(const BlockRef& ref, int64_t rank, const std::vector<int64_t>& loops) const {
  return numel(shape(ref, rank, loops));
}

int64_t BufferSizes::bytes(const BlockRef& ref, int64_t rank, const std::vector<int64_t>& loops, int64_t dim) const {
  return numel(shape(ref, rank, loops, dim)) * dtypeSize(ref.tv->dtype());
}

std::vector<int64_t> headGroupShape(std::vector<int64_t> shape, int64_t groups) {
  MF_CHECK(shape.size() >= 2 && groups >= 1 && (shape[0] * shape[1]) % groups == 0,
           "{} head groups of a tensor of {} dims", groups, shape.size());
  const int64_t heads = shape[1], pairs = shape[0] * shape[1] / groups;
  MF_CHECK(heads % pairs == 0 || pairs % heads == 0, "{} head groups of {} heads", groups, heads);
  shape[0] = pairs < heads ? 1 : pairs / heads;
  shape[1] = std::min(pairs, heads);
  return shape;
}

int64_t BufferSizes::allocationBytes(const hir::BufferNode& allocate, int64_t rank) const {
  return numel(bufferShape(allocate.tv, allocate.slot, rank, {})) * dtypeSize(allocate.tv->dtype());
}

std::string communicationReason(const hir::Communication& n) {
  const TensorView* tv = n.out.tv;
  if (n.kind == CommKind::SendRecv && n.mesh_axis >= 0) {
    // A ring step moving the keys or values (whose ring-marked set states the ring's reason), or
    // the mirror exchange of the query (the attention's reason; the output's is its own).
    for (const Expr* u : tv->uses())
      if (ringAttentionOf(u) != nullptr || (n.mirror && u->kind() == OpKind::Sdpa)) return u->output()->provenance();
  }
  return tv->provenance();
}

std::vector<CollectiveInfo> collectives(const HostProgram& p, const SymbolBindings& b) {
  std::vector<CollectiveInfo> out;
  std::vector<int64_t> loops;
  collect(p, p.nodes, BufferSizes(p, b), loops, out);
  return out;
}

std::string printHostModule(const HostProgram& p) { return printFusion(*p.fusion) + p.toString(); }

std::string printHostNode(const HostProgram& p, const HostNode& n) {
  if (const auto* loop = n.as<hir::ForLoop>()) {
    std::string s;
    printNodes(p, {hir::ForLoop{loop->trip_count, {}, loop->stream_pool}}, "", s);
    return s.substr(0, s.find('\n'));
  }
  return nodeLine(p, n);
}

}  // namespace meshfuse
