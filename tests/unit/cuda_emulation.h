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

#include <cstring>
#include <map>

#include "meshfuse/error.h"
#include "meshfuse/ir/dtype.h"
#include "meshfuse/ir/expr.h"
#include "meshfuse/ir/fusion.h"
#include "codegen/kernel_ir.h"
#include "lower/segment.h"
#include "meshfuse/tensor.h"
#include "codegen/cuda/cuda_attention.h"
#include "codegen/cuda/cuda_emitter.h"
#include "codegen/cuda/gemm_plan.h"

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
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static  // blocks run one at a time
#define __restrict__ __restrict
inline void __syncthreads() { mf_emu_barrier->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { __syncthreads(); }  // every thread of the block calls it
template <typename T> T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  static T slots[1024];
  slots[threadIdx.x] = v;
  __syncthreads();
  T r = slots[threadIdx.x ^ lane_mask];
  __syncthreads();
  return r;
}
// mma.sync.m16n8k16.row.col with f32 accumulators, as a warp computes it: each lane's A (four
// registers) and B (two) fragments are gathered, and each lane computes its four results from the
// PTX ISA's fragment layouts (lane = 4 g + t; A: a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g,
// 2t+8..), a3 = (g+8, 2t+8..); B: b0 = (k 2t..2t+1, n g), b1 = (k 2t+8.., n g); C: c0, c1 = (g,
// 2t..2t+1), c2, c3 = (g+8, 2t..); the lower-indexed element in the low 16 bits). Every thread
// of the block calls it the same number of times; two sets of slots alternate, so one barrier
// per call suffices (a slot is written again only after every thread passed the next barrier).
inline float mf_emu_16_to_f32(unsigned bits, bool bf16) {
  if (bf16) { unsigned u = bits << 16; float f; std::memcpy(&f, &u, 4); return f; }
  return mf_emu_f16_to_f32((unsigned short)bits);
}
inline void mf_emu_mma_16816(float* c, const unsigned* a, const unsigned* b, bool bf16) {
  static unsigned frag[2][1024][6];
  thread_local int parity = 0;
  const int t = threadIdx.x, lane = t % 32, base = t - lane;
  for (int i = 0; i < 4; ++i) frag[parity][t][i] = a[i];
  frag[parity][t][4] = b[0];
  frag[parity][t][5] = b[1];
  __syncthreads();
  auto half = [&](unsigned w, int odd) { return mf_emu_16_to_f32(odd ? w >> 16 : w & 0xffffu, bf16); };
  auto A = [&](int r, int k) { return half(frag[parity][base + (r % 8) * 4 + (k % 8) / 2][(r >= 8) + 2 * (k >= 8)], k % 2); };
  auto B = [&](int k, int n) { return half(frag[parity][base + n * 4 + (k % 8) / 2][4 + (k >= 8)], k % 2); };
  const int g = lane / 4, tig = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const int r = g + (i >= 2 ? 8 : 0), n = 2 * tig + i % 2;
    float s = c[i];
    for (int k = 0; k < 16; ++k) s += A(r, k) * B(k, n);
    c[i] = s;
  }
  parity ^= 1;
}
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, 8); return d; }
)EMU";

