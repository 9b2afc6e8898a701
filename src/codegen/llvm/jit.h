// The CPU backend's JIT: LLVM ORC LLJIT for this host, with the optimization pipeline run by a
// PassBuilder that knows the host TargetMachine (without it the cost model sees no vector
// registers and nothing vectorizes).
//
// One Jit per backend (no process-wide state beyond LLVM's target registration). Compiled code
// lives as long as the Jit. Thread-safe: compilations are serialized.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "codegen/llvm/llvm_emitter.h"

namespace llvm {
class TargetMachine;
namespace orc {
class LLJIT;
}
class JITEventListener;
}  // namespace llvm

namespace meshfuse::cpu {

using KernelFn = void (*)(void** buffers);

class Jit {
 public:
  // perf_map: name the kernels for Linux perf (perf_map.h).
  explicit Jit(bool perf_map = false);
  ~Jit();

  // Optimizes the module for the host and compiles it; returns the addresses of its functions
  // (aligned with m.functions; nullptr for "").
  std::vector<KernelFn> compile(EmittedModule m);
  // The module after optimization, as text.
  std::string optimizedIr(EmittedModule m);
  // "x86_64-pc-linux-gnu, cpu znver3, +avx2,+avx512f,..." (for benchmark reports).
  std::string describeTarget() const;

 private:
  void optimize(llvm::Module& m);

  std::unique_ptr<llvm::TargetMachine> tm_;
  std::unique_ptr<llvm::JITEventListener> perf_map_;  // outlives the JIT's linking layer
  std::unique_ptr<llvm::orc::LLJIT> jit_;
  std::mutex mu_;
};

}  // namespace meshfuse::cpu
