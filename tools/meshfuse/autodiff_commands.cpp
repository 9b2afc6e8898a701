// `meshfuse dump --stage=backward` and `meshfuse grad-check`.
#include "autodiff_commands.h"

#include <fmt/format.h>

#include <iostream>

#include "meshfuse/ir/parser.h"
#include "meshfuse/ir/printer.h"
#include "lower/pipeline.h"

namespace meshfuse::cli {

std::vector<int64_t> resolve(const Fusion& f, const std::vector<TensorView*>& list, const std::vector<std::string>& names,
                             const char* what) {
  std::vector<int64_t> out;
  if (names.empty()) {
    for (size_t i = 0; i < list.size(); ++i)
      if (isFloatingPoint(list[i]->dtype())) out.push_back(static_cast<int64_t>(i));
    return out;
  }
  std::vector<std::string> known;
  for (const TensorView* tv : list) known.push_back(f.displayName(tv));
  for (const std::string& n : names) {
    std::string bare = !n.empty() && n[0] == '%' ? n.substr(1) : n;
    int64_t found = -1;
    for (size_t i = 0; i < list.size(); ++i) {
      std::string k = known[i];
      if (k == bare || k == "%" + bare || std::to_string(i) == bare) found = static_cast<int64_t>(i);
    }
    MF_USER_CHECK(found >= 0, ErrorKind::Name, "--{}: no {} named '{}' (the fusion's {}s: {})",
                  std::string(what) == "input" ? "wrt" : "outputs", what, n, what, fmt::join(known, ", "));
    out.push_back(found);
  }
  return out;
}

namespace {

AutodiffOptions policy(const AutodiffCliOptions& o) {
  return {o.save_all ? SavePolicy::All : SavePolicy::GemmAndAttention};
}

}  // namespace

std::string dumpBackward(const Fusion& definition, const AutodiffCliOptions& o, const PipelineOptions& pipeline) {
  // Backward shardings start from the forward's: a sharded definition is differentiated after
  // propagate-shardings, so that saved tensors and seeds carry the placements the forward gives
  // them (as value_and_grad's DTensors do), not whatever propagation would pick for open inputs.
  std::unique_ptr<Fusion> propagated = definition.clone();
  if (definition.numMeshes() > 0) runPasses(*propagated, {"propagate-shardings"}, pipeline);
  const Fusion& fusion = *propagated;
  std::vector<int64_t> outs = resolve(fusion, fusion.outputs(), o.outputs, "output");
  std::vector<int64_t> wrt = resolve(fusion, fusion.inputs(), o.wrt, "input");
  Gradients g = differentiate(fusion, outs, wrt, policy(o));
  std::string s = fmt::format("# forward: the outputs, then {} saved for backward (policy: {})\n",
                              g.forward->outputs().size() - static_cast<size_t>(g.num_original_outputs),
                              o.save_all ? "save all" : "save GEMM and attention outputs, recompute the rest");
  s += printFusion(*g.forward);
  s += "# -----\n# backward: one gradient per --wrt input\n" + describeSaves(g);
  s += printFusion(*g.backward);
  return s;
}

bool runGradCheck(const Fusion& fusion, const AutodiffCliOptions& o, const SymbolBindings& sizes,
                  const GradCheckOptions& check, double low, double high, uint64_t seed) {
  std::vector<int64_t> outs = resolve(fusion, fusion.outputs(), o.outputs, "output");
  std::vector<int64_t> wrt = resolve(fusion, fusion.inputs(), o.wrt, "input");
  GradCheckOptions c = check;
  c.autodiff = policy(o);
  GradCheckResult r = gradCheck(fusion, outs, wrt, randomInputs(fusion, sizes, seed, low, high), c);
  for (const auto& in : r.inputs)
    std::cout << fmt::format("input {} {}: worst relative error {:.3g} (max abs err {:.3g}, max |fd| {:.3g}) {}\n",
                             in.index, in.name, in.rel_err, in.max_abs_err, in.max_fd,
                             in.pass ? "ok" : fmt::format("FAILED (tolerance {:g})", c.tolerance));
  std::cout << (r.pass ? "grad-check passed\n" : "grad-check FAILED\n");
  return r.pass;
}

}  // namespace meshfuse::cli
