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
  return fmt::format("{}[{} of {}]", name, wraps ? "(" + index + ") % " + std::to_string(blocks) : index, blocks);
}

namespace {

// "f32[?t/4, 64]": the per-rank type of a TensorView (one block of `blocks` along dim 0).
std::string localType(const TensorView* tv, int64_t blocks = 1) {
  std::vector<std::string> dims;
  std::vector<Extent> shape = tv->allocatedShape();
  for (size_t d = 0; d < shape.size(); ++d) dims.push_back(shape[d].divided(d == 0 ? blocks : 1).toString());
  return fmt::format("{}[{}]", dtypeName(tv->dtype()), fmt::join(dims, ", "));
}

int64_t localBytes(const TensorView* tv, const SymbolBindings& b, int64_t blocks = 1) {
  int64_t n = dtypeSize(tv->dtype());
  for (int64_t s : localShape(tv, b)) n *= s;
  return n / blocks;
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
        line += fmt::format(" {} : {}", BlockRef::of(n.tv, n.slot).toString(f), localType(n.tv, n.chunk_blocks));
        if (n.chunk_blocks > 1) line += fmt::format(" (one block of {})", n.chunk_blocks);
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

// Bytes one iteration of a loop body allocates (its nested loops' iterations included).
int64_t iterationBytes(const std::vector<HostNode>& body, const SymbolBindings& b) {
  int64_t bytes = 0;
  for (const HostNode& n : body) {
    if (const auto* a = n.as<hir::Allocate>()) bytes += localBytes(a->tv, b, a->chunk_blocks);
    if (const auto* l = n.as<hir::ForLoop>()) bytes += l->trip_count * iterationBytes(l->body, b);
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

void accountMemory(const std::vector<HostNode>& nodes, const SymbolBindings& b, int64_t& live, int64_t& peak) {
  for (const HostNode& n : nodes) {
    if (const auto* a = n.as<hir::Allocate>(); a && !inPlace(*a))
      peak = std::max(peak, live += localBytes(a->tv, b, a->chunk_blocks));
    if (const auto* d = n.as<hir::Deallocate>(); d && !inPlace(*d)) live -= localBytes(d->tv, b, d->chunk_blocks);
    // An iteration's buffers are freed by its body but live until its tasks ran (see
    // peakMemoryBytes): the iterations in flight hold theirs at once.
    if (const auto* l = n.as<hir::ForLoop>())
      peak = std::max(peak, live + iterationsInFlight(*l) * iterationBytes(l->body, b));
  }
}

// The collectives in the order the evaluator issues them (loops unrolled), with the bytes this
// rank contributes. A stage boundary's receiving side reports what it receives, so every rank of
// a send/recv lists it (as the evaluator does).
void collect(const HostProgram& p, const std::vector<HostNode>& nodes, const BufferSizes& sizes,
             std::vector<CollectiveInfo>& out) {
  for (const HostNode& node : nodes) {
    if (const auto* l = node.as<hir::ForLoop>()) {
      for (int64_t t = 0; t < l->trip_count; ++t) collect(p, l->body, sizes, out);
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
      bytes = sizes.bytes(sends ? n.in : n.out);
    } else if ((n.kind != CommKind::Broadcast && n.kind != CommKind::Scatter) || n.root == p.rank) {
      // What this rank contributes (a broadcast's or scatter's non-root contributes nothing).
      bytes = sizes.bytes(n.in);
    }
    out.push_back({n.kind, n.mesh_axis, team, bytes, p.fusion->displayName(n.out.tv), p.fusion->displayName(n.in.tv),
                   communicationReason(n), n.root});
  }
}

}  // namespace

int64_t peakMemoryBytes(const HostProgram& p, const SymbolBindings& b) {
  int64_t live = 0;
  for (const TensorView* tv : p.fusion->inputs())
    if (tv->mesh() == nullptr || p.rank < 0 || tv->mesh()->contains(p.rank)) live += localBytes(tv, b);
  int64_t peak = live;
  accountMemory(p.nodes, b, live, peak);
  return peak;
}

BufferSizes::BufferSizes(const HostProgram& p, const SymbolBindings& b) : bindings_(b) {
  forEachNode(p.nodes, [&](const HostNode& n) {
    if (const auto* a = n.as<hir::Allocate>(); a && a->chunk_blocks > 1) chunk_blocks_[{a->tv, a->slot}] = a->chunk_blocks;
  });
}

int64_t BufferSizes::bytes(const BlockRef& ref) const {
  auto it = chunk_blocks_.find({ref.tv, ref.slot});
  return localBytes(ref.tv, bindings_, ref.blocks * (it == chunk_blocks_.end() ? 1 : it->second));
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
  collect(p, p.nodes, BufferSizes(p, b), out);
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
