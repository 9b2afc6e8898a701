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

class Tensor {
 public:
  Tensor() = default;
  Tensor(DataType dtype, std::vector<int64_t> shape);  // zero-filled
  static Tensor fromValues(DataType dtype, std::vector<int64_t> shape, const std::vector<double>& values);
  // Deterministic pseudo-random values: floats uniform in [-1, 1), i64 in [-8, 8), bool 50/50.
  static Tensor random(DataType dtype, std::vector<int64_t> shape, uint64_t seed);

  DataType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t numel() const;
  size_t nbytes() const { return storage_ ? storage_->size() : 0; }
  void* data() { return storage_ ? storage_->data() : nullptr; }
  const void* data() const { return storage_ ? storage_->data() : nullptr; }

  // Element access with conversion to/from double (flat row-major index).
  double get(int64_t flat) const;
  void set(int64_t flat, double v);
  std::vector<double> toValues() const;

  std::string shapeString() const;  // "[4, 64]"

 private:
  DataType dtype_ = DataType::Float;
  std::vector<int64_t> shape_;
  std::shared_ptr<std::vector<std::byte>> storage_;
};

}  // namespace meshfuse
