// The CUDA kernel of a kir::Attention step.
//
// One block of 128 threads per (batch entry, tile of R query rows); its Q tile stays in shared
// memory. For every tile of C keys the rows attend (causal: a tile whose first key lies after the
// tile's last row is skipped whole):
//   1. the K tile goes to shared memory; each thread computes R*C/128 scores scale * q.k (f32),
//      masked (key past the end, or causal key position > row position) to -inf, into a shared
//      score tile;
//   2. 128 / R threads per row (lanes of one warp, combined by shuffles) run the online-softmax
//      update: m' = max(m, rowmax), P = exp(s - m') in place, l = l exp(m - m') + rowsum P, and
//      leave alpha = exp(m - m') for the row;
//   3. the V tile replaces K in shared memory; each thread owns R*dv/128 output elements in
//      registers: acc = acc * alpha[row] + sum_j P[row, j] V[j, col].
// The end: o = acc / l, lse = m + log l (a row that attended nothing: 0 and -inf). Everything is
// f32 (bf16 operands arrive widened, as the kernel IR lowers them); no [s, skv] score matrix
// exists, only one R x C tile per block.
//
// Positions: the second parameter (AttentionRowsArg) says where the local query and key rows lie
// in the global sequence (a ring step's blocks, or a query block against gathered keys); the
// causal mask and the skipping compare those. With `accumulate` the state starts from what the
// outputs hold (m = lse, l = 1, acc = the running output, read from the 16-bit output when the
// f32 one is a temporary): the exact log-sum-exp merge of ring attention's steps.
//
// Tiles are specialized per launch (the program is compiled for its shapes), so every trip
// count is a constant and the accumulators are registers; positions are arguments, so the steps
// of a ring share one compiled kernel.
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
  return rows * a.d + keys * kv_row + rows * (keys + 1) + 3 * rows + 2 * (rows + keys);  // + positions
}

// The kernel body: the constants R, C, D, DV, S, SKV, SCALE, CAUSAL, KV_ROW, P_ROW, NACC, the
// pointers q, k, v, o, lse and O_STATE (the running output's element i, when accumulating) are
// declared before it.
const char* kBody = R"CUDA(
  __shared__ float mf_q[R * D > 0 ? R * D : 1];
  __shared__ float mf_kv[C * KV_ROW];
  __shared__ float mf_p[R * P_ROW];
  __shared__ float mf_m[R], mf_l[R], mf_alpha[R];
  __shared__ long long mf_qpos[R], mf_kpos[C];
  const long long tiles = (S + R - 1) / R;
  const long long entry = blockIdx.x / tiles, q0 = (blockIdx.x % tiles) * R;
  const long long q_end = q0 + R < S ? q0 + R : S;
  const long long q_max = mf_last_position(mf_rows.query, q0, q_end);  // the tile's last row's position
  const int t = threadIdx.x;
  for (int e = t; e < R * D; e += 128) {
    const int r = e / D, c = e % D;
    mf_q[e] = q0 + r < S ? q[(entry * S + q0 + r) * D + c] : 0.f;
  }
  if (t < R) {
    const bool row = q0 + t < S;
    mf_qpos[t] = row ? mf_position(mf_rows.query, q0 + t) : 0;
    mf_m[t] = mf_rows.accumulate && row ? lse[entry * S + q0 + t] : -MF_INF_F;
    mf_l[t] = mf_rows.accumulate && row ? 1.f : 0.f;
  }
  float acc[NACC];
