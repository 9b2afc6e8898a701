// Fusion: node ownership, schema checking of new ops, naming.
#include "meshfuse/ir/fusion.h"

#include <algorithm>
#include <cctype>

#include "ir/shape_inference.h"

namespace meshfuse {

Fusion::~Fusion() = default;

namespace {
bool isPositionalName(const std::string& n) {
  return !n.empty() && std::all_of(n.begin(), n.end(), [](char c) { return c >= '0' && c <= '9'; });
}
}  // namespace

// Names must read back from the text form: letters, digits, '_' and '.'.
static void checkNameChars(const std::string& name, const char* sigil) {
  for (char c : name)
    MF_USER_CHECK(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.', ErrorKind::Name,
                  "name {}{} has the character '{}': names may hold letters, digits, '_' and '.'", sigil, name, c);
}

static void checkNewName(const Fusion& f, const std::string& name) {
  if (name.empty()) return;
  checkNameChars(name, "%");
  MF_USER_CHECK(!isPositionalName(name), ErrorKind::Name,
                "name %{} is reserved: numeric names are assigned by position", name);
  MF_USER_CHECK(f.findTensor(name) == nullptr, ErrorKind::Name, "duplicate name %{}", name);
}

// Constant sizes whose product alone does not fit in an int64 (as elements or bytes) can never
// be allocated, whatever the symbolic sizes become: rejected where the tensor is defined.
static void checkStaticSize(const std::vector<IterDomain*>& logical, DataType dt, const std::string& what) {
  std::vector<int64_t> sizes;
  std::vector<std::string> text;
  for (const IterDomain* id : logical) {
    if (id->isReduction()) continue;
    text.push_back(id->extent().toString());
    if (id->extent().isStatic()) sizes.push_back(id->extent().value());
  }
  MF_USER_CHECK(checkedNumel(sizes, dtypeSize(dt)).has_value(), ErrorKind::Shape,
                "{}: shape [{}] of {} has more elements or bytes than an int64 can count", what, fmt::join(text, ", "),
                dtypeName(dt));
}

TensorView* Fusion::defineTensor(const std::vector<Extent>& shape, DataType dtype, std::string name) {
  checkNewName(*this, name);
  std::vector<IterDomain*> logical;
  int64_t symbols = 0;  // symbolic sizes so far: -1 sizes are named ?s0, ?s1, ... by position
  for (const TensorView* in : inputs_)
    for (const IterDomain* id : in->logical()) symbols += id->extent().isStatic() ? 0 : 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    Extent e = shape[i];
    if (e.isStatic() && e.value() == -1)  // -1: a size bound at run time, named by position
      e = Extent::symbolic(fmt::format("s{}", symbols));
    if (!e.isStatic()) ++symbols;
    MF_USER_CHECK(!e.isStatic() || e.value() >= 0, ErrorKind::Shape, "input {}: dim {} has negative size {}",
                  name.empty() ? "tensor" : "%" + name, i, e.value());
    IterType t = e.isStatic() && e.value() == 1 ? IterType::Broadcast : IterType::Iteration;
    logical.push_back(newIterDomain(e, t));
  }
  checkStaticSize(logical, dtype, name.empty() ? std::string("input tensor") : "input %" + name);
  auto* tv = new TensorView(this, dtype, logical, std::move(name));
  vals_.emplace_back(tv);
  inputs_.push_back(tv);
  return tv;
}

Scalar* Fusion::scalar(double value, DataType dtype) {
  auto* s = new Scalar(this, value, dtype);
  vals_.emplace_back(s);
  return s;
}

