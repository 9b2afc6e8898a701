// Names for JIT-compiled kernels in `perf report`: a JITEventListener that appends each loaded
// function's address range and name to /tmp/perf-<pid>.map, the file Linux perf reads for
// code without an ELF file behind it (the "perf map" convention). Without it, every kernel shows
// as an anonymous `[JIT] tid N` address. Switched on by MESHFUSE_PERF_MAP=1 (runtime/environment.h).
#pragma once

#include <memory>

namespace llvm {
class JITEventListener;
}

namespace meshfuse::cpu {

// Appends to /tmp/perf-<this pid>.map (created on the first kernel); thread-safe.
std::unique_ptr<llvm::JITEventListener> makePerfMapListener();

}  // namespace meshfuse::cpu
