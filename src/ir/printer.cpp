// Printer of the .mf text form. Names are deterministic: user names, else %N by position.
#include "meshfuse/ir/printer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "meshfuse/ir/fusion.h"

namespace meshfuse {
namespace {

std::string stepToString(const ScheduleStep& s) {
  switch (s.kind) {
    case ScheduleStep::Split:
      return s.inner_split ? fmt::format("split({}, {}, inner)", s.axis, s.factor)
                           : fmt::format("split({}, {})", s.axis, s.factor);
    case ScheduleStep::Merge:
      return fmt::format("merge({})", s.axis);
    case ScheduleStep::Parallelize:
      return fmt::format("parallelize({}, {})", s.axis, parallelTypeName(s.ptype));
  }
  return "?";
}

}  // namespace

std::string printTensorType(const TensorView* tv) {
  std::vector<std::string> dims;
  for (const IterDomain* id : tv->logical())
    dims.push_back((id->isReduction() ? "r" : "") + id->extent().toString());
  std::string s = fmt::format("{}[{}]", dtypeName(tv->dtype()), fmt::join(dims, ", "));
  if (tv->meshIndex() >= 0) {
    std::vector<std::string> steps;
    for (const ScheduleStep& st : tv->schedule()) steps.push_back(stepToString(st));
    s += fmt::format(" @{} {{{}}}", tv->fusion()->meshName(tv->meshIndex()), fmt::join(steps, ", "));
  } else if (!tv->schedule().empty()) {
    std::vector<std::string> steps;
    for (const ScheduleStep& st : tv->schedule()) steps.push_back(stepToString(st));
    s += fmt::format(" {{{}}}", fmt::join(steps, ", "));
  }
  return s;
}

std::string printExprCall(const Fusion& f, const Expr* e) {
  std::vector<std::string> args;
  const OpInfo& info = e->info();
  for (size_t i = 0; i < e->inputs().size(); ++i) {
    const Val* v = e->inputs()[i];
    if (v == nullptr) continue;
    const OperandSpec& spec = info.operands[std::min(i, info.operands.size() - 1)];
    args.push_back(spec.optional ? spec.name + "=" + f.displayName(v) : f.displayName(v));
  }
  for (const AttrSpec& spec : info.attrs) {
    const AttrValue& v = e->attrs().at(spec.name);
    if (spec.default_value && *spec.default_value == v) continue;  // defaults stay implicit
    args.push_back(spec.name + "=" + formatAttr(v));
  }
  return fmt::format("{}({})", info.name, fmt::join(args, ", "));
}

std::string printFusion(const Fusion& f) {
  std::string out = "fusion {\n";
  for (int64_t m = 0; m < f.numMeshes(); ++m)
    out += fmt::format("  mesh @{} = {}\n", f.meshName(m), f.mesh(m).toString());
  if (f.reshardByBytes()) out += "  reshard by bytes\n";
  auto annotation = [&](const TensorView* tv) {
    std::string s = printTensorType(tv);
    if (tv->meshIndex() >= 0 && !tv->pinned()) s += " from " + quoteString(tv->provenance());
    return s;
  };
  for (const TensorView* in : f.inputs())
    out += fmt::format("  {} = input {}\n", f.displayName(in), annotation(in));
  for (const Expr* e : f.exprs()) {
    std::vector<std::string> outs;
    for (const TensorView* o : e->outputs()) outs.push_back(f.displayName(o));
    out += fmt::format("  {} = {} : {}\n", fmt::join(outs, ", "), printExprCall(f, e), annotation(e->output()));
  }
  std::vector<std::string> outs;
  for (const TensorView* o : f.outputs()) outs.push_back(f.displayName(o));
  if (!outs.empty()) out += fmt::format("  output {}\n", fmt::join(outs, ", "));
  for (const auto& [o, i] : f.outputAliases())
    out += fmt::format("  alias {} into {}\n", f.displayName(f.outputs()[o]), f.displayName(f.inputs()[i]));
  return out + "}\n";
}

}  // namespace meshfuse
