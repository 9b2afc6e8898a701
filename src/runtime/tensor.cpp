// Host tensors.
#include "meshfuse/tensor.h"

#include <cmath>
#include <cstring>
#include <random>

#include "meshfuse/error.h"

namespace meshfuse {

Tensor::Tensor(DataType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
  for (int64_t s : shape_) MF_USER_CHECK(s >= 0, ErrorKind::Shape, "negative tensor size {}", s);
  storage_ = std::make_shared<std::vector<std::byte>>(static_cast<size_t>(numel() * dtypeSize(dtype_)));
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape_) n *= s;
  return n;
}

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
  const std::byte* p = storage_->data();
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
  std::byte* p = storage_->data();
  switch (dtype_) {
    case DataType::Float: { float f = static_cast<float>(v); std::memcpy(p + 4 * i, &f, 4); return; }
    case DataType::BFloat16: { uint16_t b = floatToBf16Bits(static_cast<float>(v)); std::memcpy(p + 2 * i, &b, 2); return; }
    case DataType::Half: { uint16_t b = floatToHalfBits(static_cast<float>(v)); std::memcpy(p + 2 * i, &b, 2); return; }
    case DataType::Int64: { int64_t x = static_cast<int64_t>(v); std::memcpy(p + 8 * i, &x, 8); return; }
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
