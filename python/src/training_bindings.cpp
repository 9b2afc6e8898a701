// Bindings of the training runtime pieces Python builds on: the optimizer fusions
// (meshfuse/optimizer.h) that meshfuse.optim runs through FusionDefinitionWrapper.
#include <pybind11/stl.h>

#include "bindings.h"
#include "meshfuse/error.h"
#include "meshfuse/optimizer.h"

namespace meshfuse::python {
namespace {

using namespace pybind11::literals;

// {"lr": ..., "momentum": ...} for "sgd", {"lr", "beta1", "beta2", "eps", "weight_decay"} for
// "adamw"; absent keys keep the C++ defaults, unknown ones are a ValueError.
OptimizerConfig configOf(const std::string& kind, const py::dict& options) {
  auto take = [&](const char* key, auto& field) {
    if (options.contains(key)) field = options[key].cast<std::remove_reference_t<decltype(field)>>();
  };
  auto known = [&](std::initializer_list<const char*> keys) {
    for (auto item : options) {
      std::string k = item.first.cast<std::string>();
      bool ok = false;
      for (const char* key : keys) ok = ok || k == key;
      MF_USER_CHECK(ok, ErrorKind::Value, "{}: unknown option '{}'", kind, k);
    }
  };
  if (kind == "sgd") {
    known({"lr", "momentum", "weight_decay", "nesterov"});
    SgdOptions o;
    take("lr", o.lr);
    take("momentum", o.momentum);
    take("weight_decay", o.weight_decay);
    take("nesterov", o.nesterov);
    return o;
  }
  MF_USER_CHECK(kind == "adamw", ErrorKind::Value, "unknown optimizer '{}' (expected sgd or adamw)", kind);
  known({"lr", "beta1", "beta2", "eps", "weight_decay"});
  AdamWOptions o;
  take("lr", o.lr);
  take("beta1", o.beta1);
  take("beta2", o.beta2);
  take("eps", o.eps);
  take("weight_decay", o.weight_decay);
  return o;
}

}  // namespace

void bindTraining(py::module_& m) {
  m.def(
      "optimizer_step",
      [](const std::string& kind, const py::dict& options,
         const std::vector<std::pair<std::vector<int64_t>, DataType>>& params) {
        std::vector<ParamType> types;
        for (const auto& [shape, dtype] : params)
          types.push_back({std::vector<Extent>(shape.begin(), shape.end()), dtype});
        OptimizerStep s = buildOptimizerStep(configOf(kind, options), types);
        py::list layout;
        for (const OptimizerStep::Param& p : s.params)
          layout.append(py::make_tuple(p.has_master, p.first_input, p.first_output));
        return py::make_tuple(py::cast(std::move(s.fusion)), layout, s.state, s.scalars);
      },
      "kind"_a, "options"_a, "params"_a,
      "(fusion, [(has_master, first input, first output)] per parameter, state names, scalar names): one fused, "
      "in-place update of the parameters (meshfuse/optimizer.h).");
  m.def(
      "optimizer_scalars",
      [](const std::string& kind, const py::dict& options, int64_t step) {
        return optimizerScalars(configOf(kind, options), step);
      },
      "kind"_a, "options"_a, "step"_a, "The optimizer fusion's scalar inputs at step `step` (from 1).");
}

}  // namespace meshfuse::python
