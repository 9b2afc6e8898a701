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

void touches(const HostProgram& p, const HostNode& n, std::set<const TensorView*>& out) {
  if (n.in.tv) out.insert(n.in.tv);
  if (n.out.tv) out.insert(n.out.tv);
  if (n.segment >= 0) {
    const Segment& seg = p.segment(n);
    out.insert(seg.inputs.begin(), seg.inputs.end());
    out.insert(seg.outputs.begin(), seg.outputs.end());
  }
  for (const HostNode& b : n.body) touches(p, b, out);
}

}  // namespace

void insertDeallocations(HostProgram& p) {
  const Fusion& f = *p.fusion;
  std::map<const TensorView*, size_t> last_use;
  std::map<int64_t, size_t> wait_of;  // a communication's buffers live until its wait
  for (size_t i = 0; i < p.nodes.size(); ++i)
    if (p.nodes[i].kind == HostNodeKind::Wait) wait_of[p.nodes[i].handle] = i;
  std::set<const TensorView*> allocated;  // at top level (loop-local buffers are the loop's)
  for (const HostNode& n : p.nodes)
    if (n.kind == HostNodeKind::Allocate) allocated.insert(n.tv);
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const HostNode& n = p.nodes[i];
    size_t until = n.kind == HostNodeKind::Communication ? wait_of.at(n.handle) : i;
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
