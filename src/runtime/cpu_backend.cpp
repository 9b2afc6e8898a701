// The CPU backend. Kernels are the reference executor's loops for now (the kernel issue
// replaces them with LLVM-JIT code); linear/matmul go through BLAS (cblas_dgemm in the
// reference path).
#include "meshfuse/reference.h"
#include "meshfuse/runtime/backend.h"

namespace meshfuse {
namespace {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  Tensor allocate(DataType dtype, const std::vector<int64_t>& shape) override { return Tensor(dtype, shape); }
  void launchKernel(const Expr* e, const std::vector<const Tensor*>& operands, Tensor& out) override {
    out = evaluateExpr(e, operands, out.shape());
  }
  void gemm(const Expr* e, const std::vector<const Tensor*>& operands, Tensor& out) override {
    out = evaluateExpr(e, operands, out.shape());
  }
};

}  // namespace

std::unique_ptr<Backend> makeCpuBackend() { return std::make_unique<CpuBackend>(); }

}  // namespace meshfuse
