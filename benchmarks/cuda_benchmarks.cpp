// GPU benchmarks of the CUDA backend, each a ratio against a baseline measured in the same run
// (DESIGN.md "Performance"); scripts/gpu-check runs them and records the JSON.
//
//   bandwidth   device-to-device copy (cudaMemcpyAsync) vs the runtime's vectorized accumulate
//               and a generated pointwise kernel (y = x * sigmoid(x) on bf16), in GB/s counting
//               bytes read and written; goal: generated >= 0.85 x copy
//   gemm        bf16 [t, h] x [4h, h]^T (t = 8192, h = 4096): a direct cuBLASLt call vs the same
//               GEMM through the runtime (backend segment, and the whole executor); goal >= 0.95
//   mlp         the GPT-style MLP block forward (bf16, h = 4096, t = 8192) through the executor,
//               for cuda_mlp_torch.py to compare with PyTorch eager and torch.compile
//   decoder     the pre-norm decoder layer (bf16, batch 2, seq 2048, h = 4096, 32 heads), likewise
//   attention   sdpa forward (bf16, batch 2, 32 heads, head size 128, causal and not) through the
//               executor: the tensor-core kernel vs the scalar one (MESHFUSE_CUDA_ATTENTION=scalar)
//               in TFLOP/s, for cuda_mlp_torch.py to compare with torch's scaled_dot_product_attention;
//               and the gradient kernels (dq; dk + dv) on one launch of whole sequences
//   overhead    host time per launched segment: a chain of tiny GEMMs through the executor,
//               minus their GPU time measured directly
//   overlap     one GPU as one rank of an n-way sequence-parallel MLP (bf16): its allgather and
//               reduce-scatter emulated by device-to-device copies of the bytes a rank receives
//               and sends, on stream 1, beside the GEMMs on the main stream; undecomposed vs
//               chunked (the copy of chunk i + 1 while chunk i computes); the fraction of the
//               copies hidden behind the GEMMs from the CUDA-event trace (summarizeOverlap, as
//               overlap_cpu computes it); goal: hidden >= 0.8 for GEMM-sized chunks
//
//   cuda_benchmarks [--describe] [--json FILE] [--quick] [--only NAME]
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>

#include "meshfuse/executor.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/ops.h"
#include "lower/segment.h"
#include "models.h"
#include "runtime/backend.h"
#include "runtime/cuda.h"

using namespace meshfuse;
using json = nlohmann::json;

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": " + cublasLtGetStatusString(s));
}

