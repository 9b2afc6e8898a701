// Shapes, the Fusion, and the text forms of a placement-fuzzer case (case_spec.h).
#include "case_spec.h"

#include <fmt/format.h>

#include <numeric>
#include <sstream>

#include "meshfuse/error.h"
#include "meshfuse/ops.h"

namespace meshfuse::placement_fuzz {

const char* fuzzOpName(FuzzOp op) {
  switch (op) {
#define MESHFUSE_X(name, text) \
  case FuzzOp::name: return text;
    MESHFUSE_FUZZ_OPS(MESHFUSE_X)
#undef MESHFUSE_X
  }
  return "?";
}

int64_t CaseSpec::meshSize() const {
  return std::accumulate(mesh_shape.begin(), mesh_shape.end(), int64_t{1}, std::multiplies<>());
}

std::vector<int64_t> extents(const CaseSpec& c, const Shape& s) {
  std::vector<int64_t> out;
  for (const Dim& d : s) {
    int64_t e = 1;
    for (int slot : d) e *= c.slots.at(slot);
    out.push_back(e);
  }
  return out;
}

namespace {

Shape resultShape(const OpSpec& op, const std::vector<Shape>& shapes) {
  const Shape& x = shapes.at(op.operands.at(0));
  switch (op.kind) {
    case FuzzOp::Sum:
    case FuzzOp::Mean:
    case FuzzOp::Max: {
      Shape out = x;
      out.erase(out.begin() + op.axis);
      return out;
    }
    case FuzzOp::Linear: {
      Shape out(x.begin(), x.end() - 1);
      out.push_back(shapes.at(op.operands.at(1)).at(0));
      return out;
    }
    case FuzzOp::Matmul: return {x.at(0), shapes.at(op.operands.at(1)).at(1)};
    case FuzzOp::Permute: {
      Shape out;
      for (int64_t d : op.perm) out.push_back(x.at(d));
      return out;
    }
    case FuzzOp::Reshape: return op.new_shape;
    default: return x;  // pointwise, softmax, norms, sdpa (q's shape)
  }
}

TensorView* buildOp(const CaseSpec& c, const OpSpec& op, const std::vector<TensorView*>& tvs) {
  auto in = [&](size_t i) { return tvs.at(op.operands.at(i)); };
  switch (op.kind) {
    case FuzzOp::Exp: return ops::exp(in(0));
    case FuzzOp::Tanh: return ops::tanh(in(0));
    case FuzzOp::Relu: return ops::relu(in(0));
    case FuzzOp::Neg: return ops::neg(in(0));
    case FuzzOp::Add: return ops::add(in(0), in(1));
    case FuzzOp::Mul: return ops::mul(in(0), in(1));
    case FuzzOp::Sum: return ops::sum(in(0), {op.axis});
    case FuzzOp::Mean: return ops::mean(in(0), {op.axis});
    case FuzzOp::Max: return ops::max(in(0), {op.axis});
    case FuzzOp::Linear: return ops::linear(in(0), in(1));
    case FuzzOp::Matmul: return ops::matmul(in(0), in(1));
    case FuzzOp::Permute: return ops::permute(in(0), op.perm);
    case FuzzOp::Reshape: return ops::reshape(in(0), extents(c, op.new_shape));
    case FuzzOp::Softmax: return ops::softmax(in(0), op.axis);
    case FuzzOp::LayerNorm: return ops::layerNorm(in(0));
    case FuzzOp::RmsNorm: return ops::rmsNorm(in(0));
    case FuzzOp::Sdpa: return ops::sdpa(in(0), in(1), in(2));
  }
  throw InternalError("placement fuzzer: unknown op");
}

std::string dimText(const Dim& d) {
  if (d.empty()) return "1";
  std::string s;
  for (int slot : d) s += fmt::format("{}x{}", s.empty() ? "" : "*", slot);
  return s;
}

std::string shapeText(const Shape& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + dimText(s[i]);
  return out;
}

std::string placementsText(const std::vector<Placement>& ps) {
  std::string out;
  for (size_t i = 0; i < ps.size(); ++i) {
    const Placement& p = ps[i];
    out += i ? "," : "";
    out += p.kind == Placement::Shard ? fmt::format("S{}", p.dim) : p.kind == Placement::Partial ? "P" : "R";
  }
  return out;
}

std::vector<std::string> splitOn(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, sep);) parts.push_back(part);
  if (!s.empty() && s.back() == sep) parts.push_back("");
  return parts;
}

