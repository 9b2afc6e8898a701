// The CUDA kernel of a kir::Attention step.
//
// One block of 128 threads per (batch entry, tile of R query rows); its Q tile stays in shared
// memory. For every tile of C keys the rows attend (causal: tiles starting after the tile's last
// row are skipped whole):
//   1. the K tile goes to shared memory; each thread computes R*C/128 scores scale * q.k (f32),
//      masked (key past the end, or causal key j > row i) to -inf, into a shared score tile;
//   2. 128 / R threads per row (lanes of one warp, combined by shuffles) run the online-softmax
//      update: m' = max(m, rowmax), P = exp(s - m') in place, l = l exp(m - m') + rowsum P, and
//      leave alpha = exp(m - m') for the row;
//   3. the V tile replaces K in shared memory; each thread owns R*dv/128 output elements in
//      registers: acc = acc * alpha[row] + sum_j P[row, j] V[j, col].
// The end: o = acc / l, lse = m + log l. Everything is f32 (bf16 operands arrive widened, as
// the kernel IR lowers them); no [s, skv] score matrix exists, only one R x C tile per block.
//
// Tiles are specialized per launch (the program is compiled for its shapes), so every trip
// count is a constant and the accumulators are registers.
#include "codegen/cuda/cuda_attention.h"

#include <fmt/format.h>

#include <algorithm>

#include "meshfuse/error.h"

namespace meshfuse::cuda {
namespace {

constexpr int kAttentionThreads = 128;
constexpr int64_t kSharedFloats = 48 * 1024 / 4;  // static shared memory without an opt-in
constexpr int64_t kMaxAccumulators = 32;           // output elements per thread

int64_t sharedFloats(const kir::Attention& a, int rows, int keys) {
  const int64_t kv_row = std::max(a.d, a.dv) + 1;  // +1: a warp's threads read different rows
  return rows * a.d + keys * kv_row + rows * (keys + 1) + 3 * rows;
}

// The kernel body: the constants R, C, D, DV, S, SKV, SCALE, CAUSAL, KV_ROW, P_ROW, NACC and the
// pointers q, k, v, o, lse are declared before it.
const char* kBody = R"CUDA(
  __shared__ float mf_q[R * D > 0 ? R * D : 1];
  __shared__ float mf_kv[C * KV_ROW];
  __shared__ float mf_p[R * P_ROW];
  __shared__ float mf_m[R], mf_l[R], mf_alpha[R];
  const long long tiles = (S + R - 1) / R;
  const long long entry = blockIdx.x / tiles, q0 = (blockIdx.x % tiles) * R;
  const int t = threadIdx.x;
  for (int e = t; e < R * D; e += 128) {
    const int r = e / D, c = e % D;
    mf_q[e] = q0 + r < S ? q[(entry * S + q0 + r) * D + c] : 0.f;
  }
  if (t < R) { mf_m[t] = -MF_INF_F; mf_l[t] = 0.f; }
  float acc[NACC];
#pragma unroll
  for (int u = 0; u < NACC; ++u) acc[u] = 0.f;
  const long long key_end = CAUSAL ? (SKV < q0 + R ? SKV : q0 + R) : SKV;  // later keys: masked for every row
  for (long long k0 = 0; k0 < key_end; k0 += C) {
    __syncthreads();  // the previous tile's readers are done with mf_kv
    for (int e = t; e < C * D; e += 128) {
      const int j = e / D, c = e % D;
      mf_kv[j * KV_ROW + c] = k0 + j < key_end ? k[(entry * SKV + k0 + j) * D + c] : 0.f;
    }
    __syncthreads();
    for (int e = t; e < R * C; e += 128) {
      const int r = e / C, j = e % C;
      float s = 0.f;
      for (int c = 0; c < D; ++c) s += mf_q[r * D + c] * mf_kv[j * KV_ROW + c];
      const long long key = k0 + j;
      const bool masked = key >= key_end || (CAUSAL && key > q0 + r);
      mf_p[r * P_ROW + j] = masked ? -MF_INF_F : s * SCALE;
    }
    __syncthreads();
    {
      // 128 / R threads per row (consecutive lanes of one warp): strided partial max and sum,
      // combined by shuffles; every thread of the block takes part (the shuffles need them all).
      constexpr int TPR = 128 / R;
      const int r = t / TPR, part = t % TPR;
      float* row = mf_p + r * P_ROW;
      const float m = mf_m[r];
      float m_new = m;
      for (int j = part; j < C; j += TPR) m_new = row[j] > m_new ? row[j] : m_new;
#pragma unroll
      for (int lane = 1; lane < TPR; lane <<= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, m_new, lane);
        m_new = other > m_new ? other : m_new;
      }
      float alpha = 1.f, sum = 0.f;
      if (m_new == -MF_INF_F) {  // every key so far masked: nothing attended yet
        for (int j = part; j < C; j += TPR) row[j] = 0.f;
      } else {
        alpha = expf(m - m_new);  // 0 on the first attended tile (m = -inf)
        for (int j = part; j < C; j += TPR) {
          const float e = expf(row[j] - m_new);
          row[j] = e;
          sum += e;
        }
      }
#pragma unroll
      for (int lane = 1; lane < TPR; lane <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, lane);
      if (part == 0) {
        mf_l[r] = mf_l[r] * alpha + sum;
        mf_m[r] = m_new;
        mf_alpha[r] = alpha;
      }
    }
    __syncthreads();  // K is no longer read: V takes its place
    for (int e = t; e < C * DV; e += 128) {
      const int j = e / DV, c = e % DV;
      mf_kv[j * KV_ROW + c] = k0 + j < key_end ? v[(entry * SKV + k0 + j) * DV + c] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < NACC; ++u) {
      const int e = t + 128 * u;
      if (e < R * DV) {
        const int r = e / DV, c = e % DV;
        float a = acc[u] * mf_alpha[r];
        for (int j = 0; j < C; ++j) a += mf_p[r * P_ROW + j] * mf_kv[j * KV_ROW + c];
        acc[u] = a;
      }
    }
  }
  __syncthreads();
#pragma unroll
  for (int u = 0; u < NACC; ++u) {
    const int e = t + 128 * u;
    if (e < R * DV && o != nullptr) {
      const int r = e / DV, c = e % DV;
      if (q0 + r < S) o[(entry * S + q0 + r) * DV + c] = acc[u] / mf_l[r];
    }
  }
  if (lse != nullptr && t < R && q0 + t < S) lse[entry * S + q0 + t] = mf_m[t] + logf(mf_l[t]);
)CUDA";

}  // namespace