// Median seconds of `reps` timed calls of `fn` (after `warmup` calls), each ended by `sync`.
double timeIt(const std::function<void()>& fn, const std::function<void()>& sync, int warmup = 3, int reps = 10) {
  for (int i = 0; i < warmup; ++i) fn();
  sync();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto start = std::chrono::steady_clock::now();
    fn();
    sync();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void deviceSync() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

// A one-device executor for `def` with its inputs resident on the GPU.
struct OnGpu {
  std::unique_ptr<Communicator> self = makeSelfCommunicator();
  std::unique_ptr<MultiDeviceExecutor> exec;
  std::vector<ShardedTensor> inputs;
  OnGpu(const Fusion& def, const std::vector<Tensor>& host_inputs) {
    exec = std::make_unique<MultiDeviceExecutor>(def.clone(), *self, makeCudaBackend());
    for (const Tensor& t : host_inputs)
      inputs.push_back({exec->backend().upload(t), DeviceMesh({0}), {Placement::replicate()}});
  }
  void run() { exec->run(inputs); }
};

json bandwidth(int64_t bytes) {
  json r;
  std::unique_ptr<Backend> b = makeCudaBackend();
  const int64_t n = bytes / 2;  // bf16 elements
  Tensor x = b->allocate(DataType::BFloat16, {n}), y = b->allocate(DataType::BFloat16, {n});
  check(cudaMemset(x.data(), 0, x.nbytes()), "cudaMemset");
  check(cudaMemset(y.data(), 0, y.nbytes()), "cudaMemset");
  const double moved = 2.0 * static_cast<double>(x.nbytes());  // read + write
  double copy_s = timeIt(
      [&] {
        check(cudaMemcpyAsync(y.data(), x.data(), x.nbytes(), cudaMemcpyDeviceToDevice, nullptr), "cudaMemcpyAsync");
      },
      deviceSync);
  r["copy_GBps"] = moved / copy_s / 1e9;
  // accumulate reads two and writes one operand.
  double acc_s = timeIt([&] { b->accumulate(y, x); }, [&] { b->streams().synchronize(); });
  r["accumulate_GBps"] = 1.5 * moved / acc_s / 1e9;
  r["accumulate_vs_copy"] = (1.5 * moved / acc_s) / (moved / copy_s);
  Fusion f;
  TensorView* in = f.defineTensor({n}, DataType::BFloat16, "x");
  f.addOutput(ops::mul(in, ops::sigmoid(in)));
  try {
    OnGpu g(f, {Tensor(DataType::BFloat16, {n})});
    double s = timeIt([&] { g.run(); }, deviceSync);
    r["generated_pointwise_GBps"] = moved / s / 1e9;
    r["generated_vs_copy"] = copy_s / s;
  } catch (const UserError& e) {
    r["generated_pointwise"] = std::string("not run: ") + e.message();
  }
  return r;
}

// The direct cuBLASLt call the runtime is measured against: the same problem (transposed
// column-major, see src/codegen/cuda/gemm_plan.h), f32 accumulation, heuristic's first choice.
struct DirectGemm {
  cublasLtHandle_t h = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulAlgo_t algo{};
  void* ws = nullptr;
  size_t ws_size = size_t{32} << 20;
  DirectGemm(int64_t m, int64_t n, int64_t k) {  // D[m x n] = W^T (k x m) ... as linear: m = features
    check(cublasLtCreate(&h), "cublasLtCreate");
    check(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
    cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)), "transa");
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof(nn)), "transb");
    check(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, k, m, k), "layout a");
    check(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, n, k), "layout b");
    check(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, m, n, m), "layout d");
    check(cudaMalloc(&ws, ws_size), "cudaMalloc");
    cublasLtMatmulPreference_t pref = nullptr;
    check(cublasLtMatmulPreferenceCreate(&pref), "pref");
    uint64_t wsb = ws_size;
    check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)),
          "ws");
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    check(cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, ld, ld, pref, 1, &res, &found), "heuristic");
    if (found == 0) throw std::runtime_error("no cuBLASLt algorithm");
    algo = res.algo;
    cublasLtMatmulPreferenceDestroy(pref);
  }
  void run(const void* w, const void* x, void* y) {
    float alpha = 1, beta = 0;
    check(cublasLtMatmul(h, op, &alpha, w, la, x, lb, &beta, y, ld, y, ld, &algo, ws, ws_size, nullptr), "matmul");
  }
  ~DirectGemm() {
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(h);
    cudaFree(ws);
  }
};

json gemm(int64_t t, int64_t h) {
  json r;
  const int64_t m = 4 * h, k = h;  // up projection: [t, h] x [4h, h]^T
  Fusion f;
  TensorView* x = f.defineTensor({t, k}, DataType::BFloat16, "x");
  TensorView* w = f.defineTensor({m, k}, DataType::BFloat16, "w");
  f.addOutput(ops::linear(x, w));
  OnGpu g(f, {Tensor::random(DataType::BFloat16, {t, k}, 1), Tensor::random(DataType::BFloat16, {m, k}, 2)});
  Tensor y = g.exec->backend().allocate(DataType::BFloat16, {t, m});
  DirectGemm direct(m, t, k);
  const double flops = 2.0 * t * m * k;
  double direct_s =
      timeIt([&] { direct.run(g.inputs[1].local.data(), g.inputs[0].local.data(), y.data()); }, deviceSync);
  double exec_s = timeIt([&] { g.run(); }, deviceSync);
  Segment seg;
  seg.kind = Segment::Kind::Gemm;
  seg.exprs = {f.outputs()[0]->definition()};
  seg.inputs = {x, w};
  seg.outputs = {f.outputs()[0]};
  Backend& b = g.exec->backend();
  std::vector<const Tensor*> ins = {&g.inputs[0].local, &g.inputs[1].local};
  std::vector<Tensor*> outs = {&y};
  double seg_s = timeIt(
      [&] {
        b.streams().submit(0, TaskKind::Compute, "gemm", [&] {
          b.runSegment(seg, ins, outs, [](const TensorView*) { return std::vector<int64_t>{}; });
        });
      },
      [&] { b.streams().synchronize(); });
  r["shape"] = fmt::format("bf16 [{}, {}] x [{}, {}]^T", t, k, m, k);
  r["direct_TFLOPs"] = flops / direct_s / 1e12;
  r["segment_TFLOPs"] = flops / seg_s / 1e12;
  r["executor_TFLOPs"] = flops / exec_s / 1e12;
  r["segment_vs_direct"] = direct_s / seg_s;
  r["executor_vs_direct"] = direct_s / exec_s;
  return r;
}

