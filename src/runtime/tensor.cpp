// Host tensors.
#include "meshfuse/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <random>

#include "meshfuse/error.h"
#include "meshfuse/ir/extent.h"
#include "runtime/memory.h"

namespace meshfuse {

namespace {
// x86-64 and AArch64 processes address at most 2^47 bytes (128 TiB): a larger host tensor cannot
// exist, so it is refused before the allocator is asked (and before sizes wrap around).
constexpr int64_t kMaxHostTensorBytes = int64_t{1} << 47;

void checkShape(const std::vector<int64_t>& shape, DataType dtype) {
  for (int64_t s : shape) MF_USER_CHECK(s >= 0, ErrorKind::Shape, "negative tensor size {}", s);
  std::optional<int64_t> n = checkedNumel(shape, dtypeSize(dtype));
  MF_USER_CHECK(n.has_value(), ErrorKind::Shape,
                "a {} tensor of shape [{}] has more elements or bytes than an int64 can count", dtypeName(dtype),
                fmt::join(shape, ", "));
}
}  // namespace

Tensor::Tensor(DataType dtype, std::vector<int64_t> shape) : Tensor(empty(dtype, std::move(shape))) {
  if (nbytes() > 0) std::memset(data_, 0, nbytes());
}

Tensor Tensor::empty(DataType dtype, std::vector<int64_t> shape) {
  checkShape(shape, dtype);
  MF_USER_CHECK(meshfuse::numel(shape) * dtypeSize(dtype) <= kMaxHostTensorBytes, ErrorKind::Runtime,
                "cannot allocate a {} tensor of shape [{}]: {} bytes, more than the 128 TiB a process can address",
                dtypeName(dtype), fmt::join(shape, ", "), meshfuse::numel(shape) * dtypeSize(dtype));
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  // 64-byte aligned so that generated kernels can use aligned vector loads.
  size_t bytes = (std::max<size_t>(t.nbytes(), 1) + 63) / 64 * 64;
  checkAllocation("", dtype, t.shape_, hostMemoryLimit());  // larger than the machine: never tried
  void* p = std::aligned_alloc(64, bytes);
  MF_USER_CHECK(p != nullptr, ErrorKind::Runtime,
                "cannot allocate a {} tensor of shape [{}]: {} bytes ({}): out of host memory", dtypeName(dtype),
                fmt::join(t.shape_, ", "), t.nbytes(), formatBytes(static_cast<int64_t>(t.nbytes())));
  t.owner_ = std::shared_ptr<void>(p, std::free);
  t.data_ = static_cast<std::byte*>(p);
  return t;
}

Tensor Tensor::wrap(void* data, DataType dtype, std::vector<int64_t> shape, std::shared_ptr<void> owner,
                    Device device) {
  checkShape(shape, dtype);
  Tensor t;
  t.dtype_ = dtype;
  t.device_ = device;
  t.shape_ = std::move(shape);
  t.owner_ = owner ? std::move(owner) : std::shared_ptr<void>(data, [](void*) {});
  t.data_ = static_cast<std::byte*>(data);
  return t;
}

Tensor Tensor::slice0(int64_t start, int64_t length) const {
  MF_CHECK(rank() > 0 && start >= 0 && length >= 0 && start + length <= shape_[0],
           "slice0 [{}, {}) of a tensor of shape {}", start, start + length, shapeString());
  Tensor t = *this;
  t.shape_[0] = length;
  t.data_ = data_ + static_cast<size_t>(start) * (numel() / std::max<int64_t>(shape_[0], 1)) * dtypeSize(dtype_);
  return t;
}

Tensor Tensor::reshaped(std::vector<int64_t> shape) const {
  Tensor t = *this;
  t.shape_ = std::move(shape);
  MF_CHECK(t.numel() == numel(), "reshaping {} elements into {}", numel(), t.shapeString());
  return t;
}

Tensor Tensor::clone() const {
  MF_CHECK(device_ == Device::Cpu, "clone of a device tensor");
  Tensor t = empty(dtype_, shape_);
  if (nbytes() > 0) std::memcpy(t.data_, data_, nbytes());
  return t;
}

int64_t Tensor::numel() const { return meshfuse::numel(shape_); }

Tensor Tensor::fromValues(DataType dtype, std::vector<int64_t> shape, const std::vector<double>& values) {
  Tensor t(dtype, std::move(shape));
  MF_USER_CHECK(static_cast<int64_t>(values.size()) == t.numel(), ErrorKind::Shape,
                "{} values given for a tensor of shape {} ({} elements)", values.size(), t.shapeString(), t.numel());
  for (size_t i = 0; i < values.size(); ++i) t.set(static_cast<int64_t>(i), values[i]);
  return t;
}

Tensor Tensor::random(DataType dtype, std::vector<int64_t> shape, uint64_t seed) {
  Tensor t(dtype, std::move(shape));
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> uni(-1.0, 1.0);
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v = uni(gen);
    if (dtype == DataType::Int64) v = std::floor(v * 8);
    if (dtype == DataType::Bool) v = v >= 0 ? 1 : 0;
    t.set(i, v);
  }
  return t;
}

double Tensor::get(int64_t i) const {
  const std::byte* p = data_;
  switch (dtype_) {
    case DataType::Float: { float f; std::memcpy(&f, p + 4 * i, 4); return f; }
    case DataType::BFloat16: { uint16_t b; std::memcpy(&b, p + 2 * i, 2); return bf16BitsToFloat(b); }
    case DataType::Half: { uint16_t b; std::memcpy(&b, p + 2 * i, 2); return halfBitsToFloat(b); }
    case DataType::Int64: { int64_t v; std::memcpy(&v, p + 8 * i, 8); return static_cast<double>(v); }
    case DataType::Bool: return static_cast<double>(std::to_integer<uint8_t>(p[i]) != 0);
  }
  return 0;
}

void Tensor::set(int64_t i, double v) {
  std::byte* p = data_;
  switch (dtype_) {
    case DataType::Float: { float f = static_cast<float>(v); std::memcpy(p + 4 * i, &f, 4); return; }
    case DataType::BFloat16: { uint16_t b = floatToBf16Bits(static_cast<float>(v)); std::memcpy(p + 2 * i, &b, 2); return; }
    case DataType::Half: { uint16_t b = floatToHalfBits(static_cast<float>(v)); std::memcpy(p + 2 * i, &b, 2); return; }
    case DataType::Int64: {
      // Truncating and saturating, NaN to 0: what the generated kernels do (LLVM's fptosi.sat,
      // the CUDA emitter's mf_f2ll), so the reference agrees with them on every value.
      int64_t x = v != v                  ? 0
                  : v >= 0x1p63           ? std::numeric_limits<int64_t>::max()
                  : v < -0x1p63           ? std::numeric_limits<int64_t>::min()
                                          : static_cast<int64_t>(v);
      std::memcpy(p + 8 * i, &x, 8);
      return;
    }
    case DataType::Bool: p[i] = std::byte{static_cast<uint8_t>(v != 0.0)}; return;
  }
}

std::vector<double> Tensor::toValues() const {
  std::vector<double> out(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) out[i] = get(i);
  return out;
}

std::string Tensor::shapeString() const { return fmt::format("[{}]", fmt::join(shape_, ", ")); }

}  // namespace meshfuse
