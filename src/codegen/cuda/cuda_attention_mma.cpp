// The CUDA kernel of a forward kir::Attention step on tensor cores: FlashAttention-2's structure
// on the warp-level `mma.sync.m16n8k16` (bf16 or f16 operands, f32 accumulation), for steps whose
// q, k and v were 16-bit before lowering widened them (kir::Attention::operands), so converting
// them back is exact.
//
// One block of 4 warps per (batch entry, tile of 64 query rows); each warp owns 16 rows. The Q
// tile is converted to 16 bits into shared memory once. For every tile of C keys the rows attend
// (causal: a tile whose first key lies after the tile's last row is skipped whole, as in the
// scalar kernel):
//   1. the K tile goes to shared memory (16-bit); each warp computes its 16 x C scores with
//      mma.sync, Q and K fragments read from shared memory, and keeps them in registers;
//   2. scale, mask (key past the end, causal key position > row position) and the online-softmax
//      update in registers: each row's running maximum is combined over the row's 4 lanes by
//      shuffles; each lane keeps its part of the row's sum (scaled by the same factor, summed at
//      the end) -- no shared score tile, no barrier;
//   3. the V tile replaces K, transposed (a B fragment's two keys are then adjacent); each warp
//      multiplies its P (the score registers, which are already an A fragment's layout) by V.
//      P is in [0, 1] and would lose bits as one 16-bit number, so it goes as two: p_hi = 16(p)
//      and p_lo = 16(p - p_hi), two mma into the same f32 accumulators (|error| <= 2^-16 p for
//      bf16), which keeps the output within the f32 kernel's numerics.
// The end: o = acc / l and lse = m + log l, or 0 and -inf for a row that attended nothing. Positions
// and continuing launches (MfAttentionRows) behave exactly as in the scalar kernel
// (cuda_attention.cpp), which remains the kernel for f32 operands, older GPUs and larger heads.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "codegen/cuda/cuda_attention.h"
#include "meshfuse/error.h"