json mlp(int64_t t, int64_t h) {
  json r;
  // models::buildMlp's block (without the residual), in bf16.
  auto bf = std::make_unique<Fusion>();
  TensorView* x = bf->defineTensor({t, h}, DataType::BFloat16, "inp");
  TensorView* up = bf->defineTensor({4 * h, h}, DataType::BFloat16, "up_w");
  TensorView* down = bf->defineTensor({h, 4 * h}, DataType::BFloat16, "down_w");
  bf->addOutput(ops::linear(ops::gelu(ops::linear(x, up), "tanh"), down));
  r["block"] = "linear(gelu_tanh(linear(x[t,h], up[4h,h])), down[h,4h]), bf16";
  r["t"] = t;
  r["h"] = h;
  try {
    OnGpu g(*bf, {Tensor::random(DataType::BFloat16, {t, h}, 1), Tensor::random(DataType::BFloat16, {4 * h, h}, 2),
                  Tensor::random(DataType::BFloat16, {h, 4 * h}, 3)});
    double s = timeIt([&] { g.run(); }, deviceSync);
    r["meshfuse_ms"] = s * 1e3;
  } catch (const UserError& e) {
    r["meshfuse"] = std::string("not run: ") + e.message();
  }
  return r;
}

// The pre-norm decoder layer of models.h (causal attention, GELU MLP), bf16, through the
// executor: for cuda_mlp_torch.py to compare with PyTorch eager and torch.compile.
json decoder(int64_t batch, int64_t seq, int64_t h, int64_t heads) {
  json r;
  Fusion f;
  models::buildDecoderLayer(f, {.batch = batch, .seq = seq, .hidden = h, .heads = heads, .dtype = DataType::BFloat16});
  r["block"] = "models::buildDecoderLayer, bf16";
  r["batch"] = batch;
  r["seq"] = seq;
  r["h"] = h;
  r["heads"] = heads;
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < f.inputs().size(); ++i)
    inputs.push_back(Tensor::random(DataType::BFloat16, f.inputs()[i]->evaluateShape({}), 10 + i));
  try {
    OnGpu g(f, inputs);
    double s = timeIt([&] { g.run(); }, deviceSync);
    r["meshfuse_ms"] = s * 1e3;
  } catch (const UserError& e) {
    r["meshfuse"] = std::string("not run: ") + e.message();
  }
  return r;
}

// ---- attention ------------------------------------------------------------------------------

// Multiply-adds of q k^T and p v, times 2 (halved for causal), as FlashAttention counts them.
double attentionFlops(int64_t batch, int64_t heads, int64_t s, int64_t d, bool causal) {
  return 4.0 * batch * heads * s * s * d / (causal ? 2 : 1);
}

// sdpa(q, k, v) forward, bf16, through the executor: ms and TFLOP/s.
json attentionForward(int64_t batch, int64_t heads, int64_t s, int64_t d, bool causal) {
  Fusion f;
  std::vector<TensorView*> in;
  for (const char* n : {"q", "k", "v"}) in.push_back(f.defineTensor({batch, heads, s, d}, DataType::BFloat16, n));
  f.addOutput(ops::sdpa(in[0], in[1], in[2], causal));
  std::vector<Tensor> inputs;
  for (int i = 0; i < 3; ++i) inputs.push_back(Tensor::random(DataType::BFloat16, {batch, heads, s, d}, 20 + i));
  OnGpu g(f, inputs);
  const double secs = timeIt([&] { g.run(); }, deviceSync);
  return {{"ms", secs * 1e3}, {"TFLOPs", attentionFlops(batch, heads, s, d, causal) / secs / 1e12}};
}

