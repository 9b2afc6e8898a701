// insert-deallocations: each intermediate is freed right after the node that last touches it.
//
// requires: a specialized (or collective) host program.  guarantees: no Allocate'd tensor
//   outlives its last use, except fusion outputs; fusion inputs belong to the caller. A loop
//   counts as touching everything its body touches; buffers allocated inside a loop body are
//   freed by the body itself. (Tasks already submitted to a stream keep their buffers alive
//   until they have run, so freeing after the node that issued them is safe.)
//
//   before: launch #1 %act = gelu(%up) ; allocate %0 ; gemm #2 %0 = linear(%act, %w) ; ...
//   after:  launch #1 %act = gelu(%up) ; deallocate %up ; allocate %0 ;
//           gemm #2 %0 = linear(%act, %w) ; deallocate %act ; ...
#include <map>
#include <set>

#include "lower/host_builder.h"
#include "lower/host_ir.h"
#include "meshfuse/ir/fusion.h"

namespace meshfuse {
namespace {

// The tensors a node reads or writes (an Allocate or Deallocate is not a use).
void touches(const HostProgram& p, const HostNode& node, std::set<const TensorView*>& out) {
  node.visit([&](const auto& n) {
    using T = std::decay_t<decltype(n)>;
    if constexpr (std::is_base_of_v<hir::SegmentCall, T>) {
      const Segment& seg = p.segment(n);
      out.insert(seg.inputs.begin(), seg.inputs.end());
      out.insert(seg.outputs.begin(), seg.outputs.end());
    } else if constexpr (std::is_same_v<T, hir::Communication> || std::is_same_v<T, hir::ShardSlice> ||
                         std::is_same_v<T, hir::Copy>) {
      out.insert(n.in.tv);
      out.insert(n.out.tv);
    } else if constexpr (std::is_same_v<T, hir::ForLoop>) {
      for (const HostNode& b : n.body) touches(p, b, out);
    }
  });
}

}  // namespace

void insertDeallocations(HostProgram& p) {
  const Fusion& f = *p.fusion;
  std::map<const TensorView*, size_t> last_use;
  std::map<int64_t, size_t> wait_of;  // a communication's buffers live until its wait
  for (size_t i = 0; i < p.nodes.size(); ++i)
    if (const auto* w = p.nodes[i].as<hir::Wait>()) wait_of[w->handle] = i;
  std::set<const TensorView*> allocated;  // at top level (loop-local buffers are the loop's)
  for (const HostNode& n : p.nodes)
    if (const auto* a = n.as<hir::Allocate>()) allocated.insert(a->tv);
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const HostNode& n = p.nodes[i];
    const auto* c = n.as<hir::Communication>();
    size_t until = c != nullptr ? wait_of.at(c->handle) : i;
    std::set<const TensorView*> used;
    touches(p, n, used);
    for (const TensorView* tv : used) last_use[tv] = std::max(last_use[tv], until);
  }
  // Frees in program order of the tensors (deterministic text).
  std::map<size_t, std::vector<const TensorView*>> frees;
  for (const TensorView* tv : f.tensorViews())
    if (last_use.count(tv) && allocated.count(tv) && !f.isOutput(tv)) frees[last_use[tv]].push_back(tv);
  std::vector<HostNode> out;
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    out.push_back(p.nodes[i]);
    for (const TensorView* tv : frees[i]) {
      out.push_back(host::deallocate(tv));
    }
  }
  p.nodes = std::move(out);
}

}  // namespace meshfuse
