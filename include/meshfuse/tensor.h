// A dense, contiguous, row-major host tensor: what the C++ API, the CLI and the reference
// executor pass around. bf16/f16 elements are stored as their 16-bit patterns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshfuse/ir/dtype.h"

namespace meshfuse {

enum class Device { Cpu, Cuda };

// Shares its storage on copy (like torch.Tensor): `b = a` makes b alias a. Always contiguous;
// slice0() gives a view of a range along dim 0, which is what stream chunks and collective
// chunks need.
class Tensor {
 public:
  Tensor() = default;
  Tensor(DataType dtype, std::vector<int64_t> shape);  // host memory, zero-filled
  // Host memory, uninitialized (for outputs a kernel or collective writes completely).
  static Tensor empty(DataType dtype, std::vector<int64_t> shape);
  // Memory owned elsewhere (a DLPack capsule, a device allocation): `owner` keeps it alive.
  static Tensor wrap(void* data, DataType dtype, std::vector<int64_t> shape, std::shared_ptr<void> owner,
                     Device device = Device::Cpu);
  static Tensor fromValues(DataType dtype, std::vector<int64_t> shape, const std::vector<double>& values);
  // Deterministic pseudo-random values: floats uniform in [-1, 1), i64 in [-8, 8), bool 50/50.
  static Tensor random(DataType dtype, std::vector<int64_t> shape, uint64_t seed);

  DataType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel() * dtypeSize(dtype_)); }
  bool defined() const { return owner_ != nullptr; }
  void* data() { return data_; }
  const void* data() const { return data_; }

  // Rows [start, start + length) along dim 0, sharing this tensor's storage.
  Tensor slice0(int64_t start, int64_t length) const;
  // The same storage seen with another shape of the same element count.
  Tensor reshaped(std::vector<int64_t> shape) const;
  // A copy in fresh host memory.
  Tensor clone() const;

  // Element access with conversion to/from double (flat row-major index; host tensors only).
  double get(int64_t flat) const;
  void set(int64_t flat, double v);
  std::vector<double> toValues() const;

  std::string shapeString() const;  // "[4, 64]"

 private:
  DataType dtype_ = DataType::Float;
  Device device_ = Device::Cpu;
  std::vector<int64_t> shape_;
  std::shared_ptr<void> owner_;  // keeps the storage alive
  std::byte* data_ = nullptr;
};

}  // namespace meshfuse