AttentionTiles attentionTiles(const kir::Attention& a) {
  for (int rows : {64, 32, 16, 8}) {
    if (rows > 8 && rows / 2 >= a.s) continue;  // half the tile would hold every row: smaller blocks
    if (rows * a.dv > kAttentionThreads * kMaxAccumulators && rows > 8) continue;
    for (int keys : {64, 32, 16, 8}) {
      if (keys > 8 && keys / 2 >= a.skv) continue;
      const int64_t floats = sharedFloats(a, rows, keys);
      if (floats <= kSharedFloats && rows * a.dv <= kAttentionThreads * kMaxAccumulators) return {rows, keys, floats};
    }
  }
  throw UserError(ErrorKind::Unsupported,
                  fmt::format("CUDA attention: head sizes {} (query/key) and {} (value) do not fit the tiled kernel "
                              "(8 query rows and 8 keys per tile need at most 12288 floats of shared memory and "
                              "value head size <= 512)",
                              a.d, a.dv));
}

std::string emitAttentionKernel(const kir::Attention& a, const std::string& bufs_type, KernelLaunch& launch) {
  const AttentionTiles tiles = attentionTiles(a);
  launch.threads = kAttentionThreads;
  launch.exact_threads = true;
  launch.blocks = a.batch * ((a.s + tiles.rows - 1) / tiles.rows);
  // At least one (an array of 0 is not C++); dv = 0 when only the log-sum-exp is asked for.
  const int64_t nacc = std::max<int64_t>(1, (tiles.rows * a.dv + kAttentionThreads - 1) / kAttentionThreads);
  auto ptr = [&](int64_t b, bool in) {
    return b < 0 ? std::string("nullptr") : fmt::format("({}float*)mf_bufs.p[{}]", in ? "const " : "", b);
  };
  std::string out = fmt::format(
      "// tiled attention: {} entries x {} queries x {} keys, d {} dv {}{}; tiles of {} queries x {} keys, {} floats "
      "of shared memory\n",
      a.batch, a.s, a.skv, a.d, a.dv, a.causal ? ", causal" : "", tiles.rows, tiles.keys, tiles.shared_floats);
  out += fmt::format("extern \"C\" __global__ void __launch_bounds__({}) {}({} mf_bufs) {{\n", kAttentionThreads,
                     launch.name, bufs_type);
  out += fmt::format("  constexpr int R = {}, C = {}, D = {}, DV = {}, KV_ROW = {}, P_ROW = {}, NACC = {};\n",
                     tiles.rows, tiles.keys, a.d, a.dv, std::max(a.d, a.dv) + 1, tiles.keys + 1, nacc);
  out += fmt::format("  constexpr long long S = {}LL, SKV = {}LL;\n  constexpr bool CAUSAL = {};\n", a.s, a.skv,
                     a.causal ? "true" : "false");
  out += fmt::format("  const float SCALE = {:a}f;\n", static_cast<float>(a.scale));  // exact (hex float)
  out += fmt::format("  const float* __restrict__ q = {};\n  const float* __restrict__ k = {};\n", ptr(a.q, true),
                     ptr(a.k, true));
  out += fmt::format("  const float* __restrict__ v = {};\n  float* __restrict__ o = {};\n  float* __restrict__ lse = {};\n",
                     ptr(a.v, true), ptr(a.o, false), ptr(a.lse, false));
  return out + kBody + "}\n\n";
}

}  // namespace meshfuse::cuda