TensorView* Fusion::apply(OpKind kind, std::vector<Val*> inputs, Attributes attrs, std::string out_name) {
  const OpInfo& info = opInfo(kind);
  // Operands: pad omitted trailing optionals; variadic tails take the rest.
  bool variadic = !info.operands.empty() && info.operands.back().variadic;
  if (!variadic) {
    size_t required = 0;
    for (const OperandSpec& o : info.operands) required += o.optional ? 0 : 1;
    MF_USER_CHECK(inputs.size() >= required && inputs.size() <= info.operands.size(), ErrorKind::Value,
                  "{}: expected {} operands but got {}", info.name,
                  required == info.operands.size() ? fmt::format("{}", required)
                                                   : fmt::format("{} to {}", required, info.operands.size()),
                  inputs.size());
    inputs.resize(info.operands.size(), nullptr);
  } else {
    MF_USER_CHECK(inputs.size() >= info.operands.size(), ErrorKind::Value,
                  "{}: expected at least {} operands but got {}", info.name, info.operands.size(), inputs.size());
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const OperandSpec& spec = info.operands[std::min(i, info.operands.size() - 1)];
    MF_USER_CHECK(inputs[i] != nullptr || spec.optional, ErrorKind::Value, "{}: operand '{}' is required", info.name,
                  spec.name);
    MF_USER_CHECK(inputs[i] == nullptr || inputs[i]->fusion() == this, ErrorKind::Value,
                  "{}: operand '{}' belongs to a different fusion", info.name, spec.name);
  }
  // Attributes: reject unknown ones, check types, fill defaults.
  for (const auto& [n, v] : attrs) {
    const AttrSpec* spec = info.findAttr(n);
    if (spec == nullptr) {
      std::vector<std::string> names;
      for (const AttrSpec& a : info.attrs) names.push_back(a.name);
      userError(ErrorKind::Value, "{}: unknown attribute '{}' (expected one of: {})", info.name, n,
                names.empty() ? std::string("none") : fmt::format("{}", fmt::join(names, ", ")));
    }
    // An int literal is a fine float.
    if (spec->type == AttrType::Float && std::holds_alternative<int64_t>(v))
      attrs[n] = static_cast<double>(std::get<int64_t>(v));
    MF_USER_CHECK(attrHasType(attrs[n], spec->type), ErrorKind::Value,
                  "{}: attribute '{}' must be of type {} but got {}", info.name, n, attrTypeName(spec->type),
                  formatAttr(v));
  }
  for (const AttrSpec& spec : info.attrs) {
    if (attrs.count(spec.name)) continue;
    MF_USER_CHECK(spec.default_value.has_value(), ErrorKind::Value, "{}: missing required attribute '{}' ({})",
                  info.name, spec.name, attrTypeName(spec.type));
    attrs[spec.name] = *spec.default_value;
  }

  InferredOutput out = inferOutput(*this, kind, inputs, attrs);
  std::vector<IterDomain*> logical;
  for (const InferredDim& d : out.logical) logical.push_back(newIterDomain(d.extent, d.type));
  checkStaticSize(logical, out.dtype, fmt::format("{}: the output", info.name));
  checkNewName(*this, out_name);
  auto* tv = new TensorView(this, out.dtype, logical, std::move(out_name));
  vals_.emplace_back(tv);
  for (ExtentConstraint& c : out.constraints) {
    c.out = tv;
    extent_constraints_.push_back(std::move(c));
  }
  auto* e = new Expr(kind, std::move(inputs), std::move(attrs));
  expr_storage_.emplace_back(e);
  e->outputs_.push_back(tv);
  tv->definition_ = e;
  for (Val* v : e->inputs_)
    if (v != nullptr && std::find(v->uses_.begin(), v->uses_.end(), e) == v->uses_.end()) v->uses_.push_back(e);
  if (insertion_point_ != nullptr) {
    auto at = std::find(exprs_.begin(), exprs_.end(), insertion_point_);
    MF_CHECK(at != exprs_.end(), "insertion point is not in the program");
    exprs_.insert(at, e);
  } else {
    exprs_.push_back(e);
  }
  return tv;
}

void Fusion::replaceOperand(Expr* e, Val* old, Val* replacement) {
  bool found = false;
  for (Val*& v : e->inputs_) {
    if (v != old) continue;
    v = replacement;
    found = true;
  }
  MF_CHECK(found, "{} does not read {}", e->name(), displayName(old));
  std::erase(old->uses_, e);
  if (std::find(replacement->uses_.begin(), replacement->uses_.end(), e) == replacement->uses_.end())
    replacement->uses_.push_back(e);
}

