// meshfuse.Tensor <-> DLPack, both ways zero-copy. Any producer of DLPack (numpy, torch, ...)
// becomes a meshfuse Tensor that views its memory and keeps the producer's tensor alive; a
// meshfuse Tensor is a DLPack producer (`__dlpack__`), so numpy.from_dlpack / torch.from_dlpack
// view meshfuse's outputs without a copy. CPU memory only: the Python runtime runs on CPUs.
#include <algorithm>
#include <dlpack/dlpack.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "meshfuse/error.h"
#include "meshfuse/tensor.h"
#include "tensor_conversion.h"

namespace meshfuse::python {
namespace {

using namespace pybind11::literals;

// DLPack >= 0.8 names booleans kDLBool = 6; Debian's header (0.6) predates it.
constexpr uint8_t kDLBoolCode = 6;

DataType fromDl(DLDataType t) {
  if (t.lanes == 1) {
    if (t.code == kDLFloat && t.bits == 32) return DataType::Float;
    if (t.code == kDLFloat && t.bits == 16) return DataType::Half;
    if (t.code == kDLBfloat && t.bits == 16) return DataType::BFloat16;
    if (t.code == kDLInt && t.bits == 64) return DataType::Int64;
    if (t.code == kDLBoolCode && t.bits == 8) return DataType::Bool;
  }
  static const char* codes[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  userError(ErrorKind::Dtype,
            "unsupported element type {}{}{}: meshfuse takes float32, bfloat16, float16, int64 and bool tensors "
            "(cast float64 data to float32 first)",
            t.code < 7 ? codes[t.code] : "code", static_cast<int>(t.bits),
            t.lanes == 1 ? "" : fmt::format("x{}", t.lanes));
}

DLDataType toDl(DataType dt) {
  switch (dt) {
    case DataType::Float: return {kDLFloat, 32, 1};
    case DataType::BFloat16: return {kDLBfloat, 16, 1};
    case DataType::Half: return {kDLFloat, 16, 1};
    case DataType::Int64: return {kDLInt, 64, 1};
    case DataType::Bool: return {kDLBoolCode, 8, 1};
  }
  MF_CHECK(false, "unknown dtype");
}

Tensor fromCapsule(py::capsule capsule) {
  if (std::string(capsule.name() ? capsule.name() : "") == "used_dltensor")
    userError(ErrorKind::Value, "this DLPack capsule was already consumed (a capsule can be imported once)");
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (managed == nullptr) throw py::error_already_set();
  // From here on we own it: the capsule must not call the deleter again.
  PyCapsule_SetName(capsule.ptr(), "used_dltensor");
  PyCapsule_SetDestructor(capsule.ptr(), nullptr);
  std::shared_ptr<void> owner(managed, [](void* p) {
    auto* m = static_cast<DLManagedTensor*>(p);
    if (m->deleter != nullptr) m->deleter(m);  // producers make their deleters GIL-safe
  });
  const DLTensor& t = managed->dl_tensor;
  MF_USER_CHECK(t.device.device_type == kDLCPU || t.device.device_type == kDLCUDAHost, ErrorKind::Unsupported,
                "a tensor on DLPack device type {} was given: meshfuse's Python runtime takes CPU tensors",
                static_cast<int>(t.device.device_type));
  DataType dt = fromDl(t.dtype);
  std::vector<int64_t> shape(t.shape, t.shape + t.ndim);
  // Must be compact row-major: any stride is fine on a size-1 dim, and on any dim of an empty
  // tensor (numpy gives an empty block, an uneven shard's, strides of 0).
  const bool empty = std::find(shape.begin(), shape.end(), 0) != shape.end();
  if (t.strides != nullptr && !empty) {
    int64_t expected = 1;
    for (int d = t.ndim - 1; d >= 0; --d) {
      MF_USER_CHECK(shape[d] == 1 || t.strides[d] == expected, ErrorKind::Value,
                    "a non-contiguous tensor was given (shape [{}], strides [{}]): pass a contiguous one "
                    "(numpy.ascontiguousarray, torch.Tensor.contiguous)",
                    fmt::join(shape, ", "), fmt::join(t.strides, t.strides + t.ndim, ", "));
      expected *= shape[d];
    }
  }
  void* data = static_cast<std::byte*>(t.data) + t.byte_offset;
  return Tensor::wrap(data, dt, std::move(shape), std::move(owner));
}

// What a DLManagedTensor made from a meshfuse Tensor points into.
struct ExportContext {
  Tensor tensor;  // shares the storage, so it stays alive as long as the consumer holds it
  std::vector<int64_t> shape;
  DLManagedTensor managed{};
};

void deleteExport(DLManagedTensor* m) { delete static_cast<ExportContext*>(m->manager_ctx); }

py::capsule toCapsule(const Tensor& t) {
  MF_USER_CHECK(t.defined(), ErrorKind::Value, "cannot export an empty (undefined) tensor through DLPack");
  auto* ctx = new ExportContext{t, t.shape(), {}};
  DLTensor& d = ctx->managed.dl_tensor;
  d.data = const_cast<void*>(ctx->tensor.data());
  d.device = {kDLCPU, 0};
  d.ndim = static_cast<int>(ctx->shape.size());
  d.dtype = toDl(t.dtype());
  d.shape = ctx->shape.data();
  d.strides = nullptr;  // compact row-major
  d.byte_offset = 0;
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = &deleteExport;
  // An unconsumed capsule frees the tensor when it dies; a consumer renames it and takes over.
  return py::capsule(&ctx->managed, "dltensor", [](PyObject* cap) {
    if (PyCapsule_IsValid(cap, "dltensor")) {
      auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
      m->deleter(m);
    }
  });
}

}  // namespace

Tensor tensorFromPython(py::handle obj) {
  if (py::isinstance<Tensor>(obj)) return obj.cast<Tensor>();
  if (PyCapsule_CheckExact(obj.ptr())) return fromCapsule(py::reinterpret_borrow<py::capsule>(obj));
  if (py::hasattr(obj, "__dlpack__")) return fromCapsule(obj.attr("__dlpack__")());
  userError(ErrorKind::Value, "expected a tensor (numpy array, torch tensor or any DLPack producer), got {}",
            std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
}

void bindTensor(py::module_& m) {
  py::class_<Tensor>(m, "Tensor", "A contiguous host tensor; DLPack producer and consumer (zero-copy).")
      .def_static("from_dlpack", &tensorFromPython, "obj"_a,
                  "View any DLPack producer (or capsule) as a meshfuse Tensor, without a copy.")
      .def_property_readonly("shape", [](const Tensor& t) { return py::tuple(py::cast(t.shape())); })
      .def_property_readonly("dtype", &Tensor::dtype)
      .def_property_readonly("nbytes", &Tensor::nbytes)
      .def_property_readonly("defined", &Tensor::defined)
      .def_property_readonly("data_ptr", [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data()); })
      // The array-API DLPack protocol. We produce unversioned capsules, which every consumer
      // accepts whatever max_version it asks for.
      .def(
          "__dlpack__",
          [](const Tensor& t, py::object stream, py::object max_version, py::object dl_device, py::object copy) {
            MF_USER_CHECK(stream.is_none(), ErrorKind::Value, "a CPU tensor takes no DLPack stream");
            MF_USER_CHECK(copy.is_none() || !copy.cast<bool>(), ErrorKind::Value,
                          "meshfuse.Tensor.__dlpack__ does not copy (copy=True was asked)");
            (void)max_version;
            (void)dl_device;
            return toCapsule(t);
          },
          py::kw_only(), "stream"_a = py::none(), "max_version"_a = py::none(), "dl_device"_a = py::none(),
          "copy"_a = py::none())
      .def("__dlpack_device__", [](const Tensor&) { return py::make_tuple(static_cast<int>(kDLCPU), 0); })
      .def("__repr__", [](const Tensor& t) {
        return fmt::format("meshfuse.Tensor({}{})", dtypeName(t.dtype()), t.shapeString());
      });
}

}  // namespace meshfuse::python
