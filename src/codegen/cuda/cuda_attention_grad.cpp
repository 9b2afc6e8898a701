// The CUDA kernels of attention's gradient (a kir::Attention step with wrt >= 0): FlashAttention's
// backward, as the CPU's attention_grad_kernel.cpp computes it.
//
// The forward's log-sum-exp (lse) and delta = rowsum(g o) make every (query tile, key tile) pair
// independent: P = exp(scale Q K^T - lse) is the exact probability block, dS = P (G V^T - delta)
// scale, and each gradient is a sum of per-pair terms, dQ += dS K, dK += dS^T Q, dV += P^T G.
// One block of 128 threads owns a tile of the gradient's rows and keeps it in registers, so no
// two blocks write one element (no atomics: deterministic):
//   dQ         a block per (batch entry, tile of R query rows), looping over the key tiles
//   dK and dV  a block per (batch entry, tile of C keys), looping over the query tiles; the value's
//              gradient is computed beside the key's from the same P when the step asks for both
//              (kir::Attention::dv_out), or alone (wrt = 2, no dS needed)
// Per tile pair: the other side's tiles go to shared memory; each thread computes R*C/128
// elements of P (and dS) into shared tiles; then each thread adds its gradient elements' sums over
// the pair. Causal pairs with nothing to attend are skipped whole, masked elements give 0; the
// positions come from the launch (AttentionRowsArg), so ring steps on blocks of the sequence run
// the same kernel, and a launch that accumulates adds into what the gradient holds (the 16-bit
// output where the f32 one is a temporary). Everything is f32.
#include <fmt/format.h>

#include <algorithm>

#include "codegen/cuda/cuda_attention.h"
#include "meshfuse/error.h"

namespace meshfuse::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int64_t kSharedFloats = 48 * 1024 / 4;  // static shared memory without an opt-in
constexpr int64_t kMaxAccumulators = 32;           // gradient elements per thread, per gradient

// R query rows x C keys per tile pair: q and g tiles, k and v tiles (padded rows), P and dS tiles,
// lse and delta, positions (long long: two floats each).
int64_t sharedFloats(const kir::Attention& a, int rows, int keys) {
  const int64_t kv_row = std::max(a.d, a.dv) + 1;  // +1: a warp's threads read different rows
  return rows * (a.d + a.dv) + 2 * keys * kv_row + 2 * rows * (keys + 1) + 2 * rows + 2 * (rows + keys);
}

// The per-thread accumulators: the owned tile's gradient elements (dQ: R x d; dK: C x d; dV: C x dv).
int64_t accumulators(const kir::Attention& a, int rows, int keys) {
  const auto per_thread = [](int64_t n) { return (n + kThreads - 1) / kThreads; };
  if (a.wrt == 0) return per_thread(rows * a.d);
  return std::max(a.wrt == 1 ? per_thread(keys * a.d) : 0, per_thread(keys * a.dv));
}

AttentionTiles gradTiles(const kir::Attention& a) {
  for (int rows : {64, 32, 16, 8}) {
    if (rows > 8 && rows / 2 >= a.s) continue;  // half the tile would hold every row: smaller tiles
    for (int keys : {64, 32, 16, 8}) {
      if (keys > 8 && keys / 2 >= a.skv) continue;
      const int64_t floats = sharedFloats(a, rows, keys);
      if (floats <= kSharedFloats && accumulators(a, rows, keys) <= kMaxAccumulators) return {rows, keys, floats};
    }
  }
  throw UserError(ErrorKind::Unsupported,
                  fmt::format("CUDA attention gradient: head sizes {} (query/key) and {} (value) do not fit the tiled "
                              "kernel (8 query rows and 8 keys per tile need at most 12288 floats of shared memory)",
                              a.d, a.dv));
}

// Loads the query side's tile [q0, q0 + R) of batch entry `entry` (rows past S: lse -inf) and
// computes P (and, with DS, dS) for the key tile in shared memory. Constants and pointers as in
// the kernels below.
const char* kLoadQueryTile = R"CUDA(
  for (int e = t; e < R * D; e += 128) {
    const int r = e / D, c = e % D;
    mf_q[e] = q0 + r < S ? q[(entry * S + q0 + r) * D + c] : 0.f;
  }
  for (int e = t; e < R * DV; e += 128) {
    const int r = e / DV, c = e % DV;
    mf_g[e] = q0 + r < S ? g[(entry * S + q0 + r) * DV + c] : 0.f;
  }
  if (t < R) {
    const bool row = q0 + t < S;
    mf_lse[t] = row ? lse_in[entry * S + q0 + t] : -MF_INF_F;
    mf_delta[t] = row ? delta[entry * S + q0 + t] : 0.f;
    mf_qpos[t] = row ? mf_position(mf_rows.query, q0 + t) : 0;
  }
)CUDA";