// The gradient kernels (cuda_attention_grad.cpp) on one launch over whole sequences, as ring
// attention's backward launches them per step: dq, then dk and dv from one kernel.
json attentionGradient(int64_t batch, int64_t heads, int64_t s, int64_t d, bool causal) {
  Fusion f;
  std::vector<TensorView*> in;
  for (const char* n : {"q", "k", "v", "g"}) in.push_back(f.defineTensor({batch, heads, s, d}, DataType::BFloat16, n));
  TensorView* lse = f.defineTensor({batch, heads, s}, DataType::Float, "lse");
  TensorView* delta = f.defineTensor({batch, heads, s}, DataType::Float, "delta");
  TensorView* dq = ops::sdpaGrad(in[0], in[1], in[2], in[3], "query", causal, std::nullopt, lse, delta);
  TensorView* dk = ops::sdpaGrad(in[0], in[1], in[2], in[3], "key", causal, std::nullopt, lse, delta);
  TensorView* dv = ops::sdpaGrad(in[0], in[1], in[2], in[3], "value", causal, std::nullopt, lse, delta);
  std::unique_ptr<Backend> b = makeCudaBackend();
  std::vector<Tensor> values;
  for (int i = 0; i < 4; ++i) values.push_back(b->upload(Tensor::random(DataType::BFloat16, {batch, heads, s, d}, 30 + i)));
  // A log-sum-exp of log(s) and delta 0 keep P and dS finite (the values do not change the work).
  Tensor lse_host = Tensor::empty(DataType::Float, {batch, heads, s});
  Tensor delta_host = Tensor::empty(DataType::Float, {batch, heads, s});
  for (int64_t i = 0; i < lse_host.numel(); ++i) lse_host.set(i, std::log(static_cast<double>(s))), delta_host.set(i, 0);
  values.push_back(b->upload(lse_host));
  values.push_back(b->upload(delta_host));
  std::vector<const Tensor*> ins;
  for (const Tensor& t : values) ins.push_back(&t);
  const AttentionLaunch whole{{{0, s}}, {{0, s}}, false};
  auto shape = [](const TensorView* tv) { return tv->evaluateShape({}); };
  json r;
  for (auto [name, outs] : {std::pair<const char*, std::vector<TensorView*>>{"dq", {dq}}, {"dk_dv", {dk, dv}}}) {
    Segment seg{Segment::Kind::Gemm, {}, {in[0], in[1], in[2], in[3], lse, delta}, {}};
    std::vector<Tensor> out;
    std::vector<Tensor*> out_ptrs;
    for (TensorView* o : outs) {
      seg.exprs.push_back(o->definition());
      seg.outputs.push_back(o);
      out.push_back(b->allocate(DataType::BFloat16, {batch, heads, s, d}));
    }
    for (Tensor& t : out) out_ptrs.push_back(&t);
    const double secs = timeIt([&] { b->runAttentionStep(seg, ins, out_ptrs, shape, whole); },
                               [&] { b->streams().synchronize(); });
    // dq: q k^T, g v^T, dS k (3 products); dk + dv: those two plus dS^T q and P^T g (4).
    const double flops = attentionFlops(batch, heads, s, d, causal) / 2 * (outs.size() == 1 ? 3 : 4);
    r[name] = {{"ms", secs * 1e3}, {"TFLOPs", flops / secs / 1e12}};
  }
  return r;
}

json attention(int64_t batch, int64_t heads, int64_t s, int64_t d) {
  json r = {{"batch", batch}, {"heads", heads}, {"seq", s}, {"head_size", d}, {"dtype", "bf16"}};
  for (bool causal : {true, false}) {
    json& c = r[causal ? "causal" : "full"];
    c["tensor_cores"] = attentionForward(batch, heads, s, d, causal);
    ::setenv("MESHFUSE_CUDA_ATTENTION", "scalar", 1);  // read when the backend emits the kernel
    c["scalar"] = attentionForward(batch, heads, s, d, causal);
    ::unsetenv("MESHFUSE_CUDA_ATTENTION");
    c["tensor_cores_vs_scalar"] = c["scalar"]["ms"].get<double>() / c["tensor_cores"]["ms"].get<double>();
    c["gradient"] = attentionGradient(batch, heads, s, d, causal);
  }
  return r;
}

json overhead() {
  json r;
  constexpr int kSegments = 64;
  Fusion f;
  TensorView* x = f.defineTensor({8, 64}, DataType::BFloat16, "x");
  TensorView* w = f.defineTensor({64, 64}, DataType::BFloat16, "w");
  TensorView* y = x;
  for (int i = 0; i < kSegments; ++i) y = ops::linear(y, w);
  f.addOutput(y);
  OnGpu g(f, {Tensor::random(DataType::BFloat16, {8, 64}, 1), Tensor::random(DataType::BFloat16, {64, 64}, 2)});
  double run_s = timeIt([&] { g.run(); }, deviceSync, 5, 50);
  DirectGemm direct(64, 8, 64);
  Tensor out = g.exec->backend().allocate(DataType::BFloat16, {8, 64});
  double gpu_s = timeIt(
      [&] {
        for (int i = 0; i < kSegments; ++i) direct.run(g.inputs[1].local.data(), g.inputs[0].local.data(), out.data());
      },
      deviceSync, 5, 50);
  r["segments"] = kSegments;
  r["run_us_per_segment"] = run_s / kSegments * 1e6;
  r["direct_us_per_gemm"] = gpu_s / kSegments * 1e6;
  r["host_overhead_us_per_segment"] = (run_s - gpu_s) / kSegments * 1e6;
  return r;
}

