// Host IR printing, reports and memory accounting.
#include "meshfuse/host_ir.h"

#include <map>

#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/placement.h"
#include "meshfuse/ir/printer.h"

namespace meshfuse {

const char* commKindName(CommKind k) {
  switch (k) {
#define MESHFUSE_X(e, s) \
  case CommKind::e:      \
    return s;
    MESHFUSE_COMM_KINDS(MESHFUSE_X)
#undef MESHFUSE_X
  }
  return "?";
}

namespace {

const char* nodeName(HostNodeKind k) {
  switch (k) {
#define MESHFUSE_X(e, s) \
  case HostNodeKind::e:  \
    return s;
    MESHFUSE_HOST_NODES(MESHFUSE_X)
#undef MESHFUSE_X
  }
  return "?";
}

// "f32[?t/4, 64]": the per-rank type of a TensorView.
std::string localType(const TensorView* tv) {
  std::vector<int64_t> factors = shardFactors(tv);
  std::vector<std::string> dims;
  std::vector<Extent> shape = tv->shape();
  for (size_t d = 0; d < shape.size(); ++d) dims.push_back(shape[d].divided(factors[d]).toString());
  return fmt::format("{}[{}]", dtypeName(tv->dtype()), fmt::join(dims, ", "));
}

int64_t localBytes(const TensorView* tv, const SymbolBindings& b) {
  int64_t n = dtypeSize(tv->dtype());
  for (int64_t s : localShape(tv, b)) n *= s;
  return n;
}

// "#2 %act = gelu(%up)" for a one-op segment; "#2 (%a, %b) -> (%c, %d) {add, gelu, sum}" else.
std::string segmentCall(const Fusion& f, int64_t index, const Segment& seg) {
  if (seg.exprs.size() == 1)
    return fmt::format("#{} {} = {}", index, f.displayName(seg.exprs[0]->output()), printExprCall(f, seg.exprs[0]));
  std::vector<std::string> ins, outs, ops;
  for (const TensorView* tv : seg.inputs) ins.push_back(f.displayName(tv));
  for (const TensorView* tv : seg.outputs) outs.push_back(f.displayName(tv));
  for (const Expr* e : seg.exprs) ops.push_back(std::string(e->name()));
  return fmt::format("#{} ({}) -> ({}) {{{}}}", index, fmt::join(ins, ", "), fmt::join(outs, ", "), fmt::join(ops, ", "));
}

}  // namespace

std::string HostProgram::toString() const {
  const Fusion& f = *fusion;
  auto name = [&](const TensorView* tv) { return f.displayName(tv); };
  std::string s = rank < 0 ? "hostir {\n" : fmt::format("hostir rank {} {{\n", rank);
  std::vector<std::string> ins, outs;
  for (const TensorView* tv : f.inputs()) ins.push_back(name(tv) + " : " + localType(tv));
  for (const TensorView* tv : f.outputs()) outs.push_back(name(tv));
  s += fmt::format("  inputs {}\n", fmt::join(ins, ", "));
  for (const HostNode& n : nodes) {
    std::string line = nodeName(n.kind);
    switch (n.kind) {
      case HostNodeKind::Allocate:
        line += fmt::format(" {} : {}", name(n.tv), localType(n.tv));
        break;
      case HostNodeKind::Deallocate:
        line += " " + name(n.tv);
        break;
      case HostNodeKind::LaunchKernel:
      case HostNodeKind::Gemm:
        line += " " + segmentCall(f, n.segment, segment(n));
        break;
      case HostNodeKind::Communication: {
        line += fmt::format(" h{} {} {} -> {} axis {}", n.handle, commKindName(n.comm), name(n.in), name(n.out), n.mesh_axis);
        if (n.comm == CommKind::Allgather || n.comm == CommKind::AllToAll) line += fmt::format(" from dim {}", n.in_dim);
        if (n.comm == CommKind::ReduceScatter || n.comm == CommKind::AllToAll) line += fmt::format(" to dim {}", n.out_dim);
        if (!n.team.empty()) line += fmt::format(" team [{}]", fmt::join(n.team, ", "));
        break;
      }
      case HostNodeKind::Wait:
        line += fmt::format(" h{}", n.handle);
        break;
      case HostNodeKind::ShardSlice:
        line += fmt::format(" {} = {} dim {} axis {}", name(n.out), name(n.in), n.out_dim, n.mesh_axis);
        break;
    }
    s += "  " + line + "\n";
  }
  s += fmt::format("  outputs {}\n}}\n", fmt::join(outs, ", "));
  return s;
}

int64_t peakMemoryBytes(const HostProgram& p, const SymbolBindings& b) {
  int64_t live = 0, peak = 0;
  for (const TensorView* tv : p.fusion->inputs())
    if (tv->mesh() == nullptr || p.rank < 0 || tv->mesh()->contains(p.rank)) live += localBytes(tv, b);
  peak = live;
  for (const HostNode& n : p.nodes) {
    if (n.kind == HostNodeKind::Allocate) peak = std::max(peak, live += localBytes(n.tv, b));
    if (n.kind == HostNodeKind::Deallocate) live -= localBytes(n.tv, b);
  }
  return peak;
}

std::vector<CollectiveInfo> collectives(const HostProgram& p, const SymbolBindings& b) {
  std::vector<CollectiveInfo> out;
  for (const HostNode& n : p.nodes) {
    if (n.kind != HostNodeKind::Communication) continue;
    out.push_back({n.comm, n.mesh_axis, n.team, localBytes(n.in, b), p.fusion->displayName(n.out),
                   p.fusion->displayName(n.in), n.out->provenance()});
  }
  return out;
}

}  // namespace meshfuse
