// The prelude and the runtime's data-movement kernels (see runtime_kernels.h).
#include "codegen/cuda/runtime_kernels.h"

#include <algorithm>

#include "meshfuse/error.h"

namespace meshfuse::cuda {

const std::string& cudaPrelude() {
  static const std::string s = R"CUDA(// meshfuse prelude
#ifndef MF_PRELUDE
#define MF_PRELUDE
typedef unsigned short mf_bf16;  // 16-bit patterns, as the host stores them
typedef unsigned short mf_f16;
typedef long long mf_i64;
typedef unsigned char mf_bool;

__device__ __forceinline__ float mf_bf16_to_f32(unsigned short b) { return __uint_as_float(((unsigned)b) << 16); }
__device__ __forceinline__ unsigned short mf_f32_to_bf16(float f) {
#if __CUDA_ARCH__ >= 800
  unsigned short r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
#else
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return (unsigned short)(u >> 16);
#endif
}
// MF_HOST_EMULATION: the unit tests compile generated kernels for the host, which supplies the
// conversions (the GPU has them in hardware).
__device__ __forceinline__ float mf_f16_to_f32(unsigned short h) {
#ifdef MF_HOST_EMULATION
  return mf_emu_f16_to_f32(h);
#else
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#endif
}
__device__ __forceinline__ unsigned short mf_f32_to_f16(float f) {
#ifdef MF_HOST_EMULATION
  return mf_emu_f32_to_f16(f);
#else
  unsigned short r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
#endif
}
__device__ __forceinline__ long long mf_global_thread() { return blockIdx.x * (long long)blockDim.x + threadIdx.x; }
__device__ __forceinline__ long long mf_grid_threads() { return (long long)gridDim.x * blockDim.x; }
#endif  // MF_PRELUDE
)CUDA";
  return s;
}

const std::string& runtimeKernelsSource() {
  static const std::string s = cudaPrelude() + R"CUDA(
// ---- dst += src. `vec`: both pointers 16-byte aligned, so whole uint4/float4 are moved ----
extern "C" __global__ void mf_accumulate_f32(float* __restrict__ d, const float* __restrict__ s, long long n,
                                             int vec) {
  long long start = 0;
  if (vec) {
    float4* d4 = reinterpret_cast<float4*>(d);
    const float4* s4 = reinterpret_cast<const float4*>(s);
    for (long long i = mf_global_thread(); i < n / 4; i += mf_grid_threads()) {
      float4 a = d4[i], b = s4[i];
      a.x += b.x; a.y += b.y; a.z += b.z; a.w += b.w;
      d4[i] = a;
    }
    start = n / 4 * 4;
  }
  for (long long i = start + mf_global_thread(); i < n; i += mf_grid_threads()) d[i] += s[i];
}

#define MF_ACCUMULATE16(NAME, TO_F32, FROM_F32)                                                        \
  __device__ __forceinline__ unsigned NAME##_pair(unsigned a, unsigned b) {                            \
    unsigned lo = FROM_F32(TO_F32(a & 0xffffu) + TO_F32(b & 0xffffu));                                 \
    unsigned hi = FROM_F32(TO_F32(a >> 16) + TO_F32(b >> 16));                                         \
    return lo | (hi << 16);                                                                             \
  }                                                                                                     \
  extern "C" __global__ void NAME(unsigned short* __restrict__ d, const unsigned short* __restrict__ s, \
                                  long long n, int vec) {                                               \
    long long start = 0;                                                                                \
    if (vec) {                                                                                          \
      uint4* d4 = reinterpret_cast<uint4*>(d);                                                          \
      const uint4* s4 = reinterpret_cast<const uint4*>(s);                                              \
      for (long long i = mf_global_thread(); i < n / 8; i += mf_grid_threads()) {                       \
        uint4 a = d4[i], b = s4[i];                                                                     \
        a.x = NAME##_pair(a.x, b.x); a.y = NAME##_pair(a.y, b.y);                                       \
        a.z = NAME##_pair(a.z, b.z); a.w = NAME##_pair(a.w, b.w);                                       \
        d4[i] = a;                                                                                      \
      }                                                                                                 \
      start = n / 8 * 8;                                                                                \
    }                                                                                                   \
    for (long long i = start + mf_global_thread(); i < n; i += mf_grid_threads())                       \
      d[i] = FROM_F32(TO_F32(d[i]) + TO_F32(s[i]));                                                     \
  }
MF_ACCUMULATE16(mf_accumulate_bf16, mf_bf16_to_f32, mf_f32_to_bf16)
MF_ACCUMULATE16(mf_accumulate_f16, mf_f16_to_f32, mf_f32_to_f16)

extern "C" __global__ void mf_accumulate_i64(long long* __restrict__ d, const long long* __restrict__ s, long long n,
                                             int) {
  for (long long i = mf_global_thread(); i < n; i += mf_grid_threads()) d[i] += s[i];
}
// bool "sum" is logical or, as in the MPI communicator's reductions.
extern "C" __global__ void mf_accumulate_bool(unsigned char* __restrict__ d, const unsigned char* __restrict__ s,
                                              long long n, int) {
  for (long long i = mf_global_thread(); i < n; i += mf_grid_threads()) d[i] = (d[i] | s[i]) != 0;
}