namespace meshfuse::cuda {
namespace {

constexpr int kThreads = 128;    // 4 warps
constexpr int kRows = 64;        // 16 per warp: an mma's M
constexpr int kMaxHead = 256;    // d and dv (padded to 16 and 8): registers and shared memory
constexpr int64_t kSharedBytes = 48 * 1024;

int64_t roundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

struct MmaTiles {
  int keys = 0;  // C, a multiple of 16 (two n-tiles per k-step of P V)
  int64_t d_pad = 0, dv_pad = 0, shared_bytes = 0;
};

// Shared memory: the Q tile and the K (or transposed V) tile in 16 bits, rows padded by 8
// elements (16 bytes: the 8 rows a fragment load touches fall in different banks), and the
// positions.
int64_t sharedBytes(int64_t d_pad, int64_t dv_pad, int keys) {
  const int64_t q = kRows * (d_pad + 8), kv = std::max<int64_t>(keys * (d_pad + 8), dv_pad * (keys + 8));
  return 2 * (q + kv) + 8 * (kRows + keys);
}

// The largest key tile that fits; keys = 0 when none does. Heads above 128 take at most 32 keys
// so that scores and accumulators stay within a thread's registers.
MmaTiles mmaTiles(const kir::Attention& a) {
  MmaTiles t;
  t.d_pad = roundUp(a.d, 16), t.dv_pad = roundUp(a.dv, 8);
  for (int keys : {64, 32, 16}) {
    if (keys > 16 && keys / 2 >= a.skv) continue;  // a smaller tile holds every key
    if (keys == 64 && t.dv_pad > 128) continue;
    const int64_t bytes = sharedBytes(t.d_pad, t.dv_pad, keys);
    if (bytes <= kSharedBytes) return {keys, t.d_pad, t.dv_pad, bytes};
  }
  return t;
}

// Per operand dtype (BF16, else f16): the conversions, the mma, two f32 as one 32-bit pair of
// 16-bit values (the first in the low half, as a fragment holds them), and a tile's rows
// [r0, r0 + ROWS) of a [n, D] f32 matrix into shared memory as 16-bit rows of ROW elements, zero
// past n and past D up to DP (float4 loads and 8-byte stores when VEC: D divisible by 4, so a
// group of 4 columns is all in or all out).
const char* kHelpers = R"CUDA(
#ifndef MF_MMA_HELPERS
#define MF_MMA_HELPERS
template <bool BF16> __device__ __forceinline__ unsigned short mf_to16(float x) {
  return BF16 ? mf_f32_to_bf16(x) : mf_f32_to_f16(x);
}
template <bool BF16> __device__ __forceinline__ float mf_from16(unsigned short x) {
  return BF16 ? mf_bf16_to_f32(x) : mf_f16_to_f32(x);
}
template <bool BF16> __device__ __forceinline__ void mf_mma(float* c, const unsigned* a, const unsigned* b) {
  if (BF16) mf_mma_bf16(c, a, b);
  else mf_mma_f16(c, a, b);
}
template <bool BF16> __device__ __forceinline__ unsigned mf_pack16(float lo, float hi) {
  return (unsigned)mf_to16<BF16>(lo) | ((unsigned)mf_to16<BF16>(hi) << 16);
}
template <bool BF16, int D, int DP, int ROW, bool VEC, int ROWS = 64>
__device__ __forceinline__ void mf_load_rows(unsigned short* dst, const float* src, long long r0, long long n) {
  if (VEC) {
    for (int e = threadIdx.x; e < ROWS * (DP / 4); e += 128) {
      const int r = e / (DP / 4), c = 4 * (e % (DP / 4));
      float4 x = {0.f, 0.f, 0.f, 0.f};
      if (c < D && r0 + r < n) x = *(const float4*)(src + (r0 + r) * D + c);
      *(uint2*)(dst + r * ROW + c) = uint2{mf_pack16<BF16>(x.x, x.y), mf_pack16<BF16>(x.z, x.w)};
    }
  } else {
    for (int e = threadIdx.x; e < ROWS * DP; e += 128) {
      const int r = e / DP, c = e % DP;
      dst[r * ROW + c] = r0 + r < n && c < D ? mf_to16<BF16>(src[(r0 + r) * D + c]) : (unsigned short)0;
    }
  }
}
#endif
)CUDA";

// Kernel constants before it: BC, D, DV, DP, DVP, NT (= BC / 8), NV (= DVP / 8, at least 1),
// QROW, KROW, VT_ROW, KV_ELEMS, S, SKV, SCALE, CAUSAL, BF16 (else f16), VEC_QK and VEC_V (whole
// float4 loads: d or dv divisible by 4); the pointers q, k, v, o, lse; O_STATE; and kHelpers.
const char* kBody = R"CUDA(
  __shared__ __align__(16) unsigned short mf_qs[64 * QROW];
  __shared__ __align__(16) unsigned short mf_kv[KV_ELEMS];
  __shared__ long long mf_qpos[64], mf_kpos[BC];
  const long long tiles = (S + 63) / 64;
  const long long entry = blockIdx.x / tiles, q0 = (blockIdx.x % tiles) * 64;
  const long long q_end = q0 + 64 < S ? q0 + 64 : S;
  const long long q_max = mf_last_position(mf_rows.query, q0, q_end);
  const long long q_min = mf_first_position(mf_rows.query, q0, q_end);
  const int t = threadIdx.x, warp = t / 32, g = (t % 32) / 4, tig = t % 4;
  mf_load_rows<BF16, D, DP, QROW, VEC_QK>(mf_qs, q + entry * S * D, q0, S);
  if (t < 64) mf_qpos[t] = q0 + t < S ? mf_position(mf_rows.query, q0 + t) : 0;
  // This lane's rows of its warp's 16: fragment rows g and g + 8.
  const int rows[2] = {warp * 16 + g, warp * 16 + g + 8};
  long long qpos[2] = {0, 0};  // their positions (read once the Q tile's barrier has passed)
  float m[2], l[2];  // the row's running maximum (alike in its 4 lanes); this lane's part of its sum
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const bool row = q0 + rows[h] < S;
    m[h] = mf_rows.accumulate && row ? lse[entry * S + q0 + rows[h]] : -MF_INF_F;
    l[h] = mf_rows.accumulate && row && tig == 0 ? 1.f : 0.f;
  }
  // Accumulator fragment nv: columns nv * 8 + 2 tig (+1) of rows[0] (elements 0, 1) and rows[1] (2, 3).
  float acc[NV][4];