// Appended per kernel: runs the grid (`bufs_type` is the kernel's parameter struct; an attention
// kernel's second parameter, MfAttentionRows, comes from `rows`).
inline std::string emulationLauncher(const std::string& kernel, const std::string& bufs_type, bool attention_rows) {
  return "extern \"C\" void emu_" + kernel + "(void** ptrs, long long blocks, int threads, const void* rows) {\n"
         "  " + bufs_type + " b;\n  std::memcpy(b.p, ptrs, sizeof(b.p));\n" +
         (attention_rows ? "  MfAttentionRows r;\n  std::memcpy(&r, rows, sizeof(r));\n" : "") +
         "  blockDim.x = threads; gridDim.x = (unsigned)blocks;\n"
         "  std::barrier<> barrier(threads);\n  mf_emu_barrier = &barrier;\n"
         "  std::vector<std::thread> team;\n"
         "  for (int t = 0; t < threads; ++t) team.emplace_back([&, t] {\n"
         "    threadIdx.x = t;\n"
         "    for (long long g = 0; g < blocks; ++g) { blockIdx.x = (unsigned)g; " + kernel +
         (attention_rows ? "(b, r)" : "(b)") + "; __syncthreads(); }\n"
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
  // `rows`: an attention kernel's positions (cuda::AttentionRowsArg), else nullptr.
  void launch(const std::string& kernel, std::vector<void*>& ptrs, int64_t blocks, int threads,
              const void* rows = nullptr) {
    using Fn = void (*)(void**, long long, int, const void*);
    auto fn = reinterpret_cast<Fn>(dlsym(handle_, ("emu_" + kernel).c_str()));
    if (!fn) throw std::runtime_error("no emulated kernel " + kernel);
    fn(ptrs.data(), blocks, threads, rows);
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

// ---- whole fusions --------------------------------------------------------------------------

// The launch geometry a test emulates: kernels emitted for a GPU of `sm_count` SMs (grids are
// sized from it), blocks run with at most `max_threads` threads (the emitter's blocks have 256).
struct Geometry {
  const char* name;
  int sm_count;
  int max_threads;
};
// An H100's grids and blocks, and a small GPU whose grid-stride loops wrap many times with
// blocks of two warps (several warps still meet in every block reduction).
inline constexpr Geometry kH100{"h100", 132, 256};
inline constexpr Geometry kSmallGpu{"small", 2, 64};

// A fusion's segments as the CUDA backend runs them, on the host: linear/matmul as one planned
// cuBLASLt call (replayed by emulateGemm), every other Kernel or Gemm segment lowered to kernel
// IR whose loop nests are the emitted kernels and whose GEMM calls are plans. A Communication
// segment (a `set` between meshes in a definition) is its single-device meaning, a copy. Shapes
// are the fusion's logical shapes under `sizes`: this is the single-device program.
class EmulatedFusion {
 public:
  struct Launch {
    bool direct = false;  // a planned cuBLASLt call
    bool copy = false;    // a communication segment: out = in
    cuda::GemmPlan plan;
    kir::Program program;
    cuda::EmittedProgram emitted;
  };

  EmulatedFusion(const Fusion& def, SymbolBindings sizes, const std::string& prefix, int sm_count)
      : def_(def), sizes_(std::move(sizes)), segments_(segmentFusion(def)) {
    for (size_t i = 0; i < segments_.size(); ++i) {
      const Segment& seg = segments_[i];
      Launch l;
      if (seg.kind == Segment::Kind::Communication) {
        l.copy = true;
        launches_.push_back(std::move(l));
        continue;
      }
      const Expr* first = seg.exprs.front();
      if (seg.kind == Segment::Kind::Gemm && (first->kind() == OpKind::Linear || first->kind() == OpKind::Matmul)) {
        std::vector<std::vector<int64_t>> shapes;
        for (const TensorView* tv : seg.inputs) shapes.push_back(shape(tv));
        l.plan = cuda::planGemm(seg, shapes);
        l.direct = l.plan.k > 0;
      }
      if (!l.direct) {
        const std::string name = fmt::format("{}_{}", prefix, i);
        l.program = kir::lowerSegment(def_, seg, [this](const TensorView* tv) { return shape(tv); }, name);
        l.emitted = cuda::emitCuda(l.program, name, sm_count);
      }
      launches_.push_back(std::move(l));
    }
  }

  const std::vector<Launch>& launches() const { return launches_; }

  // Every emitted kernel's source (with `launchers`: and the emulation's entry points).
  std::string source(bool launchers) const {
    std::string src;
    for (const Launch& l : launches_) {
      if (l.direct || l.copy) continue;
      src += l.emitted.source;
      if (!launchers) continue;
      for (const auto& step : l.emitted.steps)
        for (const cuda::KernelLaunch& k : step)
          src += emulationLauncher(k.name, "MfBufs_" + l.program.name, k.attention_rows);
    }
    return src;
  }

  // Runs the segments in order on host tensors (`lib` compiled from source(true)).
  std::vector<Tensor> run(EmulatedLibrary& lib, const std::vector<Tensor>& inputs, int max_threads) const {
    std::map<const TensorView*, Tensor> values;
    for (size_t i = 0; i < inputs.size(); ++i) values[def_.inputs()[i]] = inputs[i];
    for (size_t s = 0; s < segments_.size(); ++s) {
      const Segment& seg = segments_[s];
      const Launch& l = launches_[s];
      std::vector<Tensor> outs;
      for (const TensorView* tv : seg.outputs) outs.push_back(Tensor::empty(tv->dtype(), shape(tv)));
      std::vector<void*> ptrs;
      for (const TensorView* tv : seg.inputs) ptrs.push_back(values.at(tv).data());
      for (Tensor& t : outs) ptrs.push_back(t.data());
      if (l.copy) {
        std::memcpy(outs.at(0).data(), values.at(seg.inputs.at(0)).data(), outs[0].nbytes());
      } else if (l.direct) {
        emulateGemm(l.plan, ptrs[l.plan.a_input], ptrs[l.plan.b_input],
                    l.plan.bias_input >= 0 ? ptrs[l.plan.bias_input] : nullptr, ptrs[seg.inputs.size()]);
      } else {
        runProgram(lib, l.program, l.emitted, ptrs, max_threads);
      }
      for (size_t i = 0; i < seg.outputs.size(); ++i) values[seg.outputs[i]] = outs[i];
    }
    std::vector<Tensor> result;
    for (const TensorView* o : def_.outputs()) result.push_back(values.at(o));
    return result;
  }

 public:
  // Runs one lowered program on `ptrs` (its inputs' and outputs' buffers): temporaries (each with
  // the copies the emitter asked for), then the emitter's scratch, as the backend lays them out;
  // the steps in order, each kernel a launch, each GEMM call its plans. `rows`: the attention
  // kernels' positions (nullptr: every row at its own position, starting afresh).
  static void runProgram(EmulatedLibrary& lib, const kir::Program& program, const cuda::EmittedProgram& emitted,
                         std::vector<void*> ptrs, int max_threads, const cuda::AttentionRowsArg* rows = nullptr) {
    std::vector<Tensor> temps;
    for (size_t b = ptrs.size(); b < program.buffers.size(); ++b) {
      const kir::Buffer& buf = program.buffers[b];
      temps.push_back(Tensor(buf.dtype, {buf.numel() * emitted.copies[b]}));
      ptrs.push_back(temps.back().data());
    }
    for (int64_t bytes : emitted.extra_bytes) {
      temps.push_back(Tensor(DataType::Bool, {bytes}));
      ptrs.push_back(temps.back().data());
    }
    if (ptrs.empty()) ptrs.push_back(nullptr);
    for (size_t i = 0; i < program.steps.size(); ++i) {
      for (const cuda::KernelLaunch& k : emitted.steps[i]) {
        const kir::Attention& a = program.steps[i].attention;
        const cuda::AttentionRowsArg whole = cuda::AttentionRowsArg::whole(a.s, a.skv);
        lib.launch(k.name, ptrs, k.blocks, k.exact_threads ? k.threads : std::min(k.threads, max_threads),
                   !k.attention_rows ? nullptr : rows != nullptr ? rows : &whole);
      }
      if (program.steps[i].kind != kir::Step::GemmCall) continue;
      for (const cuda::KirGemmCall& g : cuda::planKirGemm(program.steps[i].gemm)) {
        auto at = [&](int64_t b, int64_t off) { return static_cast<float*>(ptrs[b]) + off; };
        emulateGemm(g.plan, at(g.plan.a_input, g.a_offset), at(g.plan.b_input, g.b_offset), nullptr,
                    at(program.steps[i].gemm.c.buffer, g.d_offset));
      }
    }
  }

 private:
  std::vector<int64_t> shape(const TensorView* tv) const { return tv->evaluateShape(sizes_); }

  const Fusion& def_;
  SymbolBindings sizes_;
  std::vector<Segment> segments_;
  std::vector<Launch> launches_;
};

}  // namespace meshfuse::cuda_testing