const char* kLoadKeyTile = R"CUDA(
  for (int e = t; e < C * D; e += 128) {
    const int j = e / D, c = e % D;
    mf_k[j * KV_ROW + c] = k0 + j < SKV ? k[(entry * SKV + k0 + j) * D + c] : 0.f;
  }
  for (int e = t; e < C * DV; e += 128) {
    const int j = e / DV, c = e % DV;
    mf_v[j * KV_ROW + c] = k0 + j < SKV ? v[(entry * SKV + k0 + j) * DV + c] : 0.f;
  }
  if (t < C) mf_kpos[t] = k0 + t < SKV ? mf_position(mf_rows.key, k0 + t) : 0;
)CUDA";

// P and dS of the tile pair in shared memory (masked, padded or lse = -inf elements: 0).
const char* kTilePair = R"CUDA(
  for (int e = t; e < R * C; e += 128) {
    const int r = e / C, j = e % C;
    float p = 0.f, ds = 0.f;
    if (k0 + j < SKV && q0 + r < S && !(CAUSAL && mf_kpos[j] > mf_qpos[r]) && mf_lse[r] != -MF_INF_F) {
      float s = 0.f;
      for (int c = 0; c < D; ++c) s += mf_q[r * D + c] * mf_k[j * KV_ROW + c];
      p = expf(s * SCALE - mf_lse[r]);
      if (DS) {
        float dp = 0.f;
        for (int c = 0; c < DV; ++c) dp += mf_g[r * DV + c] * mf_v[j * KV_ROW + c];
        ds = p * (dp - mf_delta[r]) * SCALE;
      }
    }
    mf_p[r * P_ROW + j] = p;
    if (DS) mf_ds[r * P_ROW + j] = ds;
  }
)CUDA";

const char* kShared = R"CUDA(
  __shared__ float mf_q[R * D > 0 ? R * D : 1], mf_g[R * DV > 0 ? R * DV : 1];
  __shared__ float mf_k[C * KV_ROW], mf_v[C * KV_ROW];
  __shared__ float mf_p[R * P_ROW], mf_ds[R * P_ROW];
  __shared__ float mf_lse[R], mf_delta[R];
  __shared__ long long mf_qpos[R], mf_kpos[C];
  const int t = threadIdx.x;
)CUDA";

// dQ: a block per query tile; its R x D gradient elements in registers (acc).
const char* kQueryBody = R"CUDA(
  const long long tiles = (S + R - 1) / R;
  const long long entry = blockIdx.x / tiles, q0 = (blockIdx.x % tiles) * R;
  const long long q_max = mf_last_position(mf_rows.query, q0, q0 + R < S ? q0 + R : S);
  float acc[NACC];
#pragma unroll
  for (int u = 0; u < NACC; ++u) {
    const int e = t + 128 * u;
    acc[u] = mf_rows.accumulate && e < R * D && q0 + e / D < S ? OUT_STATE((entry * S + q0 + e / D) * D + e % D) : 0.f;
  }
)CUDA"
                         "%LOAD_QUERY%"
                         R"CUDA(
  for (long long k0 = 0; k0 < SKV; k0 += C) {
    if (CAUSAL && mf_first_position(mf_rows.key, k0, k0 + C < SKV ? k0 + C : SKV) > q_max) continue;
    __syncthreads();  // the previous pair's readers are done with the key tiles
)CUDA"
                         "%LOAD_KEY%"
                         R"CUDA(
    __syncthreads();
)CUDA"
                         "%PAIR%"
                         R"CUDA(
    __syncthreads();
#pragma unroll
    for (int u = 0; u < NACC; ++u) {
      const int e = t + 128 * u;
      if (e < R * D) {
        const int r = e / D, c = e % D;
        float a = acc[u];
        for (int j = 0; j < C; ++j) a += mf_ds[r * P_ROW + j] * mf_k[j * KV_ROW + c];
        acc[u] = a;
      }
    }
  }
