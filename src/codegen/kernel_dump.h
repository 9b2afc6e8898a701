// The kernel dumps of `meshfuse dump --stage=kernels|llvm|cuda`: what the code generators make of
// each segment a rank launches.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codegen/kernel_ir.h"
#include "lower/pipeline.h"

namespace meshfuse {

// The kernel IR of every kernel and GEMM segment `rank` launches, for its local shapes with the
// symbolic sizes bound by `sizes`, or what an emitter makes of it: the CPU backend's optimized LLVM
// IR, the CUDA backend's source (with each kernel's launch geometry on an H100). The `kernels`,
// `llvm` and `cuda` stages of `meshfuse dump` (kernel_dump.cpp).
enum class KernelDump { KernelIr, Llvm, Cuda };
// The kernel IR programs behind dumpKernels: one per segment `rank` launches, in the order it
// first launches them; `segment_indices`, when given, receives their indices in the program.
std::vector<kir::Program> kernelPrograms(const CompiledProgram& program, int64_t rank, const SymbolBindings& sizes,
                                         std::vector<int64_t>* segment_indices = nullptr);
std::string dumpKernels(const CompiledProgram& program, int64_t rank, const SymbolBindings& sizes, KernelDump format);

}  // namespace meshfuse