void Fusion::replaceOperandAt(Expr* e, size_t index, Val* replacement) {
  MF_CHECK(index < e->inputs_.size() && e->inputs_[index] != nullptr, "{} has no operand {}", e->name(), index);
  Val* old = e->inputs_[index];
  e->inputs_[index] = replacement;
  if (std::find(e->inputs_.begin(), e->inputs_.end(), old) == e->inputs_.end()) std::erase(old->uses_, e);
  if (std::find(replacement->uses_.begin(), replacement->uses_.end(), e) == replacement->uses_.end())
    replacement->uses_.push_back(e);
}

void Fusion::replaceAllUses(TensorView* old, TensorView* replacement) {
  std::vector<Expr*> uses = old->uses();
  for (Expr* e : uses)
    if (e != replacement->definition()) replaceOperand(e, old, replacement);
  for (TensorView*& o : outputs_)
    if (o == old) o = replacement;
}

void Fusion::setAttribute(Expr* e, const std::string& name, AttrValue value) {
  const AttrSpec* spec = e->info().findAttr(name);
  MF_CHECK(spec != nullptr && attrHasType(value, spec->type), "{} has no attribute '{}' of that type", e->name(), name);
  e->attrs_[name] = std::move(value);
}

void Fusion::rename(Val* v, std::string name) {
  if (v->name_ == name) return;
  checkNewName(*this, name);
  v->name_ = std::move(name);
}

void Fusion::replaceOutput(TensorView* old, TensorView* replacement) {
  auto it = std::find(outputs_.begin(), outputs_.end(), old);
  MF_CHECK(it != outputs_.end(), "{} is not an output", displayName(old));
  *it = replacement;
}

void Fusion::addOutput(TensorView* tv) {
  MF_USER_CHECK(tv != nullptr && tv->fusion() == this, ErrorKind::Value,
                "add_output: the tensor does not belong to this fusion");
  MF_USER_CHECK(!isOutput(tv), ErrorKind::Value, "add_output: {} is already an output", displayName(tv));
  outputs_.push_back(tv);
}

void Fusion::aliasOutputToInput(int64_t output, int64_t input) {
  MF_USER_CHECK(output >= 0 && output < static_cast<int64_t>(outputs_.size()), ErrorKind::Value,
                "alias: output index {} is out of range (the fusion has {} outputs)", output, outputs_.size());
  MF_USER_CHECK(input >= 0 && input < static_cast<int64_t>(inputs_.size()), ErrorKind::Value,
                "alias: input index {} is out of range (the fusion has {} inputs)", input, inputs_.size());
  const TensorView* out = outputs_[output];
  const TensorView* in = inputs_[input];
  MF_USER_CHECK(!isInput(out), ErrorKind::Value, "alias: output {} is an input itself: it has nothing to write",
                displayName(out));
  MF_USER_CHECK(!output_aliases_.count(output), ErrorKind::Value, "alias: output {} already updates input {}",
                displayName(out), displayName(inputs_[output_aliases_.at(output)]));
  for (const auto& [o, i] : output_aliases_)
    MF_USER_CHECK(i != input, ErrorKind::Value, "alias: input {} is already updated by output {}", displayName(in),
                  displayName(outputs_[o]));
  MF_USER_CHECK(out->dtype() == in->dtype(), ErrorKind::Dtype,
                "alias: output {} is {} but input {} is {}: an in-place update keeps the dtype", displayName(out),
                dtypeName(out->dtype()), displayName(in), dtypeName(in->dtype()));
  auto text = [](const TensorView* tv) {
    std::vector<std::string> s;
    for (const Extent& e : tv->shape()) s.push_back(e.toString());
    return fmt::format("[{}]", fmt::join(s, ", "));
  };
  MF_USER_CHECK(text(out) == text(in), ErrorKind::Shape,
                "alias: output {} has shape {} but input {} has shape {}: an in-place update keeps the shape",
                displayName(out), text(out), displayName(in), text(in));
  output_aliases_[output] = input;
}

const TensorView* Fusion::aliasedInput(const TensorView* out) const {
  for (const auto& [o, i] : output_aliases_)
    if (outputs_[o] == out) return inputs_[i];
  return nullptr;
}

void Fusion::removeExpr(Expr* e) {
  for (TensorView* o : e->outputs())
    MF_CHECK(o->uses().empty() && !isOutput(o), "removing {} whose output is still used", e->name());
  for (Val* v : e->inputs())
    if (v != nullptr) std::erase(v->uses_, e);
  std::erase(exprs_, e);
}

