// The Backend interface: memory, kernels and GEMMs for the host-IR evaluator. `cpu` runs on the
// host (reference kernels, BLAS GEMMs); the CUDA backend arrives with the CUDA issue.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "meshfuse/tensor.h"

namespace meshfuse {

class Expr;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual Tensor allocate(DataType dtype, const std::vector<int64_t>& shape) = 0;
  // Runs op `e` on operand tensors aligned with e->inputs() (nullptr: scalar or absent).
  virtual void launchKernel(const Expr* e, const std::vector<const Tensor*>& operands, Tensor& out) = 0;
  virtual void gemm(const Expr* e, const std::vector<const Tensor*>& operands, Tensor& out) = 0;
};

// Host memory, the reference kernels (until generated kernels land) and BLAS GEMMs.
std::unique_ptr<Backend> makeCpuBackend();

}  // namespace meshfuse