#pragma unroll
  for (int nv = 0; nv < NV; ++nv)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const long long row = q0 + rows[i / 2];
      const int col = nv * 8 + 2 * tig + i % 2;
      acc[nv][i] = mf_rows.accumulate && row < S && col < DV ? O_STATE((entry * S + row) * DV + col) : 0.f;
    }
  for (long long k0 = 0; k0 < SKV; k0 += BC) {
    const long long k_end = k0 + BC < SKV ? k0 + BC : SKV;
    if (CAUSAL && mf_first_position(mf_rows.key, k0, k_end) > q_max) continue;  // alike in every thread
    __syncthreads();  // the previous tile's readers are done with mf_kv and mf_kpos
    mf_load_rows<BF16, D, DP, KROW, VEC_QK, BC>(mf_kv, k + entry * SKV * D, k0, SKV);
    if (t < BC) mf_kpos[t] = k0 + t < SKV ? mf_position(mf_rows.key, k0 + t) : 0;
    __syncthreads();
    if (CAUSAL) qpos[0] = mf_qpos[rows[0]], qpos[1] = mf_qpos[rows[1]];
    // Alike in every thread: whether any score of the tile is masked (keys past the end, or a
    // causal tile on the diagonal).
    const bool mask = k0 + BC > SKV || (CAUSAL && mf_last_position(mf_rows.key, k0, k_end) > q_min);
    // 1. Scores: fragment nt holds keys nt * 8 + 2 tig (+1) of rows[0] (0, 1) and rows[1] (2, 3).
    float s[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < DP; kk += 16) {
      const unsigned short* qa = mf_qs + rows[0] * QROW + kk + 2 * tig;
      const unsigned a[4] = {*(const unsigned*)qa, *(const unsigned*)(qa + 8 * QROW), *(const unsigned*)(qa + 8),
                             *(const unsigned*)(qa + 8 * QROW + 8)};
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const unsigned short* kb = mf_kv + (nt * 8 + g) * KROW + kk + 2 * tig;
        const unsigned b[2] = {*(const unsigned*)kb, *(const unsigned*)(kb + 8)};
        mf_mma<BF16>(s[nt], a, b);
      }
    }
    // 2. Online softmax, in registers.
    float mx[2] = {m[0], m[1]};
    if (mask) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int j = nt * 8 + 2 * tig + i % 2;
          const bool masked = k0 + j >= SKV || (CAUSAL && mf_kpos[j] > qpos[i / 2]);
          s[nt][i] = masked ? -MF_INF_F : s[nt][i] * SCALE;
        }
    } else {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) s[nt][i] *= SCALE;
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) mx[i / 2] = s[nt][i] > mx[i / 2] ? s[nt][i] : mx[i / 2];
    float alpha[2], sum[2] = {0.f, 0.f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int lane = 1; lane < 4; lane <<= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, mx[h], lane);
        mx[h] = other > mx[h] ? other : mx[h];
      }
      alpha[h] = mx[h] == -MF_INF_F ? 1.f : expf(m[h] - mx[h]);  // nothing attended yet: keep the state
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float p = mx[i / 2] == -MF_INF_F ? 0.f : expf(s[nt][i] - mx[i / 2]);
        s[nt][i] = p;
        sum[i / 2] += p;
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[h] = l[h] * alpha[h] + sum[h];
      m[h] = mx[h];
    }