// ---- overlap -------------------------------------------------------------------------------

// A GEMM segment `y = linear(x, w)` for x [rows, k] and w [m, k], launched by the backend.
struct LinearSegment {
  Fusion f;
  Segment seg;
  LinearSegment(int64_t rows, int64_t k, int64_t m) {
    TensorView* x = f.defineTensor({rows, k}, DataType::BFloat16, "x");
    TensorView* w = f.defineTensor({m, k}, DataType::BFloat16, "w");
    f.addOutput(ops::linear(x, w));
    seg.kind = Segment::Kind::Gemm;
    seg.exprs = {f.outputs()[0]->definition()};
    seg.inputs = {x, w};
    seg.outputs = {f.outputs()[0]};
  }
  void run(Backend& b, const Tensor& x, const Tensor& w, Tensor& y) const {
    std::vector<const Tensor*> ins = {&x, &w};
    std::vector<Tensor*> outs = {&y};
    b.runSegment(seg, ins, outs, [&](const TensorView* tv) {
      return tv == seg.inputs[0] ? x.shape() : tv == seg.inputs[1] ? w.shape() : y.shape();
    });
  }
};

// One rank of an n-way sequence-parallel MLP on t tokens, hidden h: gather the other ranks'
// tokens (x), up = x w1^T, down = up w2^T (a partial sum), reduce-scatter it. The collectives are
// copies of the bytes a rank receives (allgather) and sends (reduce-scatter): (n - 1)/n of the
// buffer. With s chunks, chunk i's copy overlaps the GEMMs of the chunk before it.
struct SequenceParallelRank {
  Backend& b;
  int64_t t, h, n, s;
  Tensor others, x, w1, up, w2, down, sent;
  LinearSegment gemm1, gemm2;
  SequenceParallelRank(Backend& backend, int64_t t_, int64_t h_, int64_t n_, int64_t s_)
      : b(backend), t(t_), h(h_), n(n_), s(s_), gemm1(t_ / s_, h_, 4 * h_ / n_), gemm2(t_ / s_, 4 * h_ / n_, h_) {
    others = b.allocate(DataType::BFloat16, {t, h});
    x = b.allocate(DataType::BFloat16, {t, h});
    w1 = b.upload(Tensor::random(DataType::BFloat16, {4 * h / n, h}, 1));
    up = b.allocate(DataType::BFloat16, {t, 4 * h / n});
    w2 = b.upload(Tensor::random(DataType::BFloat16, {h, 4 * h / n}, 2));
    down = b.allocate(DataType::BFloat16, {t, h});
    sent = b.allocate(DataType::BFloat16, {t, h});
    check(cudaMemset(others.data(), 0, others.nbytes()), "cudaMemset");
  }
  // The (n - 1)/n of chunk i's rows a rank exchanges, as a copy from `from` to `to`.
  void exchange(Tensor from, Tensor to, int64_t i) {
    const int64_t rows = t / s, moved = rows * (n - 1) / n;
    Tensor src = from.slice0(i * rows, moved), dst = to.slice0(i * rows, moved);
    b.copy(dst, src);
  }
  void run() {
    Streams& st = b.streams();
    const int64_t rows = t / s;
    std::shared_ptr<Event> start = st.record(0);
    st.wait(1, start);
    std::vector<std::shared_ptr<Event>> gathered, computed;
    for (int64_t i = 0; i < s; ++i) {
      st.submit(1, TaskKind::Communication, "allgather (copy)", [this, i] { exchange(others, x, i); });
      gathered.push_back(st.record(1));
    }
    for (int64_t i = 0; i < s; ++i) {
      st.wait(0, gathered[i]);
      st.submit(0, TaskKind::Compute, "gemm up", [this, i, rows] {
        Tensor out = up.slice0(i * rows, rows);
        gemm1.run(b, x.slice0(i * rows, rows), w1, out);
      });
      st.submit(0, TaskKind::Compute, "gemm down", [this, i, rows] {
        Tensor out = down.slice0(i * rows, rows);
        gemm2.run(b, up.slice0(i * rows, rows), w2, out);
      });
      computed.push_back(st.record(0));
    }
    for (int64_t i = 0; i < s; ++i) {
      st.wait(1, computed[i]);
      st.submit(1, TaskKind::Communication, "reduce-scatter (copy)", [this, i] { exchange(down, sent, i); });
    }
    st.wait(0, st.record(1));
    st.synchronize();
  }
};