#pragma unroll
  for (int u = 0; u < NACC; ++u) {
    const int e = t + 128 * u;
    if (e < R * D && q0 + e / D < S) out[(entry * S + q0 + e / D) * D + e % D] = acc[u];
  }
)CUDA";

// dK and/or dV: a block per key tile; its C x D (dK) and C x DV (dV) elements in registers.
const char* kKeyBody = R"CUDA(
  const long long tiles = (SKV + C - 1) / C;
  const long long entry = blockIdx.x / tiles, k0 = (blockIdx.x % tiles) * C;
  const long long k_min = mf_first_position(mf_rows.key, k0, k0 + C < SKV ? k0 + C : SKV);
  float acc_k[NACC_K], acc_v[NACC_V];
#pragma unroll
  for (int u = 0; u < NACC_K; ++u) {
    const int e = t + 128 * u;
    acc_k[u] = mf_rows.accumulate && DK && e < C * D && k0 + e / D < SKV ? DK_STATE((entry * SKV + k0 + e / D) * D + e % D) : 0.f;
  }
#pragma unroll
  for (int u = 0; u < NACC_V; ++u) {
    const int e = t + 128 * u;
    acc_v[u] = mf_rows.accumulate && DVG && e < C * DV && k0 + e / DV < SKV ? DV_STATE((entry * SKV + k0 + e / DV) * DV + e % DV) : 0.f;
  }
)CUDA"
                       "%LOAD_KEY%"
                       R"CUDA(
  for (long long q0 = 0; q0 < S; q0 += R) {
    if (CAUSAL && k_min > mf_last_position(mf_rows.query, q0, q0 + R < S ? q0 + R : S)) continue;
    __syncthreads();  // the previous pair's readers are done with the query tiles (and the key tiles are loaded)
)CUDA"
                       "%LOAD_QUERY%"
                       R"CUDA(
    __syncthreads();
)CUDA"
                       "%PAIR%"
                       R"CUDA(
    __syncthreads();
    if (DVG) {
#pragma unroll
      for (int u = 0; u < NACC_V; ++u) {
        const int e = t + 128 * u;
        if (e < C * DV) {
          const int j = e / DV, c = e % DV;
          float a = acc_v[u];
          for (int r = 0; r < R; ++r) a += mf_p[r * P_ROW + j] * mf_g[r * DV + c];
          acc_v[u] = a;
        }
      }
    }
    if (DK) {
#pragma unroll
      for (int u = 0; u < NACC_K; ++u) {
        const int e = t + 128 * u;
        if (e < C * D) {
          const int j = e / D, c = e % D;
          float a = acc_k[u];
          for (int r = 0; r < R; ++r) a += mf_ds[r * P_ROW + j] * mf_q[r * D + c];
          acc_k[u] = a;
        }
      }
    }
  }
#pragma unroll
  for (int u = 0; u < NACC_K; ++u) {
    const int e = t + 128 * u;
    if (DK && e < C * D && k0 + e / D < SKV) dk_out[(entry * SKV + k0 + e / D) * D + e % D] = acc_k[u];
  }
#pragma unroll
  for (int u = 0; u < NACC_V; ++u) {
    const int e = t + 128 * u;
    if (DVG && e < C * DV && k0 + e / DV < SKV) dv_out[(entry * SKV + k0 + e / DV) * DV + e % DV] = acc_v[u];
  }
)CUDA";

std::string expand(std::string body) {
  auto put = [&](const std::string& key, const char* text) {
    for (size_t at; (at = body.find(key)) != std::string::npos;) body.replace(at, key.size(), text);
  };
  put("%LOAD_QUERY%", kLoadQueryTile);
  put("%LOAD_KEY%", kLoadKeyTile);
  put("%PAIR%", kTilePair);
  return body;
}

// The state a continuing launch adds into for the gradient in f32 buffer `out`: the 16-bit
// buffer `rounded` where the f32 one is a temporary, else `out` itself (read through `name`, the
// kernel's pointer, by the thread that later writes the element).
std::string stateOf(int64_t out, int64_t rounded, const std::vector<kir::Buffer>& buffers, const char* name) {
  if (rounded >= 0) return attentionLoad(rounded, buffers.at(rounded).dtype, "i");
  return out >= 0 ? fmt::format("{}[i]", name) : "0.f";
}

}  // namespace