#pragma unroll
    for (int nv = 0; nv < NV; ++nv) {
      acc[nv][0] *= alpha[0], acc[nv][1] *= alpha[0];
      acc[nv][2] *= alpha[1], acc[nv][3] *= alpha[1];
    }
    if (DV == 0) continue;  // only the log-sum-exp is asked for
    // 3. V, transposed: row c holds column c of the tile's values.
    __syncthreads();  // every warp is done with K
    if (VEC_V) {
      // Two keys' four columns per item: each column's pair of keys is one 32-bit store.
      for (int e = t; e < (BC / 2) * (DVP / 4); e += 128) {
        const int j = 2 * (e / (DVP / 4)), c = 4 * (e % (DVP / 4));
        float4 a = {0.f, 0.f, 0.f, 0.f}, b = a;
        if (c < DV && k0 + j < SKV) a = *(const float4*)(v + (entry * SKV + k0 + j) * DV + c);
        if (c < DV && k0 + j + 1 < SKV) b = *(const float4*)(v + (entry * SKV + k0 + j + 1) * DV + c);
        *(unsigned*)(mf_kv + (c + 0) * VT_ROW + j) = mf_pack16<BF16>(a.x, b.x);
        *(unsigned*)(mf_kv + (c + 1) * VT_ROW + j) = mf_pack16<BF16>(a.y, b.y);
        *(unsigned*)(mf_kv + (c + 2) * VT_ROW + j) = mf_pack16<BF16>(a.z, b.z);
        *(unsigned*)(mf_kv + (c + 3) * VT_ROW + j) = mf_pack16<BF16>(a.w, b.w);
      }
    } else {
      for (int e = t; e < BC * DVP; e += 128) {
        const int j = e / DVP, c = e % DVP;
        mf_kv[c * VT_ROW + j] = k0 + j < SKV && c < DV ? mf_to16<BF16>(v[(entry * SKV + k0 + j) * DV + c]) : (unsigned short)0;
      }
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) {
      // The A fragment of keys 16 kk .. 16 kk + 15: score fragments 2 kk and 2 kk + 1, as they are.
      unsigned hi[4], lo[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float p0 = s[2 * kk + i / 2][(i % 2) * 2], p1 = s[2 * kk + i / 2][(i % 2) * 2 + 1];
        const unsigned short h0 = mf_to16<BF16>(p0), h1 = mf_to16<BF16>(p1);
        const unsigned short l0 = mf_to16<BF16>(p0 - mf_from16<BF16>(h0)), l1 = mf_to16<BF16>(p1 - mf_from16<BF16>(h1));
        hi[i] = (unsigned)h0 | ((unsigned)h1 << 16);
        lo[i] = (unsigned)l0 | ((unsigned)l1 << 16);
      }
#pragma unroll
      for (int nv = 0; nv < NV; ++nv) {
        const unsigned short* vb = mf_kv + (nv * 8 + g) * VT_ROW + kk * 16 + 2 * tig;
        const unsigned b[2] = {*(const unsigned*)vb, *(const unsigned*)(vb + 8)};
        mf_mma<BF16>(acc[nv], hi, b);
        mf_mma<BF16>(acc[nv], lo, b);
      }
    }
  }
  // The row's sum from its 4 lanes' parts.
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int lane = 1; lane < 4; lane <<= 1) l[h] += __shfl_xor_sync(0xffffffffu, l[h], lane);
  if (o != nullptr) {
#pragma unroll
    for (int nv = 0; nv < NV; ++nv)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const long long row = q0 + rows[i / 2];
        const int col = nv * 8 + 2 * tig + i % 2;
        if (row < S && col < DV) o[(entry * S + row) * DV + col] = l[i / 2] == 0.f ? 0.f : acc[nv][i] / l[i / 2];
      }
  }
  if (lse != nullptr && tig == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (q0 + rows[h] < S) lse[entry * S + q0 + rows[h]] = l[h] == 0.f ? -MF_INF_F : m[h] + logf(l[h]);
  }
)CUDA";