json overlap(int64_t t, int64_t h, int64_t n, const std::vector<int64_t>& chunk_counts) {
  json r;
  std::unique_ptr<Backend> b = makeCudaBackend();
  r["model"] = fmt::format(
      "one rank of a {}-way sequence-parallel MLP, bf16, t = {}, h = {}: GEMMs [{}, {}] x [{}, {}]^T "
      "and [{}, {}] x [{}, {}]^T; allgather / reduce-scatter emulated by device-to-device copies "
      "of (n - 1)/n of [{}, {}] on stream 1",
      n, t, h, t, h, 4 * h / n, h, t, 4 * h / n, h, 4 * h / n, t, h);
  double undecomposed_s = 0;
  for (int64_t s : chunk_counts) {
    SequenceParallelRank rank(*b, t, h, n, s);
    double sec = timeIt([&] { rank.run(); }, [] {});
    b->streams().setTracing(true);  // one traced run, warm
    rank.run();
    OverlapSummary sum = summarizeOverlap(b->streams().takeTrace());
    b->streams().setTracing(false);
    if (s == 1) undecomposed_s = sec;
    json v;
    v["chunks"] = s;
    v["ms"] = sec * 1e3;
    v["vs_undecomposed"] = undecomposed_s > 0 ? sec / undecomposed_s : 0.0;
    v["compute_ms"] = sum.compute_us / 1e3;
    v["communication_ms"] = sum.communication_us / 1e3;
    v["hidden_fraction"] = sum.hiddenFraction();
    v["goal_hidden_0.8_met"] = s > 1 ? json(sum.hiddenFraction() >= 0.8) : json(nullptr);
    r["variants"].push_back(v);
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path, only;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--describe") {
      std::cout << cudaDeviceDescription() << "\n";
      return cudaDeviceAvailable() ? 0 : 1;
    }
    if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    if (a == "--only" && i + 1 < argc) only = argv[++i];
    if (a == "--quick") quick = true;
  }
  const std::vector<std::string> names = {"bandwidth", "gemm", "mlp", "decoder", "attention", "overhead", "overlap"};
  if (!only.empty() && std::find(names.begin(), names.end(), only) == names.end()) {
    std::cerr << fmt::format("--only {}: expected one of {}\n", only, fmt::join(names, ", "));
    return 2;
  }
  if (!cudaDeviceAvailable()) {  // (a build without a GPU: say so, measure nothing)
    std::cerr << cudaDeviceDescription() << "\n";
    return 1;
  }
  auto wanted = [&](const char* name) { return only.empty() || only == name; };
  json out;
  out["device"] = cudaDeviceDescription();
  try {
    if (wanted("bandwidth")) out["bandwidth"] = bandwidth(quick ? (64 << 20) : (int64_t{1} << 30));
    if (wanted("gemm")) out["gemm"] = quick ? gemm(1024, 512) : gemm(8192, 4096);
    if (wanted("mlp")) out["mlp"] = quick ? mlp(1024, 512) : mlp(8192, 4096);
    if (wanted("decoder")) out["decoder"] = quick ? decoder(1, 256, 512, 8) : decoder(2, 2048, 4096, 32);
    if (wanted("attention")) out["attention"] = quick ? attention(1, 4, 256, 64) : attention(2, 32, 2048, 128);
    if (wanted("overhead")) out["overhead"] = overhead();
    // GEMM-sized chunks: 8 ranks' worth of tokens, 4 chunks of 2048 rows.
    if (wanted("overlap"))
      out["overlap"] = quick ? overlap(1024, 512, 8, {1, 2, 4}) : overlap(8192, 4096, 8, {1, 2, 4, 8});
  } catch (const std::exception& e) {
    out["error"] = e.what();
    std::cout << out.dump(2) << "\n";
    return 1;
  }
  std::cout << out.dump(2) << "\n";
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  return 0;
}
