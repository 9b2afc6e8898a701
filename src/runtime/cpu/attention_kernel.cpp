// The CPU's tiled attention with an online softmax.
//
// For every (batch entry, tile of query rows): running row maxima m and sums l (f32) and an
// unnormalized f32 output tile acc start at -inf, 0, 0 (a ring step that continues an earlier
// online softmax starts from lse, 1 and the running output instead); then for every tile of keys
// the rows attend (causal: only tiles starting at or before the tile's last row, so tiles above the
// diagonal are skipped whole):
//   S = scale Q_t K_t^T              (cblas_sgemm, 64 x 128 x d)
//   mask keys j > i (causal, only in tiles crossing the diagonal)
//   m' = max(m, rowmax S);  P = exp(S - m');  l = l exp(m - m') + rowsum P;  acc *= exp(m - m')
//   acc += P V_t                     (cblas_sgemm, 64 x dv x 128, beta = 1)
// and finally o = acc / l and lse = m + log l. The scores of one tile pair are all that exists
// of the [s, skv] matrix at any time. Positions are global ones where a ring step's launch says
// where its query and key rows lie (AttentionLaunch): the mask and the skipping compare those.
#include "runtime/cpu/attention_kernel.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "meshfuse/error.h"

namespace meshfuse::cpu {
namespace {

// The exp and row-sum loops are the only non-BLAS work per score, so they must vectorize: O3 and
// no-trapping-math let GCC if-convert and vectorize them (this file is built -O2 like the rest),
// and an AVX2 clone is picked at load time where the CPU has it (the build targets baseline x86-64).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("O3", "no-trapping-math")
#endif
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MF_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define MF_VECTOR_CLONES
#endif

MF_VECTOR_CLONES void expShifted(float* __restrict x, int64_t n, float shift) {
  for (int64_t i = 0; i < n; ++i) {
    float y = x[i] - shift;
    y = y > 88.0f ? 88.0f : y;  // (written so that NaN stays NaN)
    // n = round(y / ln 2) by the 1.5 * 2^23 trick (its low mantissa bits are then n as an integer).
    const float t = y * 1.44269504f + 12582912.0f;
    const float nf = t - 12582912.0f;
    int32_t ti;
    std::memcpy(&ti, &t, 4);
    const int32_t ni = ti - 0x4B400000;
    // r = y - n ln 2 in two parts (the first exact in f32), |r| <= ln(2) / 2.
    const float r = (y - nf * 0.693359375f) - nf * -2.12194440e-4f;
    float p = 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t bits = (ni + 127) << 23;  // 2^n; n >= -126 wherever it is used
    float two_n;
    std::memcpy(&two_n, &bits, 4);
    x[i] = y < -87.0f ? 0.0f : p * two_n;
  }
}

// The sum of x[0..n) in 8 interleaved partial sums (a fixed order: deterministic, and vectorizable
// without reassociation).
MF_VECTOR_CLONES float sum8(const float* __restrict x, int64_t n) {
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) part[j] += x[i + j];
  float s = 0;
  for (; i < n; ++i) s += x[i];
  for (int j = 0; j < 8; ++j) s += part[j];
  return s;
}

MF_VECTOR_CLONES void scaleRow(float* __restrict x, int64_t n, float by) {
  for (int64_t i = 0; i < n; ++i) x[i] *= by;
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

// The per-thread tile memory, grown to the largest need and reused.
struct TileScratch {
  std::vector<float> scores, acc, max, sum;
};

// One score row's online-softmax update: `row` (cols scores) becomes P, `m` and `l` the running
// maximum and sum; returns the factor the row's previous output must be scaled by.
float updateRow(float* row, int64_t cols, float& m, float& l) {
  float row_max = -INFINITY;
  for (int64_t j = 0; j < cols; ++j) row_max = row[j] > row_max ? row[j] : row_max;
  const float m_new = std::max(m, row_max);
  if (m_new == -INFINITY) {  // every key so far masked: nothing attended yet
    std::fill(row, row + cols, 0.0f);
    return 1.0f;
  }
  expShifted(row, cols, m_new);
  const float alpha = std::exp(m - m_new);  // 0 on the first attended tile (m = -inf)
  l = l * alpha + sum8(row, cols);
  m = m_new;
  return alpha;
}

// Where a query tile starts its online softmax: afresh, or (a ring step that accumulates) from
// the running output and log-sum-exp its outputs hold, as the state (m = lse, l = 1, acc = o).
struct TileStart {
  bool accumulate = false;
  const void* o_state = nullptr;  // [s, dv] of this batch entry: f32, or 16-bit (`state_dtype`)
  DataType state_dtype = DataType::Float;
};

void startTile(const TileStart& start, const float* lse, int64_t q0, int64_t rows, int64_t dv, TileScratch& t) {
  if (!start.accumulate) {
    std::fill(t.acc.begin(), t.acc.begin() + rows * dv, 0.0f);
    std::fill(t.max.begin(), t.max.begin() + rows, -INFINITY);
    std::fill(t.sum.begin(), t.sum.begin() + rows, 0.0f);
    return;
  }
  for (int64_t i = 0; i < rows; ++i) {
    t.max[i] = lse[q0 + i];
    t.sum[i] = 1.0f;
  }
  if (start.o_state == nullptr) return;  // a log-sum-exp alone (the ring of a backward's sdpa_lse)
  const int64_t first = q0 * dv, n = rows * dv;
  if (start.state_dtype == DataType::Float) {
    std::memcpy(t.acc.data(), static_cast<const float*>(start.o_state) + first, n * sizeof(float));
    return;
  }
  const auto* bits = static_cast<const uint16_t*>(start.o_state) + first;
  for (int64_t i = 0; i < n; ++i)
    t.acc[i] = start.state_dtype == DataType::BFloat16 ? bf16BitsToFloat(bits[i]) : halfBitsToFloat(bits[i]);
}

// Local rows [q0, q0 + rows) of one batch entry (q, k, v, o, lse already offset to that entry),
// at global positions from `g0`, against the key blocks.
void attendQueryTile(const kir::Attention& a, const float* q, const float* k, const float* v, float* o, float* lse,
                     int64_t q0, int64_t rows, int64_t g0, const std::vector<RowBlock>& keys, const TileStart& start,
                     bool ring, TileScratch& t) {
  const int64_t dv = a.dv;
  startTile(start, lse, q0, rows, dv, t);
  for (const RowBlock& kb : keys) {
    // Causal: keys after the tile's last row are masked for every row; a block past it is skipped.
    const int64_t key_end = a.causal ? std::min(kb.count, g0 + rows - kb.global) : kb.count;
    for (int64_t k0 = 0; k0 < key_end; k0 += kAttentionKeyTile) {
      const int64_t cols = std::min(kAttentionKeyTile, key_end - k0);
      const int64_t first_key = kb.global + k0;  // the tile's first key, as a global position
      float* s = t.scores.data();
      if (a.d > 0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(rows), static_cast<blasint>(cols),
                    static_cast<blasint>(a.d), static_cast<float>(a.scale), q + q0 * a.d, static_cast<blasint>(a.d),
                    k + (kb.local + k0) * a.d, static_cast<blasint>(a.d), 0.0f, s, static_cast<blasint>(cols));
      } else {
        std::fill(s, s + rows * cols, 0.0f);
      }
      for (int64_t i = 0; i < rows; ++i) {
        float* row = s + i * cols;
        if (a.causal)  // keys after position g0 + i; nothing to do in tiles below the diagonal
          for (int64_t j = std::max<int64_t>(g0 + i + 1 - first_key, 0); j < cols; ++j) row[j] = -INFINITY;
        const float alpha = updateRow(row, cols, t.max[i], t.sum[i]);
        if (alpha != 1.0f && dv > 0) scaleRow(t.acc.data() + i * dv, dv, alpha);
      }
      if (dv > 0)  // 0: only the log-sum-exp is asked for
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<blasint>(rows), static_cast<blasint>(dv),
                    static_cast<blasint>(cols), 1.0f, s, static_cast<blasint>(cols), v + (kb.local + k0) * dv,
                    static_cast<blasint>(dv), 1.0f, t.acc.data(), static_cast<blasint>(dv));
    }
  }
  for (int64_t i = 0; i < rows; ++i) {
    // Every row of a whole sequence attends at least key 0 (skv > 0; causal rows see j <= i), so
    // l > 0 unless the scores overflowed to NaN, which then propagates as in the reference. A ring
    // step's rows may attend none of its keys: output 0 and log-sum-exp -inf until one does.
    const bool none = ring && t.sum[i] == 0.0f;
    if (o != nullptr) {
      const float inv = none ? 0.0f : 1.0f / t.sum[i];
      for (int64_t c = 0; c < dv; ++c) o[(q0 + i) * dv + c] = t.acc[i * dv + c] * inv;
    }
    if (lse != nullptr) lse[q0 + i] = none ? -INFINITY : t.max[i] + std::log(t.sum[i]);
  }
}

}  // namespace

