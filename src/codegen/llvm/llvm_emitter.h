// The CPU emitter: kernel IR loop nests -> LLVM IR, one function per Loops step.
//
// Each step becomes `void <prefix>_<step>(void** buffers)` (buffers aligned with the program's),
// a wrapper around an always-inlined body that takes every buffer as a `noalias` pointer: the
// runtime never passes overlapping buffers, and saying so is what lets loops vectorize without
// run-time alias checks. Floating-point arithmetic may be reassociated and contracted (so that
// reductions vectorize and multiply-adds fuse); the math helpers (llvm_math.h) only contract.
#pragma once

#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include <memory>
#include <string>
#include <vector>

#include "codegen/kernel_ir.h"

namespace meshfuse::cpu {

struct EmittedModule {
  std::unique_ptr<llvm::LLVMContext> context;
  std::unique_ptr<llvm::Module> module;
  std::vector<std::string> functions;  // per step: its entry symbol ("" for a GEMM call)
};

EmittedModule emitModule(const kir::Program& program, const std::string& prefix);

}  // namespace meshfuse::cpu