std::string emitAttentionGradKernel(const kir::Attention& a, const std::vector<kir::Buffer>& buffers,
                                    const std::string& bufs_type, KernelLaunch& launch) {
  MF_CHECK(a.wrt >= 0 && a.wrt <= 2 && a.o >= 0 && a.g >= 0 && a.lse_in >= 0 && a.delta >= 0,
           "an attention gradient step without its operands");
  const AttentionTiles tiles = gradTiles(a);
  const bool by_query = a.wrt == 0;
  launch.threads = kThreads;
  launch.exact_threads = true;
  launch.attention_rows = true;
  launch.blocks = a.batch * (by_query ? (a.s + tiles.rows - 1) / tiles.rows : (a.skv + tiles.keys - 1) / tiles.keys);
  const auto per_thread = [](int64_t n) { return std::max<int64_t>(1, (n + kThreads - 1) / kThreads); };
  const char* wanted = a.wrt == 0 ? "query" : a.wrt == 1 ? (a.dv_out >= 0 ? "key and value" : "key") : "value";
  std::string out = kAttentionRowsSource;
  out += fmt::format(
      "// tiled attention gradient ({}): {} entries x {} queries x {} keys, d {} dv {}{}; tiles of {} queries x {} "
      "keys, {} floats of shared memory\n",
      wanted, a.batch, a.s, a.skv, a.d, a.dv, a.causal ? ", causal" : "", tiles.rows, tiles.keys, tiles.shared_floats);
  out += fmt::format("extern \"C\" __global__ void __launch_bounds__({}) {}({} mf_bufs, MfAttentionRows mf_rows) {{\n",
                     kThreads, launch.name, bufs_type);
  const bool dk = a.wrt == 1, dv = a.wrt == 2 || a.dv_out >= 0;
  out += fmt::format("  constexpr int R = {}, C = {}, D = {}, DV = {}, KV_ROW = {}, P_ROW = {};\n", tiles.rows,
                     tiles.keys, a.d, a.dv, std::max(a.d, a.dv) + 1, tiles.keys + 1);
  out += fmt::format("  constexpr int NACC = {}, NACC_K = {}, NACC_V = {};\n", per_thread(tiles.rows * a.d),
                     per_thread(tiles.keys * a.d), per_thread(tiles.keys * a.dv));
  out += fmt::format("  constexpr long long S = {}LL, SKV = {}LL;\n", a.s, a.skv);
  out += fmt::format("  constexpr bool CAUSAL = {}, DS = {}, DK = {}, DVG = {};\n", a.causal, a.wrt != 2, dk, dv);
  out += fmt::format("  const float SCALE = {:a}f;\n", static_cast<float>(a.scale));  // exact (hex float)
  for (auto [name, b] : {std::pair{"q", a.q}, {"k", a.k}, {"v", a.v}, {"g", a.g}, {"lse_in", a.lse_in},
                         {"delta", a.delta}})
    out += fmt::format("  const float* __restrict__ {} = {};\n", name, attentionBuffer(b, "const float*"));
  if (by_query) {
    out += fmt::format("  float* __restrict__ out = {};\n", attentionBuffer(a.o, "float*"));
    out += fmt::format("  const auto OUT_STATE = [&](long long i) -> float {{ return {}; }};\n",
                       stateOf(a.o, a.o_rounded, buffers, "out"));
    return out + kShared + expand(kQueryBody) + "}\n\n";
  }
  // wrt = 1: dK into o (and dV into dv_out when asked); wrt = 2: dV into o.
  const int64_t dk_b = dk ? a.o : -1, dk_r = dk ? a.o_rounded : -1;
  const int64_t dv_b = a.wrt == 2 ? a.o : a.dv_out, dv_r = a.wrt == 2 ? a.o_rounded : a.dv_rounded;
  out += fmt::format("  float* __restrict__ dk_out = {};\n  float* __restrict__ dv_out = {};\n",
                     attentionBuffer(dk_b, "float*"), attentionBuffer(dv_b, "float*"));
  out += fmt::format("  const auto DK_STATE = [&](long long i) -> float {{ return {}; }};\n",
                     stateOf(dk_b, dk_r, buffers, "dk_out"));
  out += fmt::format("  const auto DV_STATE = [&](long long i) -> float {{ return {}; }};\n",
                     stateOf(dv_b, dv_r, buffers, "dv_out"));
  return out + kShared + expand(kKeyBody) + "}\n\n";
}

}  // namespace meshfuse::cuda