std::vector<RowBlock> rowBlocks(const std::vector<AttentionLaunch::Rows>* launch, int64_t rows, const char* what) {
  if (launch == nullptr || launch->empty()) return {{0, 0, rows}};
  std::vector<RowBlock> out;
  int64_t local = 0;
  for (const AttentionLaunch::Rows& r : *launch) {
    out.push_back({local, r.start, r.count});
    local += r.count;
  }
  MF_CHECK(local == rows, "an attention step's {} blocks cover {} rows of {}", what, local, rows);
  return out;
}

void expShiftedInPlace(float* x, int64_t n, float shift) { expShifted(x, n, shift); }

void runAttention(const kir::Attention& a, void* const* buffers, const AttentionLaunch* launch,
                  DataType rounded_dtype) {
  MF_CHECK(a.skv > 0 && a.dv >= 0 && a.d >= 0, "an attention step over {} keys", a.skv);
  const bool accumulate = launch != nullptr && launch->accumulate;
  MF_CHECK(!accumulate || (a.lse >= 0 && (a.o >= 0 || a.dv == 0)),
           "an attention step that continues an online softmax needs its log-sum-exp and output");
  auto in = [&](int64_t b) { return static_cast<const float*>(buffers[b]); };
  auto out = [&](int64_t b) { return b < 0 ? nullptr : static_cast<float*>(buffers[b]); };
  static thread_local TileScratch t;
  const size_t q_tile = static_cast<size_t>(kAttentionQueryTile);
  t.scores.resize(std::max(t.scores.size(), q_tile * kAttentionKeyTile));
  t.acc.resize(std::max(t.acc.size(), q_tile * static_cast<size_t>(a.dv)));
  t.max.resize(std::max(t.max.size(), q_tile));
  t.sum.resize(std::max(t.sum.size(), q_tile));
  const std::vector<RowBlock> queries = rowBlocks(launch ? &launch->query : nullptr, a.s, "query");
  const std::vector<RowBlock> keys = rowBlocks(launch ? &launch->key : nullptr, a.skv, "key");
  for (int64_t b = 0; b < a.batch; ++b) {
    const float* q = in(a.q) + b * a.s * a.d;
    const float* k = in(a.k) + b * a.skv * a.d;
    float* o = a.o < 0 ? nullptr : out(a.o) + b * a.s * a.dv;  // dv = 0 without o
    const float* v = a.v < 0 ? nullptr : in(a.v) + b * a.skv * a.dv;
    float* lse = a.lse < 0 ? nullptr : out(a.lse) + b * a.s;
    TileStart start{accumulate, o, DataType::Float};
    if (accumulate && a.o_rounded >= 0)  // the running output is in the 16-bit output buffer
      start = {true, static_cast<const std::byte*>(buffers[a.o_rounded]) + b * a.s * a.dv * 2, rounded_dtype};
    for (const RowBlock& qb : queries)
      for (int64_t q0 = 0; q0 < qb.count; q0 += kAttentionQueryTile)
        attendQueryTile(a, q, k, v, o, lse, qb.local + q0, std::min(kAttentionQueryTile, qb.count - q0),
                        qb.global + q0, keys, start, launch != nullptr, t);
  }
}

}  // namespace meshfuse::cpu