[[noreturn]] void malformed(const std::string& what, const std::string& text) {
  throw UserError(ErrorKind::Value, fmt::format("placement-fuzz case: malformed {} '{}'", what, text));
}

int64_t number(const std::string& s) {
  try {
    size_t used = 0;
    int64_t v = std::stoll(s, &used);
    if (used == s.size()) return v;
  } catch (const std::exception&) {
  }
  malformed("number", s);
}

Shape parseShape(const std::string& text) {
  Shape shape;
  if (text.empty()) return shape;
  for (const std::string& d : splitOn(text, ',')) {
    Dim dim;
    if (d != "1")
      for (const std::string& slot : splitOn(d, '*')) {
        if (slot.size() < 2 || slot[0] != 'x') malformed("dim", d);
        dim.push_back(static_cast<int>(number(slot.substr(1))));
      }
    shape.push_back(dim);
  }
  return shape;
}

std::vector<Placement> parsePlacements(const std::string& text) {
  std::vector<Placement> ps;
  if (text.empty()) return ps;
  for (const std::string& p : splitOn(text, ',')) {
    if (p == "R") ps.push_back(Placement::replicate());
    else if (p == "P") ps.push_back(Placement::partial());
    else if (p.size() >= 2 && p[0] == 'S') ps.push_back(Placement::shard(number(p.substr(1))));
    else malformed("placement", p);
  }
  return ps;
}

std::vector<int64_t> numbers(const std::string& text, char sep) {
  std::vector<int64_t> out;
  if (!text.empty())
    for (const std::string& s : splitOn(text, sep)) out.push_back(number(s));
  return out;
}

OpSpec parseOp(const std::string& text) {
  std::vector<std::string> f = splitOn(text, ':');
  if (f.size() != 3) malformed("op", text);
  OpSpec op;
  bool known = false;
#define MESHFUSE_X(name, str) \
  if (f[0] == str) op.kind = FuzzOp::name, known = true;
  MESHFUSE_FUZZ_OPS(MESHFUSE_X)
#undef MESHFUSE_X
  if (!known) malformed("op name", f[0]);
  for (int64_t id : numbers(f[1], '.')) op.operands.push_back(static_cast<int>(id));
  if (op.kind == FuzzOp::Permute) op.perm = numbers(f[2], '.');
  else if (op.kind == FuzzOp::Reshape) op.new_shape = parseShape(f[2]);
  else if (!f[2].empty()) op.axis = number(f[2]);
  return op;
}

std::string opAttrText(const OpSpec& op) {
  switch (op.kind) {
    case FuzzOp::Permute: return fmt::format("{}", fmt::join(op.perm, "."));
    case FuzzOp::Reshape: return shapeText(op.new_shape);
    case FuzzOp::Sum:
    case FuzzOp::Mean:
    case FuzzOp::Max:
    case FuzzOp::Softmax: return fmt::format("{}", op.axis);
    default: return "";
  }
}

}  // namespace

std::vector<Shape> shapesOf(const CaseSpec& c) {
  std::vector<Shape> shapes = c.input_shapes;
  for (const OpSpec& op : c.ops) shapes.push_back(resultShape(op, shapes));
  return shapes;
}

DeviceMesh meshOf(const CaseSpec& c) {
  std::vector<int64_t> devices(c.meshSize());
  std::iota(devices.begin(), devices.end(), 0);
  return DeviceMesh(devices, c.mesh_shape);
}

namespace {
bool dividesEvenly(const CaseSpec& c, const Shape& shape, const std::vector<Placement>& ps) {
  if (ps.empty()) return true;
  if (ps.size() != c.mesh_shape.size()) return false;
  const std::vector<int64_t> ext = extents(c, shape);
  std::vector<int64_t> split(ext.size(), 1);
  for (size_t a = 0; a < ps.size(); ++a) {
    if (ps[a].kind != Placement::Shard) continue;
    if (ps[a].dim < 0 || ps[a].dim >= static_cast<int64_t>(ext.size())) return false;
    split[ps[a].dim] *= c.mesh_shape[a];
  }
  for (size_t d = 0; d < ext.size(); ++d)
    if (ext[d] % split[d] != 0) return false;
  return true;
}
}  // namespace

bool evenlyPlaced(const CaseSpec& c) {
  const std::vector<Shape> shapes = shapesOf(c);
  for (size_t i = 0; i < c.input_shapes.size(); ++i)
    if (!dividesEvenly(c, shapes[i], c.input_placements[i])) return false;
  for (size_t k = 0; k < c.outputs.size(); ++k)
    if (!dividesEvenly(c, shapes.at(c.outputs[k]), c.output_pins[k])) return false;
  return true;
}

