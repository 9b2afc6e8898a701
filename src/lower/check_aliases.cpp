// check-aliases (see check_aliases.h): the conditions under which an output may be computed in
// its input's buffer.
#include "lower/check_aliases.h"

#include <algorithm>
#include <set>

#include "meshfuse/error.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/placement.h"

namespace meshfuse {

namespace {

// Ops that compute element i of their output from element i of their operands (broadcast
// operands aside), so that a kernel of them reads an element before it writes it.
bool elementwise(const Expr* e, const TensorView* in) {
  switch (e->info().category) {
    case OpCategory::Unary:
    case OpCategory::Binary:
    case OpCategory::Compare:
    case OpCategory::Ternary:
    case OpCategory::Cast:
    case OpCategory::Set: return true;
    // A broadcast of another operand (a scalar hyper-parameter) is read whole: harmless. One of
    // the updated input would read other elements than the one written.
    case OpCategory::BroadcastInDim: return e->input(size_t{0}) != in;
    default: return false;
  }
}

void checkAlias(const Fusion& f, const std::vector<Segment>& segments, const TensorView* out, const TensorView* in) {
  auto why = [&](const std::string& reason) {
    userError(ErrorKind::Unsupported, "output {} cannot update input {} in place: {}", f.displayName(out),
              f.displayName(in), reason);
  };
  const Segment* writer = nullptr;
  for (const Segment& s : segments)
    if (std::find(s.outputs.begin(), s.outputs.end(), out) != s.outputs.end()) writer = &s;
  MF_CHECK(writer != nullptr, "no segment writes fusion output {}", f.displayName(out));
  // A Stream-split (chunked, microbatched) output is allocated per chunk inside a loop.
  if (streamSplitOf(out).has_value()) why("it is computed in stream chunks");
  if (writer->kind != Segment::Kind::Kernel)
    why(fmt::format("it is computed by a {} segment, not an elementwise kernel", segmentKindName(writer->kind)));
  for (const Expr* e : writer->exprs)
    if (!elementwise(e, in))
      why(fmt::format("its kernel computes {}, which is not elementwise", e->output()->describe()));
  // The kernel computes its stored values one after another (kernel_lower.cpp), re-reading inputs
  // in each: a value computed from the input's old contents must be needed for the output
  // itself (computed before it is stored), not by a value the kernel may compute after it.
  // Values computed from the new contents read them through the output (stored): fine.
  std::set<const Val*> needed = {out};
  for (auto it = writer->exprs.rbegin(); it != writer->exprs.rend(); ++it)
    if (needed.count((*it)->output()))
      for (const Val* v : (*it)->inputs()) needed.insert(v);
  std::set<const Val*> old_reader = {in};
  for (const Expr* e : writer->exprs) {
    bool reads_old =
        std::any_of(e->inputs().begin(), e->inputs().end(), [&](const Val* v) { return old_reader.count(v); });
    if (!reads_old || e->output() == out) continue;
    if (!needed.count(e->output()))
      why(fmt::format("the kernel also computes {} from the input's old contents, after they may be overwritten",
                      e->output()->describe()));
    old_reader.insert(e->output());
  }
  for (const Segment& s : segments)
    if (&s != writer && std::find(s.inputs.begin(), s.inputs.end(), in) != s.inputs.end())
      why(fmt::format("another {} segment ({}) reads the input", segmentKindName(s.kind),
                      s.exprs.empty() ? std::string("?") : s.exprs.front()->output()->describe()));
}

}  // namespace

void checkAliases(const Fusion& f, const std::vector<Segment>& segments) {
  for (const auto& [o, i] : f.outputAliases()) checkAlias(f, segments, f.outputs().at(o), f.inputs().at(i));
}

}  // namespace meshfuse
