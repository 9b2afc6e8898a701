// The CPU's tiled attention gradient (a kir::Attention step with wrt >= 0): FlashAttention's
// backward, one tile pair of scores at a time.
//
// The forward's log-sum-exp (lse) and delta = rowsum(g o) make every tile pair independent of
// the others: P = exp(scale Q_t K_t^T - lse) is the exact probability block (no running
// statistics), dS = P (G_t V_t^T - delta) scale, and each gradient is a sum of per-pair terms:
//   dV_t += P^T G_t     dQ_t += dS K_t     dK_t += dS^T Q_t          (cblas_sgemm, f32)
// That additivity is what lets ring attention's backward add a step's terms into what the
// outputs hold (AttentionLaunch::accumulate) as blocks of q or of k and v rotate. Positions are
// global ones where a launch says where its rows lie: the causal mask and the skipping of pairs
// with nothing to attend compare those, as in the forward kernel.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "meshfuse/error.h"
#include "runtime/cpu/attention_kernel.h"

namespace meshfuse::cpu {
namespace {

struct GradScratch {
  std::vector<float> p, ds;
};

// One batch entry's pointers (already offset to it); dv also the value's gradient beside the
// key's (kir::Attention::dv_out), else nullptr.
struct Entry {
  const float *q, *k, *v, *g, *lse, *delta;
  float* out;
  float* dv;
};

// The terms of query tile [q0, q0 + rows) (global position g0) and key tile [k0, k0 + cols)
// (global position h0) of one batch entry, added into e.out.
void tilePair(const kir::Attention& a, const Entry& e, int64_t q0, int64_t rows, int64_t g0, int64_t k0, int64_t cols,
              int64_t h0, GradScratch& t) {
  float* p = t.p.data();
  const auto d = static_cast<blasint>(a.d), dv = static_cast<blasint>(a.dv);
  const auto m = static_cast<blasint>(rows), n = static_cast<blasint>(cols);
  if (a.d > 0) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, d, static_cast<float>(a.scale), e.q + q0 * a.d, d,
                e.k + k0 * a.d, d, 0.0f, p, n);
  } else {
    std::fill(p, p + rows * cols, 0.0f);
  }
  for (int64_t i = 0; i < rows; ++i) {
    float* row = p + i * cols;
    if (a.causal)
      for (int64_t j = std::max<int64_t>(g0 + i + 1 - h0, 0); j < cols; ++j) row[j] = -INFINITY;
    const float lse = e.lse[q0 + i];
    if (lse == -INFINITY) {  // a row that attends no key at all (none in the whole sequence)
      std::fill(row, row + cols, 0.0f);
      continue;
    }
    expShiftedInPlace(row, cols, lse);
  }
  if (float* dv_out = a.wrt == 2 ? e.out : e.dv; dv_out != nullptr && a.dv > 0)  // dV_t += P^T G_t
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, dv, m, 1.0f, p, n, e.g + q0 * a.dv, dv, 1.0f,
                dv_out + k0 * a.dv, dv);
  if (a.wrt == 2) return;
  float* ds = t.ds.data();  // dP = G_t V_t^T, then dS = P (dP - delta) scale
  if (a.dv > 0) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, dv, 1.0f, e.g + q0 * a.dv, dv, e.v + k0 * a.dv, dv, 0.0f,
                ds, n);
  } else {
    std::fill(ds, ds + rows * cols, 0.0f);
  }
  const auto scale = static_cast<float>(a.scale);
  for (int64_t i = 0; i < rows; ++i) {
    const float delta = e.delta[q0 + i];
    for (int64_t j = 0; j < cols; ++j) ds[i * cols + j] = p[i * cols + j] * (ds[i * cols + j] - delta) * scale;
  }
  if (a.d == 0) return;
  if (a.wrt == 0)  // dQ_t += dS K_t
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, d, n, 1.0f, ds, n, e.k + k0 * a.d, d, 1.0f,
                e.out + q0 * a.d, d);
  else  // dK_t += dS^T Q_t
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, d, m, 1.0f, ds, n, e.q + q0 * a.d, d, 1.0f,
                e.out + k0 * a.d, d);
}