std::unique_ptr<Fusion> buildDefinition(const CaseSpec& c) {
  auto f = std::make_unique<Fusion>();
  std::vector<TensorView*> tvs;
  for (size_t i = 0; i < c.input_shapes.size(); ++i) {
    std::vector<Extent> shape;
    for (int64_t e : extents(c, c.input_shapes[i])) shape.emplace_back(e);
    tvs.push_back(f->defineTensor(shape, DataType::Float, fmt::format("t{}", i)));
  }
  for (const OpSpec& op : c.ops) {
    TensorView* out = buildOp(c, op, tvs);
    f->rename(out, fmt::format("t{}", tvs.size()));
    tvs.push_back(out);
  }
  for (size_t i = 0; i < c.outputs.size(); ++i) {
    TensorView* out = tvs.at(c.outputs[i]);
    if (!c.output_pins.at(i).empty()) applyPlacements(out, meshOf(c), c.output_pins[i]);
    f->addOutput(out);
  }
  return f;
}

std::string serializeCase(const CaseSpec& c) {
  std::string s = fmt::format("name={};mesh={};slots={}", c.name, fmt::join(c.mesh_shape, "x"), fmt::join(c.slots, ","));
  for (size_t i = 0; i < c.input_shapes.size(); ++i)
    s += fmt::format(";in={}@{}", shapeText(c.input_shapes[i]), placementsText(c.input_placements[i]));
  for (const OpSpec& op : c.ops)
    s += fmt::format(";op={}:{}:{}", fuzzOpName(op.kind), fmt::join(op.operands, "."), opAttrText(op));
  for (size_t i = 0; i < c.outputs.size(); ++i) s += fmt::format(";out={}@{}", c.outputs[i], placementsText(c.output_pins[i]));
  return s;
}

CaseSpec parseCase(const std::string& text) {
  CaseSpec c;
  for (const std::string& field : splitOn(text, ';')) {
    size_t eq = field.find('=');
    if (eq == std::string::npos) malformed("field", field);
    std::string key = field.substr(0, eq), value = field.substr(eq + 1);
    size_t at = value.find('@');
    if (key == "name") c.name = value;
    else if (key == "mesh") c.mesh_shape = numbers(value, 'x');
    else if (key == "slots") c.slots = numbers(value, ',');
    else if (key == "op") c.ops.push_back(parseOp(value));
    else if ((key == "in" || key == "out") && at != std::string::npos) {
      if (key == "in") {
        c.input_shapes.push_back(parseShape(value.substr(0, at)));
        c.input_placements.push_back(parsePlacements(value.substr(at + 1)));
      } else {
        c.outputs.push_back(static_cast<int>(number(value.substr(0, at))));
        c.output_pins.push_back(parsePlacements(value.substr(at + 1)));
      }
    } else {
      malformed("field", field);
    }
  }
  if (c.mesh_shape.empty() || c.outputs.empty()) malformed("case (no mesh or no output)", text);
  return c;
}

std::string describeCase(const CaseSpec& c) {
  std::vector<Shape> shapes = shapesOf(c);
  std::string s = fmt::format("case {} on mesh [{}]\n", c.name, fmt::join(c.mesh_shape, "x"));
  for (int t = 0; t < c.numTensors(); ++t) {
    std::string shape = fmt::format("[{}]", fmt::join(extents(c, shapes[t]), ", "));
    if (t < static_cast<int>(c.input_shapes.size())) {
      s += fmt::format("  %t{} = input f32{} {}\n", t, shape, placementsToString(c.input_placements[t]));
      continue;
    }
    const OpSpec& op = c.ops[t - c.input_shapes.size()];
    std::vector<std::string> args;
    for (int o : op.operands) args.push_back(fmt::format("%t{}", o));
    std::string attr = opAttrText(op);
    s += fmt::format("  %t{} = {}({}{}) f32{}\n", t, fuzzOpName(op.kind), fmt::join(args, ", "),
                     attr.empty() ? "" : ", " + attr, shape);
  }
  for (size_t i = 0; i < c.outputs.size(); ++i)
    s += fmt::format("  output %t{}{}\n", c.outputs[i],
                     c.output_pins[i].empty() ? "" : " pinned " + placementsToString(c.output_pins[i]));
  return s;
}

}  // namespace meshfuse::placement_fuzz