#pragma unroll
  for (int u = 0; u < NACC; ++u) {
    const int e = t + 128 * u;
    acc[u] = 0.f;
    if (mf_rows.accumulate && e < R * DV && q0 + e / DV < S) acc[u] = O_STATE((entry * S + q0 + e / DV) * DV + e % DV);
  }
  for (long long k0 = 0; k0 < SKV; k0 += C) {
    const long long k_end = k0 + C < SKV ? k0 + C : SKV;
    if (CAUSAL && mf_first_position(mf_rows.key, k0, k_end) > q_max) continue;  // alike in every thread
    __syncthreads();  // the previous tile's readers are done with mf_kv and mf_kpos
    for (int e = t; e < C * D; e += 128) {
      const int j = e / D, c = e % D;
      mf_kv[j * KV_ROW + c] = k0 + j < SKV ? k[(entry * SKV + k0 + j) * D + c] : 0.f;
    }
    if (t < C) mf_kpos[t] = k0 + t < SKV ? mf_position(mf_rows.key, k0 + t) : 0;
    __syncthreads();
    for (int e = t; e < R * C; e += 128) {
      const int r = e / C, j = e % C;
      float s = 0.f;
      for (int c = 0; c < D; ++c) s += mf_q[r * D + c] * mf_kv[j * KV_ROW + c];
      const bool masked = k0 + j >= SKV || (CAUSAL && mf_kpos[j] > mf_qpos[r]);
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
      // The row's other lanes read mf_m[r] above; a shuffle orders no memory, __syncwarp does
      // (compute-sanitizer racecheck reported the hazard). Every thread of the block is here.
      __syncwarp();
      if (part == 0) {
        mf_l[r] = mf_l[r] * alpha + sum;
        mf_m[r] = m_new;
        mf_alpha[r] = alpha;
      }
    }
    __syncthreads();  // K is no longer read: V takes its place
    for (int e = t; e < C * DV; e += 128) {
      const int j = e / DV, c = e % DV;
      mf_kv[j * KV_ROW + c] = k0 + j < SKV ? v[(entry * SKV + k0 + j) * DV + c] : 0.f;
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
  // l = 0: the row attended no key (a ring step's rows may not, yet): output 0, log-sum-exp -inf.
#pragma unroll
  for (int u = 0; u < NACC; ++u) {
    const int e = t + 128 * u;
    if (e < R * DV && o != nullptr) {
      const int r = e / DV, c = e % DV;
      if (q0 + r < S) o[(entry * S + q0 + r) * DV + c] = mf_l[r] == 0.f ? 0.f : acc[u] / mf_l[r];
    }
  }
  if (lse != nullptr && t < R && q0 + t < S)
    lse[entry * S + q0 + t] = mf_l[t] == 0.f ? -MF_INF_F : mf_m[t] + logf(mf_l[t]);
)CUDA";

}  // namespace

const char* kAttentionRowsSource = R"CUDA(
#ifndef MF_ATTENTION_ROWS
#define MF_ATTENTION_ROWS
// cuda::AttentionRowsArg (cuda_attention.h), field for field.
struct MfRowBlocks { long long local[4], global[4], count[4]; int n; };
struct MfAttentionRows { MfRowBlocks query, key; int accumulate; };
// The global position of local row r.
__device__ __forceinline__ long long mf_position(const MfRowBlocks& b, long long r) {
  int i = 0;
  while (i + 1 < b.n && r >= b.local[i] + b.count[i]) ++i;
  return b.global[i] + (r - b.local[i]);
}
// The first (least) and last (greatest) position of local rows [r0, r1), r0 < r1.
__device__ __forceinline__ long long mf_first_position(const MfRowBlocks& b, long long r0, long long r1) {
  long long m = 0x7fffffffffffffffLL;
  for (int i = 0; i < b.n; ++i) {
    const long long lo = b.local[i] > r0 ? b.local[i] : r0, hi = b.local[i] + b.count[i] < r1 ? b.local[i] + b.count[i] : r1;
    if (lo < hi && b.global[i] + (lo - b.local[i]) < m) m = b.global[i] + (lo - b.local[i]);
  }
  return m;
}
__device__ __forceinline__ long long mf_last_position(const MfRowBlocks& b, long long r0, long long r1) {
  long long m = -0x7fffffffffffffffLL;
  for (int i = 0; i < b.n; ++i) {
    const long long lo = b.local[i] > r0 ? b.local[i] : r0, hi = b.local[i] + b.count[i] < r1 ? b.local[i] + b.count[i] : r1;
    if (lo < hi && b.global[i] + (hi - 1 - b.local[i]) > m) m = b.global[i] + (hi - 1 - b.local[i]);
  }
  return m;
}
#endif
)CUDA";

void AttentionRowsArg::Blocks::add(int64_t start, int64_t rows_in_block, const char* what) {
  MF_CHECK(n < kMaxRowBlocks, "an attention launch with more than {} {} blocks", kMaxRowBlocks, what);
  local[n] = rows();
  global[n] = start;
  count[n] = rows_in_block;
  ++n;
}

AttentionRowsArg AttentionRowsArg::whole(int64_t query_rows, int64_t key_rows) {
  AttentionRowsArg r;
  r.query.add(0, query_rows, "query");
  r.key.add(0, key_rows, "key");
  return r;
}

