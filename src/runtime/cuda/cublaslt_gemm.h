// Running a GemmPlan with cuBLASLt: f32/bf16/f16 operands, f32 accumulation (TF32 only when
// allowed), bias/GELU/ReLU epilogues. Matmul descriptors, layouts and the heuristic's chosen
// algorithm are cached per (plan, operand alignments), so a repeated launch costs one
// cublasLtMatmul call and a few attribute sets.
#pragma once

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "codegen/cuda/gemm_plan.h"

namespace meshfuse::cuda {

std::string cublasLtVersionString();

class CublasLtGemm {
 public:
  explicit CublasLtGemm(bool allow_tf32);
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // D = epilogue(op(A) op(B) (+ bias)) on `stream`; every pointer is device memory. `workspace`
  // is scratch of `workspace_bytes` that no other stream uses concurrently.
  void run(const GemmPlan& plan, const void* a, const void* b, const void* bias, void* d, cudaStream_t stream,
           void* workspace, size_t workspace_bytes);

  // cuBLAS recommends 32 MiB of workspace on Hopper.
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

 private:
  struct Prepared;
  Prepared& prepare(const GemmPlan& plan, const void* a, const void* b, const void* bias, const void* d,
                    size_t workspace_bytes);

  bool allow_tf32_;
  void* handle_ = nullptr;  // cublasLtHandle_t (kept out of this header)
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<Prepared>> cache_;
};

}  // namespace meshfuse::cuda