// ---- rectangular block copy, in units of U (see BlockCopyPlan) ----
struct MfDims {
  long long size[8], src[8], dst[8];
};
template <typename U>
__device__ __forceinline__ void mf_copy_block(char* dst, const char* src, long long total, int rank, const MfDims& dims) {
  U* d = reinterpret_cast<U*>(dst);
  const U* s = reinterpret_cast<const U*>(src);
  for (long long i = mf_global_thread(); i < total; i += mf_grid_threads()) {
    long long rest = i, so = 0, dof = 0;
    for (int k = rank - 1; k >= 0; --k) {
      long long idx = rest % dims.size[k];
      rest /= dims.size[k];
      so += idx * dims.src[k];
      dof += idx * dims.dst[k];
    }
    d[dof] = s[so];
  }
}
#define MF_COPY_BLOCK(BYTES, U)                                                                   \
  extern "C" __global__ void mf_copy_block_##BYTES(char* dst, const char* src, long long total,  \
                                                   int rank, MfDims dims) {                       \
    mf_copy_block<U>(dst, src, total, rank, dims);                                                \
  }
MF_COPY_BLOCK(1, unsigned char)
MF_COPY_BLOCK(2, unsigned short)
MF_COPY_BLOCK(4, unsigned int)
MF_COPY_BLOCK(8, unsigned long long)
MF_COPY_BLOCK(16, uint4)
)CUDA";
  return s;
}

std::string accumulateKernelName(DataType dt) {
  switch (dt) {
    case DataType::Float: return "mf_accumulate_f32";
    case DataType::BFloat16: return "mf_accumulate_bf16";
    case DataType::Half: return "mf_accumulate_f16";
    case DataType::Int64: return "mf_accumulate_i64";
    case DataType::Bool: return "mf_accumulate_bool";
  }
  MF_CHECK(false, "unknown dtype");
}

std::string copyBlockKernelName(int64_t unit) { return fmt::format("mf_copy_block_{}", unit); }

namespace {

std::vector<int64_t> rowMajorStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * shape[i + 1];
  return s;
}

}  // namespace

BlockCopyPlan planBlockCopy(int64_t elem, const std::vector<int64_t>& src_shape, const std::vector<int64_t>& so,
                            const std::vector<int64_t>& dst_shape, const std::vector<int64_t>& dof,
                            const std::vector<int64_t>& sizes, uintptr_t src_addr, uintptr_t dst_addr) {
  const size_t rank = sizes.size();
  MF_CHECK(src_shape.size() == rank && dst_shape.size() == rank && so.size() == rank && dof.size() == rank,
           "block copy of rank {} between tensors of ranks {} and {}", rank, src_shape.size(), dst_shape.size());
  std::vector<int64_t> ss = rowMajorStrides(src_shape), ds = rowMajorStrides(dst_shape);
  BlockCopyPlan p;
  int64_t total = 1;
  for (size_t d = 0; d < rank; ++d) {
    MF_CHECK(so[d] >= 0 && so[d] + sizes[d] <= src_shape[d] && dof[d] >= 0 && dof[d] + sizes[d] <= dst_shape[d],
             "block copy dim {}: [{}, +{}) of {} into [{}, +{}) of {}", d, so[d], sizes[d], src_shape[d], dof[d],
             sizes[d], dst_shape[d]);
    p.src_offset += so[d] * ss[d] * elem;
    p.dst_offset += dof[d] * ds[d] * elem;
    total *= sizes[d];
  }
  if (total == 0) {
    p.contiguous = true;
    return p;
  }
  // Drop size-1 dims, then merge a dim into the next when both tensors step over it evenly.
  std::vector<int64_t> n, s, t;
  for (size_t d = 0; d < rank; ++d) {
    if (sizes[d] == 1) continue;
    if (!n.empty() && s.back() == sizes[d] * ss[d] && t.back() == sizes[d] * ds[d]) {
      n.back() *= sizes[d];
      s.back() = ss[d];
      t.back() = ds[d];
      continue;
    }
    n.push_back(sizes[d]);
    s.push_back(ss[d]);
    t.push_back(ds[d]);
  }
  if (n.empty() || (n.size() == 1 && s[0] == 1 && t[0] == 1)) {
    p.contiguous = true;
    p.bytes = total * elem;
    return p;
  }
  // A strided innermost dim: each element is a contiguous run of its own (a virtual last dim).
  if (s.back() != 1 || t.back() != 1) {
    n.push_back(1);
    s.push_back(1);
    t.push_back(1);
  }
  MF_USER_CHECK(n.size() <= static_cast<size_t>(kMaxBlockDims), ErrorKind::Unsupported,
                "a block copy over {} non-mergeable dims (at most {})", n.size(), kMaxBlockDims);
  const size_t inner = n.size() - 1;
  const int64_t run = n[inner] * elem;
  auto divides = [&](int64_t u) {
    if (run % u != 0 || (src_addr + p.src_offset) % u != 0 || (dst_addr + p.dst_offset) % u != 0) return false;
    for (size_t d = 0; d < inner; ++d)
      if ((s[d] * elem) % u != 0 || (t[d] * elem) % u != 0) return false;
    return true;
  };
  int64_t unit = 16;
  while (unit > 1 && !divides(unit)) unit /= 2;
  p.unit = unit;
  p.rank = static_cast<int>(n.size());
  p.total = total * elem / unit;
  for (size_t d = 0; d < n.size(); ++d) {
    p.sizes[d] = d == inner ? run / unit : n[d];
    p.src_strides[d] = d == inner ? 1 : s[d] * elem / unit;
    p.dst_strides[d] = d == inner ? 1 : t[d] * elem / unit;
  }
  return p;
}

BlockCopyDims kernelDims(const BlockCopyPlan& plan) {
  BlockCopyDims d{};
  for (int i = 0; i < plan.rank; ++i) {
    d.sizes[i] = plan.sizes[i];
    d.src[i] = plan.src_strides[i];
    d.dst[i] = plan.dst_strides[i];
  }
  return d;
}

}  // namespace meshfuse::cuda
