// insert-deallocations: each intermediate is freed right after the node that last reads it.
//
// requires: a specialized (or collective) host program.  guarantees: no Allocate'd tensor
//   outlives its last use, except fusion outputs; fusion inputs belong to the caller.
#include <map>

#include "meshfuse/host_ir.h"
#include "meshfuse/ir/fusion.h"

namespace meshfuse {
namespace {

std::vector<const TensorView*> reads(const HostProgram& p, const HostNode& n) {
  std::vector<const TensorView*> r;
  if (n.in) r.push_back(n.in);
  if (n.segment >= 0) r = p.segment(n).inputs;
  return r;
}

}  // namespace

void insertDeallocations(HostProgram& p) {
  const Fusion& f = *p.fusion;
  std::map<const TensorView*, size_t> last_use;
  std::map<int64_t, size_t> wait_of;  // a communication's buffers live until its wait
  for (size_t i = 0; i < p.nodes.size(); ++i)
    if (p.nodes[i].kind == HostNodeKind::Wait) wait_of[p.nodes[i].handle] = i;
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const HostNode& n = p.nodes[i];
    size_t until = n.kind == HostNodeKind::Communication ? wait_of.at(n.handle) : i;
    for (const TensorView* tv : reads(p, n)) last_use[tv] = std::max(last_use[tv], until);
  }
  std::vector<HostNode> out;
  std::map<size_t, std::vector<const TensorView*>> frees;
  for (const auto& [tv, i] : last_use)
    if (!f.isInput(tv) && !f.isOutput(tv)) frees[i].push_back(tv);
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    out.push_back(p.nodes[i]);
    for (const TensorView* tv : frees[i]) {
      HostNode d;
      d.kind = HostNodeKind::Deallocate;
      d.tv = tv;
      out.push_back(d);
    }
  }
  p.nodes = std::move(out);
}

}  // namespace meshfuse