std::vector<TensorView*> Fusion::tensorViews() const {
  std::vector<TensorView*> out = inputs_;
  for (Expr* e : exprs_)
    for (TensorView* o : e->outputs()) out.push_back(o);
  return out;
}

bool Fusion::isInput(const Val* v) const { return std::find(inputs_.begin(), inputs_.end(), v) != inputs_.end(); }

bool Fusion::isOutput(const Val* v) const { return std::find(outputs_.begin(), outputs_.end(), v) != outputs_.end(); }

int64_t Fusion::addMesh(const DeviceMesh& mesh, std::string name) {
  for (size_t i = 0; i < meshes_.size(); ++i) {
    if (*meshes_[i].mesh == mesh) {
      if (meshes_[i].name.empty()) meshes_[i].name = std::move(name);
      return static_cast<int64_t>(i);
    }
  }
  checkNameChars(name, "@");
  for (const MeshEntry& m : meshes_)
    MF_USER_CHECK(name.empty() || m.name != name, ErrorKind::Name, "duplicate mesh name @{} (already {})", name,
                  m.mesh->toString());
  meshes_.push_back({std::make_unique<DeviceMesh>(mesh), std::move(name)});
  return static_cast<int64_t>(meshes_.size()) - 1;
}

std::string Fusion::meshName(int64_t index) const {
  const MeshEntry& m = meshes_.at(index);
  if (!m.name.empty()) return m.name;
  // m<index>, with a suffix when the user named another mesh that.
  std::string name = fmt::format("m{}", index);
  auto taken = [&](const std::string& n) {
    return std::any_of(meshes_.begin(), meshes_.end(), [&](const MeshEntry& e) { return e.name == n; });
  };
  while (taken(name)) name += "_";
  return name;
}

IterDomain* Fusion::newIterDomain(Extent extent, IterType type) {
  ids_.push_back(std::make_unique<IterDomain>(std::move(extent), type));
  return ids_.back().get();
}

IdTransform* Fusion::newTransform(IdTransform t) {
  transforms_.push_back(std::make_unique<IdTransform>(std::move(t)));
  return transforms_.back().get();
}

std::string Fusion::displayName(const Val* v) const {
  if (!v->name().empty()) return "%" + v->name();
  if (v->valKind() == ValKind::Scalar) {
    double x = static_cast<const Scalar*>(v)->value();
    if (v->dtype() == DataType::Bool) return x != 0 ? "true" : "false";
    if (v->dtype() == DataType::Int64) return fmt::format("{}", static_cast<int64_t>(x));
    return formatFloat(x);
  }
  int64_t n = 0;
  for (TensorView* tv : tensorViews()) {
    if (tv == v) return fmt::format("%{}", n);
    if (tv->name().empty()) ++n;
  }
  return fmt::format("%{}", n);  // a value being created right now: the next number
}

void Fusion::checkExtentConstraints(const SymbolBindings& bindings) const {
  for (const ExtentConstraint& c : extent_constraints_) {
    int64_t a = c.a.evaluate(bindings), b = c.b.evaluate(bindings);
    MF_USER_CHECK(a == b, ErrorKind::Shape, "{}: {} mismatch: {} has {} = {} but {} has {} = {}",
                  c.out != nullptr && c.out->definition() != nullptr ? c.out->describe() : c.op, c.what,
                  displayName(c.ta), c.a.toString(), a, displayName(c.tb), c.b.toString(), b);
  }
}

TensorView* Fusion::findTensor(std::string_view display_name) const {
  if (display_name.starts_with("%")) display_name.remove_prefix(1);
  int64_t n = 0;
  for (TensorView* tv : tensorViews()) {
    if (tv->name().empty()) {
      if (fmt::format("{}", n++) == display_name) return tv;
    } else if (tv->name() == display_name) {
      return tv;
    }
  }
  return nullptr;
}

int64_t Fusion::worldSizeNeeded() const {
  int64_t needed = 0;
  for (const MeshEntry& m : meshes_)
    for (int64_t d : m.mesh->devices()) needed = std::max(needed, d + 1);
  return needed;
}

}  // namespace meshfuse