std::string attentionBuffer(int64_t b, const char* type) {
  return b < 0 ? std::string("nullptr") : fmt::format("({})mf_bufs.p[{}]", type, b);
}

std::string attentionLoad(int64_t b, DataType dtype, const std::string& index) {
  if (b < 0) return "0.f";
  switch (dtype) {
    case DataType::Float: return fmt::format("((const float*)mf_bufs.p[{}])[{}]", b, index);
    case DataType::BFloat16: return fmt::format("mf_bf16_to_f32(((const unsigned short*)mf_bufs.p[{}])[{}])", b, index);
    case DataType::Half: return fmt::format("mf_f16_to_f32(((const unsigned short*)mf_bufs.p[{}])[{}])", b, index);
    default: MF_CHECK(false, "an attention state of dtype {}", dtypeName(dtype));
  }
  return "";
}


std::string attentionOperands(const kir::Attention& a, const std::vector<kir::Buffer>& buffers) {
  std::string out = fmt::format("  const float SCALE = {:a}f;\n", static_cast<float>(a.scale));  // exact (hex float)
  out += fmt::format("  const float* __restrict__ q = {};\n  const float* __restrict__ k = {};\n",
                     attentionBuffer(a.q, "const float*"), attentionBuffer(a.k, "const float*"));
  out += fmt::format("  const float* __restrict__ v = {};\n  float* __restrict__ o = {};\n  float* __restrict__ lse = {};\n",
                     attentionBuffer(a.v, "const float*"), attentionBuffer(a.o, "float*"),
                     attentionBuffer(a.lse, "float*"));
  // The running output of a continuing launch: the 16-bit output where the f32 one is a
  // temporary, else the f32 output itself (read through `o`: each element by the thread that
  // later writes it).
  const std::string state = a.o_rounded >= 0 ? attentionLoad(a.o_rounded, buffers.at(a.o_rounded).dtype, "i")
                            : a.o >= 0       ? "o[i]"
                                             : "0.f";
  return out + fmt::format("  const auto O_STATE = [&](long long i) -> float {{ return {}; }};\n", state);
}

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

std::string emitAttentionKernel(const kir::Attention& a, const std::vector<kir::Buffer>& buffers,
                                const std::string& bufs_type, KernelLaunch& launch, int arch) {
  if (a.wrt >= 0) return emitAttentionGradKernel(a, buffers, bufs_type, launch);
  if (attentionOnTensorCores(a, arch)) return emitAttentionMmaKernel(a, buffers, bufs_type, launch);
  const AttentionTiles tiles = attentionTiles(a);
  launch.threads = kAttentionThreads;
  launch.exact_threads = true;
  launch.attention_rows = true;
  launch.blocks = a.batch * ((a.s + tiles.rows - 1) / tiles.rows);
  // At least one (an array of 0 is not C++); dv = 0 when only the log-sum-exp is asked for.
  const int64_t nacc = std::max<int64_t>(1, (tiles.rows * a.dv + kAttentionThreads - 1) / kAttentionThreads);
  std::string out = kAttentionRowsSource;
  out += fmt::format(
      "// tiled attention: {} entries x {} queries x {} keys, d {} dv {}{}; tiles of {} queries x {} keys, {} floats "
      "of shared memory\n",
      a.batch, a.s, a.skv, a.d, a.dv, a.causal ? ", causal" : "", tiles.rows, tiles.keys, tiles.shared_floats);
  out += fmt::format("extern \"C\" __global__ void __launch_bounds__({}) {}({} mf_bufs, MfAttentionRows mf_rows) {{\n",
                     kAttentionThreads, launch.name, bufs_type);
  out += fmt::format("  constexpr int R = {}, C = {}, D = {}, DV = {}, KV_ROW = {}, P_ROW = {}, NACC = {};\n",
                     tiles.rows, tiles.keys, a.d, a.dv, std::max(a.d, a.dv) + 1, tiles.keys + 1, nacc);
  out += fmt::format("  constexpr long long S = {}LL, SKV = {}LL;\n  constexpr bool CAUSAL = {};\n", a.s, a.skv,
                     a.causal ? "true" : "false");
  return out + attentionOperands(a, buffers) + kBody + "}\n\n";
}

}  // namespace meshfuse::cuda