// Where the gradient starts: 0, or (a ring step that accumulates) what the output holds: f32, or
// the 16-bit output o_rounded that the f32 result is rounded into.
void startOutput(float* out, int64_t n, const void* rounded, bool accumulate, DataType rounded_dtype) {
  if (!accumulate) {
    std::fill(out, out + n, 0.0f);
  } else if (rounded != nullptr) {
    const auto* bits = static_cast<const uint16_t*>(rounded);
    for (int64_t i = 0; i < n; ++i)
      out[i] = rounded_dtype == DataType::BFloat16 ? bf16BitsToFloat(bits[i]) : halfBitsToFloat(bits[i]);
  }
}

}  // namespace

void runAttentionGrad(const kir::Attention& a, void* const* buffers, const AttentionLaunch* launch,
                      DataType rounded_dtype) {
  MF_CHECK(a.wrt >= 0 && a.wrt <= 2 && a.o >= 0 && a.g >= 0 && a.lse_in >= 0 && a.delta >= 0,
           "an attention gradient step without its operands");
  const bool accumulate = launch != nullptr && launch->accumulate;
  const int64_t out_rows = a.wrt == 0 ? a.s : a.skv, out_width = a.wrt == 2 ? a.dv : a.d;
  auto rounded = [&](int64_t b) { return b < 0 ? nullptr : static_cast<const void*>(buffers[b]); };
  startOutput(static_cast<float*>(buffers[a.o]), a.batch * out_rows * out_width, rounded(a.o_rounded), accumulate,
              rounded_dtype);
  if (a.dv_out >= 0)
    startOutput(static_cast<float*>(buffers[a.dv_out]), a.batch * a.skv * a.dv, rounded(a.dv_rounded), accumulate,
                rounded_dtype);
  if (a.s == 0 || a.skv == 0) return;
  static thread_local GradScratch t;
  const size_t tile = static_cast<size_t>(kAttentionQueryTile) * kAttentionKeyTile;
  t.p.resize(std::max(t.p.size(), tile));
  t.ds.resize(std::max(t.ds.size(), tile));
  const std::vector<RowBlock> queries = rowBlocks(launch ? &launch->query : nullptr, a.s, "query");
  const std::vector<RowBlock> keys = rowBlocks(launch ? &launch->key : nullptr, a.skv, "key");
  auto in = [&](int64_t b) { return static_cast<const float*>(buffers[b]); };
  for (int64_t b = 0; b < a.batch; ++b) {
    const Entry e{in(a.q) + b * a.s * a.d,
                  in(a.k) + b * a.skv * a.d,
                  in(a.v) + b * a.skv * a.dv,
                  in(a.g) + b * a.s * a.dv,
                  in(a.lse_in) + b * a.s,
                  in(a.delta) + b * a.s,
                  static_cast<float*>(buffers[a.o]) + b * out_rows * out_width,
                  a.dv_out < 0 ? nullptr : static_cast<float*>(buffers[a.dv_out]) + b * a.skv * a.dv};
    for (const RowBlock& qb : queries)
      for (int64_t q0 = 0; q0 < qb.count; q0 += kAttentionQueryTile) {
        const int64_t rows = std::min(kAttentionQueryTile, qb.count - q0), g0 = qb.global + q0;
        for (const RowBlock& kb : keys) {
          // Causal: keys after the tile's last row attend nothing; a block past it is skipped.
          const int64_t key_end = a.causal ? std::min(kb.count, g0 + rows - kb.global) : kb.count;
          for (int64_t k0 = 0; k0 < key_end; k0 += kAttentionKeyTile)
            tilePair(a, e, qb.local + q0, rows, g0, kb.local + k0, std::min(kAttentionKeyTile, key_end - k0),
                     kb.global + k0, t);
        }
      }
  }
}

}  // namespace meshfuse::cpu
