// Bindings of the fusion IR: dtypes, parallel types, meshes, placements, Fusion, TensorView
// and its schedule API, and ops. Ops are bound ONCE, generically, from the op table (ops.def):
// `op_schemas()` describes every op and `apply()` builds any of them, so the Python `fd.ops`
// namespace is generated and cannot miss an op (STYLE.md #1).
#include <pybind11/operators.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "meshfuse/autodiff.h"
#include "meshfuse/ir/device_mesh.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/ir/placement.h"
#include "meshfuse/ir/printer.h"
#include "meshfuse/ir/verifier.h"
#include "meshfuse/ops.h"

namespace meshfuse::python {
namespace {

using namespace pybind11::literals;

// ParallelType as Python spells it (nvFuser's names): mesh_x is DIDx, the LAST mesh axis
// (device_mesh.h holds that mapping).
const char* pythonName(ParallelType pt) {
  switch (pt) {
    case ParallelType::Serial: return "serial";
    case ParallelType::DIDx: return "mesh_x";
    case ParallelType::DIDy: return "mesh_y";
    case ParallelType::DIDz: return "mesh_z";
    case ParallelType::Stream: return "stream";
  }
  return "?";
}

// One loop axis of a TensorView, as `tv.axis(i)` returns it. Holds the IterDomain itself, so
// later splits of other axes do not change which axis it names; parallelizing goes through the
// TensorView so that the step is recorded in its schedule.
struct AxisRef {
  TensorView* tv;
  IterDomain* id;
  int64_t index() const {
    const auto& loop = tv->loop();
    auto it = std::find(loop.begin(), loop.end(), id);
    MF_USER_CHECK(it != loop.end(), ErrorKind::Value,
                  "axis {} of {} is no longer in its loop domain (it was split or merged since tv.axis() returned it)",
                  id->toString(), tv->fusion()->displayName(tv));
    return it - loop.begin();
  }
};

std::string pyTypeName(py::handle h) { return py::str(py::type::handle_of(h).attr("__name__")); }

// A pointwise operand: a TensorView of `f`, or a Python number (a scalar constant).
Val* toVal(Fusion& f, py::handle h, std::string_view op) {
  if (py::isinstance<TensorView>(h)) {
    auto* tv = h.cast<TensorView*>();
    MF_USER_CHECK(tv->fusion() == &f, ErrorKind::Value, "{}: operand {} belongs to another FusionDefinition", op,
                  tv->fusion()->displayName(tv));
    return tv;
  }
  if (py::isinstance<py::bool_>(h)) return f.scalar(h.cast<bool>() ? 1.0 : 0.0, DataType::Bool);
  if (py::isinstance<py::int_>(h)) return f.scalar(static_cast<double>(h.cast<int64_t>()), DataType::Int64);
  if (py::isinstance<py::float_>(h)) return f.scalar(h.cast<double>(), DataType::Float);
  userError(ErrorKind::Value, "{}: an operand must be a TensorView or a Python number, got {}", op, pyTypeName(h));
}

std::vector<int64_t> toInts(py::handle h, std::string_view op, std::string_view what) {
  bool ok = py::isinstance<py::sequence>(h) && !py::isinstance<py::str>(h);
  if (ok)
    for (py::handle x : h) ok &= py::isinstance<py::int_>(x) && !py::isinstance<py::bool_>(x);
  MF_USER_CHECK(ok, ErrorKind::Value, "{}: {} must be a list of ints, got {}", op, what,
                std::string(py::str(py::repr(h))));
  std::vector<int64_t> out;
  for (py::handle x : h) out.push_back(x.cast<int64_t>());
  return out;
}

AttrValue toAttr(py::handle h, const AttrSpec& spec, std::string_view op) {
  std::string what = fmt::format("attribute '{}'", spec.name);
  auto expect = [&](bool ok, const char* type) {
    MF_USER_CHECK(ok, ErrorKind::Value, "{}: {} must be {}, got {} ({})", op, what, type,
                  std::string(py::str(py::repr(h))), pyTypeName(h));
  };
  bool is_int = py::isinstance<py::int_>(h) && !py::isinstance<py::bool_>(h);
  switch (spec.type) {
    case AttrType::Int: expect(is_int, "an int"); return h.cast<int64_t>();
    case AttrType::Ints: return toInts(h, op, what);
    case AttrType::Float: expect(is_int || py::isinstance<py::float_>(h), "a number"); return h.cast<double>();
    case AttrType::Bool: expect(py::isinstance<py::bool_>(h), "True or False"); return h.cast<bool>();
    case AttrType::Str: expect(py::isinstance<py::str>(h), "a string"); return h.cast<std::string>();
    case AttrType::Dtype: expect(py::isinstance<DataType>(h), "a meshfuse.DataType"); return h.cast<DataType>();
  }
  MF_CHECK(false, "unknown attribute type");
}

py::object attrToPython(const AttrValue& v) {
  return std::visit([](const auto& x) -> py::object { return py::cast(x); }, v);
}

// The op `name` applied to `operands` (schema order; None: an absent optional; a list: a
// variadic tail) with attributes `attrs` (missing ones take their defaults).
TensorView* apply(Fusion& f, const std::string& name, const py::list& operands, const py::dict& attrs) {
  std::optional<OpKind> kind = parseOpKind(name);
  MF_USER_CHECK(kind.has_value(), ErrorKind::Value, "unknown op '{}'", name);
  const OpInfo& info = opInfo(*kind);
  std::vector<Val*> in;
  for (py::handle o : operands) {
    if (o.is_none()) {
      in.push_back(nullptr);
    } else if (py::isinstance<py::list>(o) || py::isinstance<py::tuple>(o)) {  // variadic tail
      for (py::handle x : o) in.push_back(toVal(f, x, info.name));
    } else {
      in.push_back(toVal(f, o, info.name));
    }
  }
  Attributes a;
  for (auto [k, v] : attrs) {
    std::string key = py::str(k);
    const AttrSpec* spec = info.findAttr(key);
    MF_USER_CHECK(spec != nullptr, ErrorKind::Value, "{}: unknown attribute '{}'", info.name, key);
    if (!v.is_none()) a.emplace(key, toAttr(v, *spec, info.name));
  }
  return f.apply(*kind, std::move(in), std::move(a));
}

py::list opSchemas() {
  py::list out;
  for (OpKind k : allOpKinds()) {
    const OpInfo& info = opInfo(k);
    py::list operands, attrs;
    for (const OperandSpec& o : info.operands)
      operands.append(py::dict("name"_a = o.name, "optional"_a = o.optional, "variadic"_a = o.variadic));
    for (const AttrSpec& a : info.attrs)
      attrs.append(py::dict("name"_a = a.name, "type"_a = std::string(attrTypeName(a.type)),
                            "required"_a = !a.default_value.has_value(),
                            "default"_a = a.default_value ? attrToPython(*a.default_value) : py::none()));
    out.append(py::dict("name"_a = std::string(info.name), "operands"_a = operands, "attrs"_a = attrs));
  }
  return out;
}

TensorView* binary(OpKind k, py::handle a, py::handle b) {
  TensorView* tv = py::isinstance<TensorView>(a) ? a.cast<TensorView*>() : b.cast<TensorView*>();
  Fusion& f = *tv->fusion();
  return f.apply(k, {toVal(f, a, opInfo(k).name), toVal(f, b, opInfo(k).name)});
}

// A comparison operator: the op for TensorViews and numbers; NotImplemented for anything else,
// so that `tv == None` falls back to Python's identity comparison (False) as for other objects.
py::object compare(OpKind k, py::handle a, py::handle b) {
  auto operand = [](py::handle h) {
    return py::isinstance<TensorView>(h) || py::isinstance<py::int_>(h) || py::isinstance<py::float_>(h);
  };
  if (!operand(a) || !operand(b)) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
  return py::cast(binary(k, a, b), py::return_value_policy::reference);
}

std::vector<int64_t> shapeOf(const TensorView* tv) {
  std::vector<int64_t> out;
  for (const Extent& e : tv->shape()) out.push_back(e.isStatic() ? e.value() : -1);
  return out;
}

void bindEnums(py::module_& m) {
  py::enum_<DataType> dt(m, "DataType", "Element types (bf16/f16 are computed in f32 on CPUs).");
#define MESHFUSE_X(e, s, n) dt.value(#e, DataType::e);
  MESHFUSE_DTYPES(MESHFUSE_X)
#undef MESHFUSE_X
  dt.def_property_readonly("short_name", [](DataType d) { return std::string(dtypeName(d)); });
  dt.def_property_readonly("itemsize", &dtypeSize);

  py::enum_<ParallelType> pt(m, "ParallelType",
                             "How a loop axis runs: mesh_x/y/z = the last/second-last/third-last mesh axis.");
#define MESHFUSE_X(e, s) pt.value(pythonName(ParallelType::e), ParallelType::e);
  MESHFUSE_PARALLEL_TYPES(MESHFUSE_X)
#undef MESHFUSE_X
}

void bindMeshAndPlacements(py::module_& m) {
  py::class_<DeviceMesh>(m, "DeviceMesh")
      .def(py::init<std::vector<int64_t>, std::vector<int64_t>>(), "devices"_a, "shape"_a = std::vector<int64_t>{})
      .def_property_readonly("devices", &DeviceMesh::devices)
      .def_property_readonly("shape", [](const DeviceMesh& d) { return py::tuple(py::cast(d.shape())); })
      .def_property_readonly("ndim", &DeviceMesh::rank)
      .def(
          "size", [](const DeviceMesh& d, std::optional<int64_t> axis) { return axis ? d.size(*axis) : d.size(); },
          "axis"_a = py::none())
      .def("__contains__", &DeviceMesh::contains)
      .def("coordinates", &DeviceMesh::coordinates, "device"_a)
      .def("team", &DeviceMesh::team, "device"_a, "axis"_a)
      .def("parallel_type_of_axis", &DeviceMesh::parallelTypeOfAxis, "axis"_a)
      .def(
          "__eq__", [](const DeviceMesh& a, const DeviceMesh& b) { return a == b; }, py::is_operator())
      .def(
          "__ne__", [](const DeviceMesh& a, const DeviceMesh& b) { return a != b; }, py::is_operator())
      .def("__hash__",
           [](const DeviceMesh& d) {
             return py::hash(py::make_tuple(py::tuple(py::cast(d.devices())), py::tuple(py::cast(d.shape()))));
           })
      .def("__str__", &DeviceMesh::toString);

  py::class_<Placement>(m, "Placement")
      .def(py::init([](const std::string& kind, int64_t dim) {
             if (kind == "shard") return Placement::shard(dim);
             if (kind == "replicate") return Placement::replicate();
             MF_USER_CHECK(kind == "partial", ErrorKind::Value,
                           "placement kind must be 'shard', 'replicate' or 'partial', got '{}'", kind);
             return Placement::partial();
           }),
           "kind"_a, "dim"_a = 0)
      .def_property_readonly("kind",
                             [](const Placement& p) {
                               switch (p.kind) {
                                 case Placement::Shard: return "shard";
                                 case Placement::Replicate: return "replicate";
                                 case Placement::Partial: return "partial";
                               }
                               return "?";
                             })
      .def_property_readonly("dim", [](const Placement& p) { return p.dim; })
      .def(
          "__eq__", [](const Placement& a, const Placement& b) { return a == b; }, py::is_operator())
      .def(
          "__ne__", [](const Placement& a, const Placement& b) { return !(a == b); }, py::is_operator())
      .def("__hash__", [](const Placement& p) { return py::hash(py::make_tuple(static_cast<int>(p.kind), p.dim)); })
      .def("__str__", &Placement::toString);
}

void bindFusionClass(py::module_& m) {
  py::class_<Fusion>(m, "Fusion", "A single-device tensor program (owns its TensorViews).")
      .def(py::init<>())
      .def(
          "define_tensor",
          [](Fusion& f, const std::vector<int64_t>& shape, DataType dtype, const std::string& name) {
            std::vector<Extent> extents(shape.begin(), shape.end());
            return f.defineTensor(extents, dtype, name);
          },
          "shape"_a, "dtype"_a = DataType::Float, "name"_a = "", py::return_value_policy::reference_internal)
      .def("add_output", &Fusion::addOutput, "tv"_a)
      .def_property_readonly("inputs", &Fusion::inputs, py::return_value_policy::reference_internal)
      .def_property_readonly("outputs", &Fusion::outputs, py::return_value_policy::reference_internal)
      .def("alias_output_to_input", &Fusion::aliasOutputToInput, "output"_a, "input"_a,
           "Output `output` updates input `input` in place (written into its buffer).")
      .def_property_readonly("output_aliases", &Fusion::outputAliases)
      .def("clone", [](const Fusion& f) { return f.clone(); })
      .def("verify", [](const Fusion& f) { verify(f); })
      .def("__str__", &printFusion)
      .def_static(
          "parse", [](const std::string& text) { return parseFusion(text); }, "text"_a);

}

using TensorViewClass = py::class_<TensorView, std::unique_ptr<TensorView, py::nodelete>>;
void bindTensorViewOperators(TensorViewClass& cls);

void bindTensorView(py::module_& m) {
  TensorViewClass cls(m, "TensorView", "A tensor of a FusionDefinition.");
  cls.def_property_readonly("name", [](const TensorView* tv) { return tv->fusion()->displayName(tv); })
      .def_property_readonly("dtype", &TensorView::dtype)
      .def_property_readonly("shape", &shapeOf, "Global sizes; -1 where symbolic (bound at run time).")
      .def_property_readonly("ndim", &TensorView::rank)
      .def("set_device_mesh", &TensorView::setDeviceMesh, "mesh"_a, py::return_value_policy::reference)
      .def("split", &TensorView::split, "axis"_a, "factor"_a, "inner_split"_a = false,
           py::return_value_policy::reference)
      .def("merge", &TensorView::merge, "axis"_a, py::return_value_policy::reference)
      .def("parallelize", &TensorView::parallelize, "axis"_a, "parallel_type"_a, py::return_value_policy::reference)
      .def(
          "axis",
          [](TensorView* tv, int64_t i) {
            int64_t n = static_cast<int64_t>(tv->loop().size());
            MF_USER_CHECK(i >= -n && i < n, ErrorKind::Value,
                          "{}: axis {} is out of range for a loop domain of {} axes", tv->fusion()->displayName(tv), i,
                          n);
            return AxisRef{tv, tv->loop()[i < 0 ? i + n : i]};
          },
          "i"_a, py::keep_alive<0, 1>())
      .def_property_readonly("num_axes", [](const TensorView* tv) { return tv->loop().size(); })
      // The C++ values; the Python package presents them as meshfuse.DeviceMesh and placements.
      .def_property_readonly("_mesh",
                             [](const TensorView* tv) -> std::optional<DeviceMesh> {
                               if (tv->mesh() == nullptr) return std::nullopt;
                               return *tv->mesh();
                             })
      .def_property_readonly("_placements",
                             [](const TensorView* tv) -> std::optional<std::vector<Placement>> {
                               if (tv->mesh() == nullptr) return std::nullopt;  // not placed yet
                               return placementsOf(tv);
                             })
      .def(
          "_set_placements",
          [](TensorView* tv, const DeviceMesh& mesh, const std::vector<Placement>& ps) {
            applyPlacements(tv, mesh, ps);
          },
          "mesh"_a, "placements"_a)
      .def("__repr__",
           [](const TensorView* tv) {
             return fmt::format("TensorView({}: {})", tv->fusion()->displayName(tv), printTensorType(tv));
           });
  bindTensorViewOperators(cls);
}

// Operators, so that `x * 0.5 + y` reads like torch.
void bindTensorViewOperators(TensorViewClass& cls) {
  cls.def(
          "__add__", [](py::object a, py::object b) { return binary(OpKind::Add, a, b); }, py::is_operator())
      .def(
          "__radd__", [](py::object a, py::object b) { return binary(OpKind::Add, b, a); }, py::is_operator())
      .def(
          "__sub__", [](py::object a, py::object b) { return binary(OpKind::Sub, a, b); }, py::is_operator())
      .def(
          "__rsub__", [](py::object a, py::object b) { return binary(OpKind::Sub, b, a); }, py::is_operator())
      .def(
          "__mul__", [](py::object a, py::object b) { return binary(OpKind::Mul, a, b); }, py::is_operator())
      .def(
          "__rmul__", [](py::object a, py::object b) { return binary(OpKind::Mul, b, a); }, py::is_operator())
      .def(
          "__truediv__", [](py::object a, py::object b) { return binary(OpKind::Div, a, b); }, py::is_operator())
      .def(
          "__rtruediv__", [](py::object a, py::object b) { return binary(OpKind::Div, b, a); }, py::is_operator())
      .def(
          "__pow__", [](py::object a, py::object b) { return binary(OpKind::Pow, a, b); }, py::is_operator())
      .def(
          "__rpow__", [](py::object a, py::object b) { return binary(OpKind::Pow, b, a); }, py::is_operator())
      .def("__neg__", [](TensorView* x) { return ops::neg(x); })
      .def("__abs__", [](TensorView* x) { return ops::abs(x); })
      // Comparisons build ops, as in torch and nvFuser: `x > 0` is a bool TensorView, and so is
      // `x == y` (not a Python bool). TensorViews still hash by identity, so they can key dicts
      // and sets (a lookup finds the same object first and never calls __eq__); bool(tv) is an
      // error, so that `if x == y:` or `tv in some_list` cannot silently mean something else.
      .def("__eq__", [](py::object a, py::object b) { return compare(OpKind::Eq, a, b); })
      .def("__ne__", [](py::object a, py::object b) { return compare(OpKind::Ne, a, b); })
      .def("__lt__", [](py::object a, py::object b) { return compare(OpKind::Lt, a, b); })
      .def("__le__", [](py::object a, py::object b) { return compare(OpKind::Le, a, b); })
      .def("__gt__", [](py::object a, py::object b) { return compare(OpKind::Gt, a, b); })
      .def("__ge__", [](py::object a, py::object b) { return compare(OpKind::Ge, a, b); })
      .def("__hash__", [](const TensorView* tv) { return std::hash<const void*>{}(tv); })
      .def("__bool__", [](const TensorView* tv) -> bool {
        userError(ErrorKind::Value,
                  "the truth value of TensorView {} is not known while the fusion is defined: use fd.ops.where(cond, "
                  "a, b) to choose between values, and `is` to compare TensorViews by identity",
                  tv->fusion()->displayName(tv));
      });
}

void bindAxes(py::module_& m) {
  py::class_<AxisRef>(m, "IterDomain", "One loop axis of a TensorView (tv.axis(i)).")
      .def(
          "parallelize", [](const AxisRef& a, ParallelType pt) { a.tv->parallelize(a.index(), pt); }, "parallel_type"_a)
      .def_property_readonly("extent",
                             [](const AxisRef& a) -> py::object {
                               const Extent& e = a.id->extent();
                               if (e.isStatic()) return py::int_(e.value());
                               return py::str(e.toString());
                             })
      .def_property_readonly("parallel_type", [](const AxisRef& a) { return a.id->parallelType(); })
      .def_property_readonly("is_reduction", [](const AxisRef& a) { return a.id->isReduction(); })
      .def("__repr__", [](const AxisRef& a) { return fmt::format("IterDomain({})", a.id->toString()); });
}

void bindFusion(py::module_& m) {
  bindFusionClass(m);
  bindTensorView(m);
  bindAxes(m);
  m.def("op_schemas", &opSchemas, "Every op of the op table: operands and attributes, in schema order.");
  m.def("apply", &apply, "fusion"_a, "op"_a, "operands"_a, "attrs"_a, py::keep_alive<0, 1>(),
        py::return_value_policy::reference);
  m.def(
      "reduce",
      [](const std::string& op, TensorView* x, py::handle dims_arg, bool keepdim) {
        std::vector<int64_t> dims = toInts(dims_arg, op, "attribute 'dims'");
        if (op == "sum") return ops::sum(x, dims, keepdim);
        if (op == "max") return ops::max(x, dims, keepdim);
        MF_USER_CHECK(op == "mean", ErrorKind::Value, "unknown reduction '{}'", op);
        return ops::mean(x, dims, keepdim);
      },
      "op"_a, "x"_a, "dims"_a, "keepdim"_a, py::keep_alive<0, 2>(), py::return_value_policy::reference,
      "sum/max/mean with torch's keepdim (the reduced dims come back as size-1 dims).");
  m.def(
      "differentiate",
      [](const Fusion& f, const std::vector<int64_t>& outputs, const std::vector<int64_t>& wrt,
         const py::sequence& layouts, bool save_all) {
        // The definition with the call's input layouts applied, so that backward shardings start
        // from them (a gradient is pinned to its input's mesh and placements).
        std::unique_ptr<Fusion> laid = f.clone();
        MF_USER_CHECK(static_cast<size_t>(py::len(layouts)) == laid->inputs().size(), ErrorKind::Value,
                      "differentiate: {} layouts for {} inputs", py::len(layouts), laid->inputs().size());
        for (size_t i = 0; i < laid->inputs().size(); ++i) {
          py::handle l = layouts[i];
          if (l.is_none()) continue;
          auto t = l.cast<py::tuple>();
          applyPlacements(laid->inputs()[i], t[0].cast<DeviceMesh>(), t[1].cast<std::vector<Placement>>());
        }
        Gradients g =
            differentiate(*laid, outputs, wrt, {save_all ? SavePolicy::All : SavePolicy::GemmAndAttention});
        py::list sources;
        for (const BackwardInput& b : g.backward_inputs) {
          const char* kind = b.kind == BackwardInput::ForwardInput    ? "input"
                             : b.kind == BackwardInput::ForwardOutput ? "output"
                                                                      : "seed";
          sources.append(py::make_tuple(kind, b.index, b.reason));
        }
        std::string saves = describeSaves(g);
        return py::make_tuple(py::cast(std::move(g.forward)), py::cast(std::move(g.backward)), sources, saves);
      },
      "fusion"_a, "outputs"_a, "wrt"_a, "layouts"_a, "save_all"_a = false,
      "(forward fusion with saves, backward fusion, backward input sources [(kind, index, why)], the policy's "
      "decisions as text): reverse-mode autodiff (docs/training.md).");
  m.def(
      "gradient_rules",
      [] {
        py::list rules;
        for (const GradientRuleInfo& r : gradientRules())
          rules.append(py::dict("op"_a = std::string(r.op), "rule"_a = std::string(r.rule),
                                "formula"_a = std::string(r.formula)));
        return rules;
      },
      "Every op's gradient rule, in op-table order: {op, rule ('none': no gradient), formula}.");
}

}  // namespace

void bindIr(py::module_& m) {
  bindEnums(m);
  bindMeshAndPlacements(m);
  bindFusion(m);
}

}  // namespace meshfuse::python
