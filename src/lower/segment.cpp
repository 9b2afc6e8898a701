// segment: one segment per op for now (Gemm for linear/matmul, Communication for resharding
// sets, Kernel for the rest). The kernel issue replaces this with real fusion of op chains.
#include "meshfuse/segment.h"

#include <algorithm>
#include <set>

#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/placement.h"
#include "meshfuse/ir/printer.h"

namespace meshfuse {
namespace {

// A `set` whose operand and output are sharded differently: a communication.
bool isResharding(const Expr* e) {
  if (e->kind() != OpKind::Set) return false;
  const auto* in = static_cast<const TensorView*>(e->input(size_t{0}));
  const TensorView* out = e->output();
  if (in->mesh() == nullptr || out->mesh() == nullptr) return false;
  return *in->mesh() != *out->mesh() || placementsOf(in) != placementsOf(out);
}

}  // namespace

const char* segmentKindName(Segment::Kind k) {
  switch (k) {
    case Segment::Kind::Kernel: return "kernel";
    case Segment::Kind::Gemm: return "gemm";
    case Segment::Kind::Communication: return "comm";
  }
  return "?";
}

std::vector<Segment> segmentFusion(const Fusion& f) {
  std::vector<Segment> out;
  for (const Expr* e : f.exprs()) {
    Segment s;
    s.kind = e->info().category == OpCategory::Gemm ? Segment::Kind::Gemm
             : isResharding(e)                       ? Segment::Kind::Communication
                                                     : Segment::Kind::Kernel;
    s.exprs = {e};
    for (const Val* v : e->inputs())
      if (v != nullptr && v->valKind() == ValKind::TensorView &&
          std::find(s.inputs.begin(), s.inputs.end(), v) == s.inputs.end())
        s.inputs.push_back(static_cast<const TensorView*>(v));
    s.outputs = {e->output()};
    out.push_back(std::move(s));
  }
  return out;
}

std::string printSegments(const Fusion& f, const std::vector<Segment>& segments) {
  std::string s = "segments {\n";
  auto names = [&](const std::vector<const TensorView*>& tvs) {
    std::vector<std::string> n;
    for (const TensorView* tv : tvs) n.push_back(f.displayName(tv));
    return fmt::format("{}", fmt::join(n, ", "));
  };
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& seg = segments[i];
    std::vector<std::string> ops;
    for (const Expr* e : seg.exprs) ops.push_back(std::string(e->name()));
    s += fmt::format("  {} #{} ({}) -> ({}): {}\n", segmentKindName(seg.kind), i, names(seg.inputs), names(seg.outputs),
                     fmt::join(ops, ", "));
  }
  return s + "}\n";
}

}  // namespace meshfuse
