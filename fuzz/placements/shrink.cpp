// Greedy shrinking (shrink.h): try each smaller candidate in a fixed order, take the first that
// still fails, start over; stop when none does or the budget is spent.
#include "shrink.h"

#include <algorithm>

namespace meshfuse::placement_fuzz {

CaseSpec restructure(const CaseSpec& c, const std::vector<int>& outputs, const std::vector<bool>& as_input) {
  const int inputs = static_cast<int>(c.input_shapes.size());
  std::vector<bool> keep(c.numTensors(), false);
  std::vector<int> work = outputs;
  while (!work.empty()) {
    const int t = work.back();
    work.pop_back();
    if (keep[t]) continue;
    keep[t] = true;
    if (t >= inputs && !as_input[t - inputs])
      for (int o : c.ops[t - inputs].operands) work.push_back(o);
  }
  const std::vector<Shape> shapes = shapesOf(c);
  CaseSpec out;
  out.name = c.name;
  out.mesh_shape = c.mesh_shape;
  out.slots = c.slots;
  std::vector<int> id(c.numTensors(), -1);
  for (int t = 0; t < inputs; ++t)
    if (keep[t]) {
      id[t] = static_cast<int>(out.input_shapes.size());
      out.input_shapes.push_back(c.input_shapes[t]);
      out.input_placements.push_back(c.input_placements[t]);
    }
  for (int t = inputs; t < c.numTensors(); ++t)
    if (keep[t] && as_input[t - inputs]) {
      id[t] = static_cast<int>(out.input_shapes.size());
      out.input_shapes.push_back(shapes[t]);
      out.input_placements.push_back(std::vector<Placement>(c.mesh_shape.size(), Placement::replicate()));
    }
  for (int t = inputs; t < c.numTensors(); ++t)
    if (keep[t] && !as_input[t - inputs]) {
      id[t] = out.numTensors();
      OpSpec op = c.ops[t - inputs];
      for (int& o : op.operands) o = id[o];
      out.ops.push_back(op);
    }
  for (int t : outputs) {
    // An output that became an input is no longer computed: it is dropped.
    if (id[t] < static_cast<int>(out.input_shapes.size())) continue;
    out.outputs.push_back(id[t]);
    const auto k = std::find(c.outputs.begin(), c.outputs.end(), t) - c.outputs.begin();
    out.output_pins.push_back(k < static_cast<int64_t>(c.outputs.size()) ? c.output_pins[k] : std::vector<Placement>{});
  }
  return out;
}

namespace {

std::vector<CaseSpec> candidates(const CaseSpec& c) {
  std::vector<CaseSpec> out;
  const std::vector<bool> none(c.ops.size(), false);
  const int inputs = static_cast<int>(c.input_shapes.size());
  for (size_t k = 0; c.outputs.size() > 1 && k < c.outputs.size(); ++k) {
    std::vector<int> rest = c.outputs;
    rest.erase(rest.begin() + k);
    out.push_back(restructure(c, rest, none));
  }
  for (int t = inputs; t < c.numTensors(); ++t)  // an earlier result as the only output
    if (std::find(c.outputs.begin(), c.outputs.end(), t) == c.outputs.end()) out.push_back(restructure(c, {t}, none));
  for (size_t i = 0; i < c.ops.size(); ++i) {  // an op's result given as an input instead
    std::vector<bool> as_input = none;
    as_input[i] = true;
    CaseSpec s = restructure(c, c.outputs, as_input);
    if (!s.outputs.empty()) out.push_back(s);
  }
  for (size_t k = 0; k < c.outputs.size(); ++k)
    if (!c.output_pins[k].empty()) {
      CaseSpec s = c;
      s.output_pins[k].clear();
      out.push_back(s);
    }
  for (size_t i = 0; i < c.input_placements.size(); ++i)
    for (size_t a = 0; a < c.mesh_shape.size(); ++a)
      if (c.input_placements[i][a] != Placement::replicate()) {
        CaseSpec s = c;
        s.input_placements[i][a] = Placement::replicate();
        out.push_back(s);
      }
  for (size_t slot = 0; slot < c.slots.size(); ++slot)
    for (int64_t f : {2, 3})
      if (c.slots[slot] % f == 0 && c.slots[slot] > f) {
        CaseSpec s = c;
        s.slots[slot] /= f;
        out.push_back(s);
      }
  if (c.mesh_shape.size() == 2)  // a 1-D mesh of the same devices, keeping one axis' placements
    for (size_t a = 0; a < 2; ++a) {
      CaseSpec s = c;
      s.mesh_shape = {c.meshSize()};
      for (auto& ps : s.input_placements) ps = {ps[a]};
      for (auto& ps : s.output_pins)
        if (!ps.empty()) ps = {ps[a]};
      out.push_back(s);
    }
  return out;
}

}  // namespace

CaseSpec shrinkCase(CaseSpec c, const std::function<bool(const CaseSpec&)>& fails, int budget) {
  for (bool progress = true; progress && budget > 0;) {
    progress = false;
    for (const CaseSpec& s : candidates(c)) {
      if (budget-- <= 0) break;
      if (fails(s)) {
        c = s;
        progress = true;
        break;
      }
    }
  }
  return c;
}

}  // namespace meshfuse::placement_fuzz