// mma.sync on the device; the host emulation (tests/unit/cuda_emulation.h) supplies
// mf_emu_mma_16816, which computes the same warp-wide product from the PTX fragment layouts.
const char* kMmaSource = R"CUDA(
#ifndef MF_MMA_16816
#define MF_MMA_16816
#ifdef MF_HOST_EMULATION
#define mf_mma_bf16(c, a, b) mf_emu_mma_16816(c, a, b, true)
#define mf_mma_f16(c, a, b) mf_emu_mma_16816(c, a, b, false)
#else
// D = A B + D for a warp: A 16x16 (row), B 16x8 (col), 16-bit operands, f32 accumulators.
__device__ __forceinline__ void mf_mma_bf16(float* c, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void mf_mma_f16(float* c, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif
#endif
)CUDA";

}  // namespace

bool attentionOnTensorCores(const kir::Attention& a, int arch) {
  if (a.wrt >= 0 || arch < 80) return false;
  if (a.operands != DataType::BFloat16 && a.operands != DataType::Half) return false;
  const char* choice = std::getenv("MESHFUSE_CUDA_ATTENTION");
  if (choice != nullptr && std::strcmp(choice, "scalar") == 0) return false;
  if (a.d > kMaxHead || a.dv > kMaxHead) return false;
  return mmaTiles(a).keys > 0;
}

std::string emitAttentionMmaKernel(const kir::Attention& a, const std::vector<kir::Buffer>& buffers,
                                   const std::string& bufs_type, KernelLaunch& launch) {
  const MmaTiles tiles = mmaTiles(a);
  MF_CHECK(tiles.keys > 0, "tensor-core attention for head sizes {} and {}", a.d, a.dv);
  launch.threads = kThreads;
  launch.exact_threads = true;
  launch.attention_rows = true;
  launch.blocks = a.batch * ((a.s + kRows - 1) / kRows);
  const bool bf16 = a.operands == DataType::BFloat16;
  std::string out = kAttentionRowsSource;
  out += kMmaSource;
  out += kHelpers;
  out += fmt::format(
      "// tiled attention on tensor cores ({} mma.sync): {} entries x {} queries x {} keys, d {} dv {}{}; tiles of "
      "64 queries x {} keys, {} bytes of shared memory\n",
      bf16 ? "bf16" : "f16", a.batch, a.s, a.skv, a.d, a.dv, a.causal ? ", causal" : "", tiles.keys,
      tiles.shared_bytes);
  // At least 2 blocks per SM: without it, ptxas capped some of these kernels at 168 registers
  // and spilled (f16, head size 128); 2 blocks of 128 threads may use up to 255.
  out += fmt::format("extern \"C\" __global__ void __launch_bounds__({}, 2) {}({} mf_bufs, MfAttentionRows mf_rows) {{\n",
                     kThreads, launch.name, bufs_type);
  out += fmt::format("  constexpr int BC = {}, D = {}, DV = {}, DP = {}, DVP = {}, NT = {}, NV = {};\n", tiles.keys,
                     a.d, a.dv, tiles.d_pad, tiles.dv_pad, tiles.keys / 8, std::max<int64_t>(1, tiles.dv_pad / 8));
  out += fmt::format("  constexpr int QROW = {}, KROW = {}, VT_ROW = {}, KV_ELEMS = {};\n", tiles.d_pad + 8,
                     tiles.d_pad + 8, tiles.keys + 8,
                     std::max<int64_t>(tiles.keys * (tiles.d_pad + 8), tiles.dv_pad * (tiles.keys + 8)));
  out += fmt::format("  constexpr long long S = {}LL, SKV = {}LL;\n  constexpr bool CAUSAL = {};\n", a.s, a.skv,
                     a.causal ? "true" : "false");
  out += fmt::format("  constexpr bool BF16 = {}, VEC_QK = {}, VEC_V = {};\n", bf16 ? "true" : "false",
                     a.d % 4 == 0 ? "true" : "false", a.dv % 4 == 0 ? "true" : "false");
  return out + attentionOperands(a, buffers) + kBody + "}\n\n";
}

}  // namespace meshfuse::cuda
