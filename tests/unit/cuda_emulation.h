// Running the CUDA backend's generated code on the host, so that the emitter and the GEMM plans
// are checked for correctness on machines without a GPU.
//
// The emitted CUDA C is compiled by the host C++ compiler after a shim that defines the CUDA
// built-ins it uses (threadIdx, __syncthreads, __shfl_xor_sync, ...). A launch runs the grid's
// blocks one after another, each with one std::thread per CUDA thread meeting at a std::barrier,
// so block-level cooperation (shared memory, reductions, barriers) behaves as on the GPU. GEMM
// plans are replayed by a plain column-major GEMM with cuBLASLt's semantics (alpha, beta, bias,
// GELU/ReLU epilogues, strided batches).
#pragma once

#include <dlfcn.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "meshfuse/error.h"
#include "meshfuse/ir/dtype.h"
#include "runtime/cuda/gemm_plan.h"

namespace meshfuse::cuda_testing {

inline const char* kEmulationShim = R"EMU(
#define MF_HOST_EMULATION 1
#include <barrier>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>
struct dim3 { unsigned x = 1, y = 1, z = 1; };
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
struct float4 { float x, y, z, w; };
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
std::barrier<>* mf_emu_barrier = nullptr;
extern "C" { float (*mf_emu_f16_to_f32)(unsigned short) = nullptr; unsigned short (*mf_emu_f32_to_f16)(float) = nullptr; }
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static  // blocks run one at a time
#define __restrict__ __restrict
inline void __syncthreads() { mf_emu_barrier->arrive_and_wait(); }
template <typename T> T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  static T slots[1024];
  slots[threadIdx.x] = v;
  __syncthreads();
  T r = slots[threadIdx.x ^ lane_mask];
  __syncthreads();
  return r;
}
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, 8); return d; }
)EMU";

// Appended per kernel: runs the grid (`bufs_type` is the kernel's parameter struct).
inline std::string emulationLauncher(const std::string& kernel, const std::string& bufs_type) {
  return "extern \"C\" void emu_" + kernel + "(void** ptrs, long long blocks, int threads) {\n"
         "  " + bufs_type + " b;\n  std::memcpy(b.p, ptrs, sizeof(b.p));\n"
         "  blockDim.x = threads; gridDim.x = (unsigned)blocks;\n"
         "  std::barrier<> barrier(threads);\n  mf_emu_barrier = &barrier;\n"
         "  std::vector<std::thread> team;\n"
         "  for (int t = 0; t < threads; ++t) team.emplace_back([&, t] {\n"
         "    threadIdx.x = t;\n"
         "    for (long long g = 0; g < blocks; ++g) { blockIdx.x = (unsigned)g; " + kernel + "(b); __syncthreads(); }\n"
         "  });\n  for (auto& th : team) th.join();\n}\n";
}

class EmulatedLibrary {
 public:
  // Compiles `source` (emitted CUDA C plus launchers) with the host compiler and loads it.
  explicit EmulatedLibrary(const std::string& source) {
    // A fresh path each time: a library with thread_local state is never unloaded, so dlopen of
    // a reused path would return the old one.
    static int counter = 0;
    dir_ = std::filesystem::temp_directory_path() /
           ("meshfuse-emu-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ / "k.cpp") << kEmulationShim << source;
    const std::string cmd = "c++ -std=c++20 -O1 -fPIC -shared -w -o " + (dir_ / "k.so").string() + " " +
                            (dir_ / "k.cpp").string() + " -pthread 2> " + (dir_ / "log").string();
    if (std::system(cmd.c_str()) != 0) {
      std::ifstream log(dir_ / "log");
      std::string text((std::istreambuf_iterator<char>(log)), {});
      throw std::runtime_error("the host compiler rejected the emulated kernels:\n" + text.substr(0, 4000));
    }
    handle_ = dlopen((dir_ / "k.so").c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle_) throw std::runtime_error(std::string("dlopen: ") + dlerror());
    using ToF = float (*)(unsigned short);
    using FromF = unsigned short (*)(float);
    *static_cast<ToF*>(dlsym(handle_, "mf_emu_f16_to_f32")) = [](unsigned short h) { return halfBitsToFloat(h); };
    *static_cast<FromF*>(dlsym(handle_, "mf_emu_f32_to_f16")) = [](float f) { return floatToHalfBits(f); };
  }
  ~EmulatedLibrary() {
    if (handle_) dlclose(handle_);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  void launch(const std::string& kernel, std::vector<void*>& ptrs, int64_t blocks, int threads) {
    using Fn = void (*)(void**, long long, int);
    auto fn = reinterpret_cast<Fn>(dlsym(handle_, ("emu_" + kernel).c_str()));
    if (!fn) throw std::runtime_error("no emulated kernel " + kernel);
    fn(ptrs.data(), blocks, threads);
  }

 private:
  std::filesystem::path dir_;
  void* handle_ = nullptr;
};

inline double loadAs(const void* base, int64_t i, DataType dt) {
  switch (dt) {
    case DataType::Float: return static_cast<const float*>(base)[i];
    case DataType::BFloat16: return bf16BitsToFloat(static_cast<const uint16_t*>(base)[i]);
    case DataType::Half: return halfBitsToFloat(static_cast<const uint16_t*>(base)[i]);
    default: throw std::runtime_error("GEMM on a non-float dtype");
  }
}
inline void storeAs(void* base, int64_t i, DataType dt, double v) {
  const float f = static_cast<float>(v);
  switch (dt) {
    case DataType::Float: static_cast<float*>(base)[i] = f; return;
    case DataType::BFloat16: static_cast<uint16_t*>(base)[i] = floatToBf16Bits(f); return;
    case DataType::Half: static_cast<uint16_t*>(base)[i] = floatToHalfBits(f); return;
    default: throw std::runtime_error("GEMM on a non-float dtype");
  }
}

// What cuBLASLt computes for `p` (column-major, see gemm_plan.h).
inline void emulateGemm(const cuda::GemmPlan& p, const void* a, const void* b, const void* bias, void* d) {
  for (int64_t t = 0; t < p.batch; ++t)
    for (int64_t j = 0; j < p.n; ++j)
      for (int64_t i = 0; i < p.m; ++i) {
        double acc = 0;
        for (int64_t l = 0; l < p.k; ++l) {
          const int64_t ai = t * p.stride_a + (p.trans_a ? l + i * p.lda : i + l * p.lda);
          const int64_t bi = t * p.stride_b + (p.trans_b ? j + l * p.ldb : l + j * p.ldb);
          acc += loadAs(a, ai, p.dtype) * loadAs(b, bi, p.dtype);
        }
        const int64_t di = t * p.stride_d + i + j * p.ldd;
        double v = p.alpha * acc + (p.beta != 0 ? p.beta * loadAs(d, di, p.dtype) : 0);
        using E = cuda::GemmEpilogue;
        if (p.epilogue == E::Bias || p.epilogue == E::GeluBias || p.epilogue == E::ReluBias) v += loadAs(bias, i, p.dtype);
        if (p.epilogue == E::Gelu || p.epilogue == E::GeluBias)
          v = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
        if (p.epilogue == E::Relu || p.epilogue == E::ReluBias) v = v > 0 ? v : 0;
        storeAs(d, di, p.dtype, v);
      }
}

}  // namespace meshfuse::cuda_testing
