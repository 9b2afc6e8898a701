// Compiling CUDA C at run time with NVRTC, caching the result on disk, and loading it with the
// runtime's library API (cudaLibraryLoadData: no libcuda link, no context juggling).
//
// Generated kernels are specialized for shapes and dtypes, so a process compiles many small
// programs; each costs tens of milliseconds in NVRTC. The disk cache (key: source, options,
// target architecture and NVRTC version) makes a second run of the same program free, also
// across ranks and processes. Compiling needs no GPU: tests compile every emitted kernel to PTX.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace meshfuse::cuda {

struct CompileOptions {
  int arch = 90;           // sm_90 for H100/H200
  bool ptx = false;        // PTX for compute_<arch> instead of a CUBIN for sm_<arch>
  std::string cache_dir;   // "" disables the disk cache
  bool resource_usage = false;  // CUBIN only: ptxas reports each kernel's resources (CompiledCode)
};

// What ptxas reports for one kernel of a CUBIN.
struct KernelResources {
  std::string name;
  int64_t registers = 0, stack_frame_bytes = 0, spill_store_bytes = 0, spill_load_bytes = 0;
};

struct CompiledCode {
  std::string image;  // CUBIN (binary) or PTX (text)
  bool from_cache = false;
  double seconds = 0;  // spent in NVRTC (0 from the cache)
  std::string log;     // NVRTC's (and with resource_usage, ptxas's) messages
  std::vector<KernelResources> resources;  // with resource_usage: one per kernel
};

// The per-kernel lines of ptxas's verbose log ("Function properties for K", "N bytes stack frame,
// N bytes spill stores, N bytes spill loads", "Compiling entry function 'K'", "Used N registers").
std::vector<KernelResources> parsePtxasResources(const std::string& log);

// Compiles `source`. A compile error is a meshfuse bug (the source is generated): InternalError
// with NVRTC's log and the numbered source.
CompiledCode compileCuda(const std::string& source, const std::string& program_name, const CompileOptions& options);

std::string nvrtcVersionString();  // "13.0"
uint64_t hash64(std::string_view text, uint64_t seed = 0);

// A loaded CUBIN; kernels are looked up by their extern "C" names.
class CudaLibrary {
 public:
  explicit CudaLibrary(const std::string& image);
  ~CudaLibrary();
  CudaLibrary(const CudaLibrary&) = delete;
  CudaLibrary& operator=(const CudaLibrary&) = delete;
  cudaKernel_t kernel(const std::string& name);

 private:
  cudaLibrary_t lib_ = nullptr;
  std::mutex mu_;
  std::map<std::string, cudaKernel_t> kernels_;
};

// Compile-and-load, memoized per source: what the backend asks for each kernel it launches.
class KernelCache {
 public:
  explicit KernelCache(CompileOptions options) : options_(std::move(options)) {}
  // The kernel `name` of `source` (compiled and loaded on first use).
  cudaKernel_t get(const std::string& source, const std::string& name);
  int64_t compiled() const { return compiled_; }
  double compileSeconds() const { return seconds_; }

 private:
  CompileOptions options_;
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<CudaLibrary>> libraries_;  // by source
  int64_t compiled_ = 0;
  double seconds_ = 0;
};

// Launches `kernel` with `args` (pointers to each argument) on `stream`.
void launchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, void** args);

}  // namespace meshfuse::cuda
