// The CUDA attention kernels on blocks of rows at global positions (what ring attention's steps
// and a causal attention on this rank's query rows launch), without a GPU: the emitted kernels,
// run on the host by cuda_emulation.h with the launch's positions as their argument, against the
// CPU backend's kernels given the same launches (those are checked against the reference executor
// by attention_grad_kernel_test and the ring tests). Forward (attention output and log-sum-exp,
// continuing the online softmax across steps) and the gradients (dq; dk and dv as one kernel; dv
// alone), causal or not, f32 and bf16 (the running state read back from the 16-bit output), with
// a rank's load-balanced layout: query rows in two chunks, i and 2n - 1 - i. NVRTC compiles the
// same kernels for sm_90 without spills.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <iostream>
#include <memory>

#include "codegen/cuda/cuda_attention.h"
#include "codegen/kernel_lower.h"
#include "cuda_emulation.h"
#include "cuda_test_helpers.h"
#include "lower/segment.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ops.h"
#include "runtime/backend.h"
#include "runtime/cuda.h"
#include "runtime/cuda/nvrtc_compiler.h"

namespace meshfuse {
namespace {

struct Case {
  int64_t heads, s, d, dv;
  bool causal = false;
  DataType dtype = DataType::Float;
};

std::string name(const Case& c) {
  return fmt::format("h{} s{} d{} dv{} {}{}", c.heads, c.s, c.d, c.dv, dtypeName(c.dtype), c.causal ? " causal" : "");
}

// Rows of a [1, h, s, e] (or [1, h, s]) tensor, the blocks' rows one after another.
Tensor rowsOf(const Tensor& t, const std::vector<AttentionLaunch::Rows>& blocks) {
  std::vector<int64_t> shape = t.shape();
  const int64_t s = shape[2], inner = shape.size() > 3 ? shape[3] : 1;
  int64_t count = 0;
  for (const AttentionLaunch::Rows& b : blocks) count += b.count;
  shape[2] = count;
  Tensor out = Tensor::empty(t.dtype(), shape);
  for (int64_t h = 0; h < shape[1]; ++h) {
    int64_t r = 0;
    for (const AttentionLaunch::Rows& b : blocks)
      for (int64_t i = 0; i < b.count; ++i, ++r)
        for (int64_t e = 0; e < inner; ++e) out.set((h * count + r) * inner + e, t.get((h * s + b.start + i) * inner + e));
  }
  return out;
}

// The attention, its lse and delta, and its gradients, on one device: the operands of the steps.
struct Problem {
  Fusion f;
  TensorView *q, *k, *v, *g, *o, *lse, *delta, *dq, *dk, *dv;
  std::vector<Tensor> values;  // q, k, v, g, then lse and delta (reference)

  // `values`: draw the operands and evaluate the reference (tests that only compile skip it).
  explicit Problem(const Case& c, bool with_values = true) {
    q = f.defineTensor({1, c.heads, c.s, c.d}, c.dtype, "q");
    k = f.defineTensor({1, c.heads, c.s, c.d}, c.dtype, "k");
    v = f.defineTensor({1, c.heads, c.s, c.dv}, c.dtype, "v");
    g = f.defineTensor({1, c.heads, c.s, c.dv}, c.dtype, "g");
    o = ops::sdpa(q, k, v, c.causal);
    lse = ops::sdpaLse(q, k, c.causal);
    delta = ops::sum(ops::mul(ops::cast(o, DataType::Float), ops::cast(g, DataType::Float)), {3});
    dq = ops::sdpaGrad(q, k, v, g, "query", c.causal, std::nullopt, lse, delta);
    dk = ops::sdpaGrad(q, k, v, g, "key", c.causal, std::nullopt, lse, delta);
    dv = ops::sdpaGrad(q, k, v, g, "value", c.causal, std::nullopt, lse, delta);
    for (TensorView* t : {lse, delta}) f.addOutput(t);
    if (!with_values) return;
    for (TensorView* t : {q, k, v, g}) values.push_back(Tensor::random(c.dtype, t->evaluateShape({}), 17 + values.size()));
    for (Tensor& t : evaluateReference(f, values)) values.push_back(std::move(t));
  }
};

// One ring of launches of segment `exprs` (with `inputs` of `p`): per step, the query and key
// blocks of this rank; the operands of the rotating side are sliced to the step's blocks.
struct Ring {
  std::vector<const Expr*> exprs;
  std::vector<const TensorView*> inputs;
  std::vector<std::vector<AttentionLaunch::Rows>> query, key;  // per step
};

// `ring` on the CPU backend and on the emulated CUDA kernels, outputs persisting across the steps
// (each after the first continues them). Emitted first (source(), kernel names prefixed by
// `prefix`), so that one host library compiles the kernels of many rings; then run().
class RingRun {
 public:
  RingRun(const Problem& p, Ring ring, const std::string& prefix)
      : p_(p), ring_(std::move(ring)), seg_{Segment::Kind::Gemm, ring_.exprs, ring_.inputs, {}}, prefix_(prefix) {
    for (const Expr* e : ring_.exprs) {
      seg_.outputs.push_back(e->output());
      std::vector<int64_t> shape = e->output()->evaluateShape({});
      if (shape.size() > 2)
        shape[2] = rows(e->kind() != OpKind::SdpaGrad || e->attr<std::string>("wrt") == "query" ? ring_.query[0]
                                                                                                 : ring_.key[0]);
      out_shapes_.push_back(shape);
    }
    for (const Tensor& t : operands(0)) in_shapes_.push_back(t.shape());
    program_ = kir::lowerSegment(p.f, seg_, shapeFn(), "gemm #0");
    emitted_ = cuda::emitCuda(program_, prefix_, 132);
  }

  std::string source() const {
    std::string src = emitted_.source;
    for (const auto& step : emitted_.steps)
      for (const cuda::KernelLaunch& l : step)
        src += cuda_testing::emulationLauncher(l.name, "MfBufs_" + prefix_, l.attention_rows);
    return src;
  }

  // The outputs of the ring's steps on `backend` (runAttentionStep; operands uploaded to its memory).
  std::vector<Tensor> runOn(Backend& backend) const {
    std::vector<Tensor> out;
    for (size_t i = 0; i < out_shapes_.size(); ++i)
      out.push_back(backend.allocate(seg_.outputs[i]->dtype(), out_shapes_[i]));
    std::vector<std::vector<Tensor>> operands_of(ring_.query.size());  // alive until the downloads
    for (size_t step = 0; step < ring_.query.size(); ++step) {
      std::vector<Tensor>& in = operands_of[step];
      for (const Tensor& t : operands(step)) in.push_back(backend.upload(t));
      std::vector<const Tensor*> ins;
      std::vector<Tensor*> outs;
      for (const Tensor& t : in) ins.push_back(&t);
      for (Tensor& t : out) outs.push_back(&t);
      backend.runAttentionStep(seg_, ins, outs, shapeFn(), AttentionLaunch{ring_.query[step], ring_.key[step], step > 0});
    }
    for (Tensor& t : out) t = backend.download(t);
    return out;
  }

  // The outputs of the emulated CUDA kernels (`lib` compiled from source()).
  std::vector<Tensor> runEmulated(cuda_testing::EmulatedLibrary& lib) const {
    std::vector<Tensor> out;
    for (size_t i = 0; i < out_shapes_.size(); ++i) out.push_back(Tensor::empty(seg_.outputs[i]->dtype(), out_shapes_[i]));
    for (size_t step = 0; step < ring_.query.size(); ++step) {
      std::vector<Tensor> in = operands(step);
      std::vector<void*> ptrs;
      for (const Tensor& t : in) ptrs.push_back(const_cast<void*>(t.data()));
      for (Tensor& t : out) ptrs.push_back(t.data());
      cuda::AttentionRowsArg arg;
      for (const AttentionLaunch::Rows& r : ring_.query[step]) arg.query.add(r.start, r.count, "query");
      for (const AttentionLaunch::Rows& r : ring_.key[step]) arg.key.add(r.start, r.count, "key");
      arg.accumulate = step > 0;
      cuda_testing::EmulatedFusion::runProgram(lib, program_, emitted_, ptrs, 128, &arg);
    }
    return out;
  }

  const Ring& ring() const { return ring_; }

 private:
  static int64_t rows(const std::vector<AttentionLaunch::Rows>& blocks) {
    int64_t n = 0;
    for (const AttentionLaunch::Rows& r : blocks) n += r.count;
    return n;
  }

  // The step's operands: the query side's rows at the step's query blocks, the key side's at its key blocks.
  std::vector<Tensor> operands(size_t step) const {
    const std::vector<const TensorView*> query_side = {p_.q, p_.g, p_.lse, p_.delta};
    const std::vector<const TensorView*> all = {p_.q, p_.k, p_.v, p_.g, p_.lse, p_.delta};  // p_.values' order
    std::vector<Tensor> in;
    for (const TensorView* tv : ring_.inputs) {
      const Tensor& whole = p_.values[std::find(all.begin(), all.end(), tv) - all.begin()];
      const bool query = std::find(query_side.begin(), query_side.end(), tv) != query_side.end();
      in.push_back(rowsOf(whole, query ? ring_.query[step] : ring_.key[step]));
    }
    return in;
  }

  ShapeFn shapeFn() const {
    return [this](const TensorView* tv) -> std::vector<int64_t> {
      for (size_t i = 0; i < seg_.inputs.size(); ++i)
        if (seg_.inputs[i] == tv) return in_shapes_[i];
      for (size_t i = 0; i < seg_.outputs.size(); ++i)
        if (seg_.outputs[i] == tv) return out_shapes_[i];
      return tv->evaluateShape({});
    };
  }

  const Problem& p_;
  Ring ring_;
  Segment seg_;
  std::string prefix_;
  std::vector<std::vector<int64_t>> in_shapes_, out_shapes_;
  kir::Program program_;
  cuda::EmittedProgram emitted_;
};

// Emits every ring, compiles their kernels as one host library, runs each and compares the CUDA
// kernels' outputs with the CPU's.
void expectRingsMatchTheCpu(const Problem& p, const std::vector<Ring>& rings, const std::string& prefix) {
  std::vector<RingRun> runs;
  std::string source;
  for (const Ring& ring : rings) {
    runs.emplace_back(p, ring, fmt::format("{}_{}", prefix, runs.size()));
    source += runs.back().source();
  }
  cuda_testing::EmulatedLibrary lib(source);
  std::unique_ptr<Backend> backend = makeCpuBackend();
  for (const RingRun& run : runs) {
    SCOPED_TRACE(run.ring().exprs[0]->output()->name());
    std::vector<Tensor> cpu = run.runOn(*backend), gpu = run.runEmulated(lib);
    for (size_t i = 0; i < cpu.size(); ++i) EXPECT_TRUE(cuda_testing::closeTo(gpu[i], cpu[i], nullptr)) << "output " << i;
  }
}

// Rank 0 of 2 with the load-balanced layout: 4 chunks of s/4; its query rows are chunks 0 and 3;
// the key side it holds at step 0 is the same, at step 1 rank 1's chunks 1 and 2.
std::vector<std::vector<AttentionLaunch::Rows>> own(int64_t c) { return {{{0, c}, {3 * c, c}}, {{0, c}, {3 * c, c}}}; }
std::vector<std::vector<AttentionLaunch::Rows>> rotating(int64_t c) { return {{{0, c}, {3 * c, c}}, {{c, c}, {2 * c, c}}}; }

// The forward's ring (output and log-sum-exp), dq's, the one of dk and dv, and dv's alone.
std::vector<Ring> balancedRings(const Problem& p, int64_t chunk) {
  const std::vector<const TensorView*> all = {p.q, p.k, p.v, p.g, p.lse, p.delta};
  return {{{p.o->definition(), p.lse->definition()}, {p.q, p.k, p.v}, own(chunk), rotating(chunk)},
          {{p.dq->definition()}, all, own(chunk), rotating(chunk)},
          {{p.dk->definition(), p.dv->definition()}, all, rotating(chunk), own(chunk)},
          {{p.dv->definition()}, all, rotating(chunk), own(chunk)}};
}

class CudaAttentionSteps : public ::testing::TestWithParam<std::tuple<DataType, bool>> {};

TEST_P(CudaAttentionSteps, MatchTheCpuKernelsOnBalancedRingSteps) {
  const auto [dt, causal] = GetParam();
  for (Case c : {Case{1, 8, 4, 4}, Case{2, 40, 8, 6}, Case{1, 132, 16, 16}, Case{1, 64, 64, 64}}) {
    c.causal = causal, c.dtype = dt;
    SCOPED_TRACE(name(c));
    Problem p(c);
    expectRingsMatchTheCpu(p, balancedRings(p, c.s / 4), fmt::format("c{}", c.s));
  }
}

INSTANTIATE_TEST_SUITE_P(DtypesAndMasks, CudaAttentionSteps,
                         ::testing::Combine(::testing::Values(DataType::Float, DataType::BFloat16), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(dtypeName(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_causal" : "_full");
                         });

// A row that attends no key of a step keeps its state (first step: output 0, log-sum-exp -inf),
// as the CPU kernel's: a causal query block before every key of the launch.
TEST(CudaAttentionSteps, RowsThatAttendNothingYet) {
  Problem p(Case{1, 16, 4, 4, true, DataType::Float});
  expectRingsMatchTheCpu(
      p, {{{p.o->definition(), p.lse->definition()}, {p.q, p.k, p.v}, {{{0, 8}}, {{0, 8}}}, {{{8, 8}}, {{0, 8}}}}},
      "early");
}

// On a GPU: the CUDA backend's runAttentionStep (the compiled kernels, positions as arguments)
// against the CPU backend's, at sizes across several tiles. Skipped without a GPU (scripts/gpu-check
// runs it).
TEST(CudaAttentionSteps, OnTheDeviceMatchTheCpuKernels) {
  if (!cudaDeviceAvailable()) GTEST_SKIP() << cudaDeviceDescription() << " -- run on a GPU machine (scripts/gpu-check)";
  std::unique_ptr<Backend> gpu = makeCudaBackend(), cpu = makeCpuBackend();
  for (DataType dt : {DataType::Float, DataType::BFloat16})
    for (bool causal : {false, true})
      for (Case c : {Case{2, 40, 8, 6}, Case{4, 512, 64, 64}, Case{2, 264, 128, 128}}) {
        c.causal = causal, c.dtype = dt;
        SCOPED_TRACE(name(c));
        Problem p(c);
        for (const Ring& ring : balancedRings(p, c.s / 4)) {
          SCOPED_TRACE(ring.exprs[0]->output()->name());
          RingRun run(p, ring, "device");
          std::vector<Tensor> want = run.runOn(*cpu), got = run.runOn(*gpu);
          for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(cuda_testing::closeTo(got[i], want[i], nullptr)) << "output " << i;
        }
      }
}

// The gradient kernels compile for sm_90 (NVRTC and ptxas) without spills or a stack frame.
TEST(CudaAttentionSteps, GradientKernelsCompileWithoutSpills) {
  for (Case c : {Case{8, 1024, 64, 64, true, DataType::BFloat16}, Case{8, 512, 128, 128, false, DataType::Float}}) {
    SCOPED_TRACE(name(c));
    Problem p(c);
    std::string source;
    std::vector<std::string> kernels;
    int id = 0;
    for (std::vector<const Expr*> exprs : std::vector<std::vector<const Expr*>>{
             {p.dq->definition()}, {p.dk->definition(), p.dv->definition()}, {p.dv->definition()}}) {
      Segment seg{Segment::Kind::Gemm, exprs, {p.q, p.k, p.v, p.g, p.lse, p.delta}, {}};
      for (const Expr* e : exprs) seg.outputs.push_back(e->output());
      kir::Program program = kir::lowerSegment(
          p.f, seg, [](const TensorView* tv) { return tv->evaluateShape({}); }, "gemm #0");
      cuda::EmittedProgram e = cuda::emitCuda(program, fmt::format("g{}", id++), 132);
      source += e.source;
      for (const auto& step : e.steps)
        for (const cuda::KernelLaunch& l : step) kernels.push_back(l.name);
    }
    cuda::CompiledCode code = cuda::compileCuda(source, "grad", {90, false, "", /*resource_usage=*/true});
    ASSERT_FALSE(code.image.empty());
    std::map<std::string, cuda::KernelResources> by_name;
    for (const cuda::KernelResources& r : code.resources) by_name[r.name] = r;
    for (const std::string& k : kernels) {
      ASSERT_TRUE(by_name.count(k)) << k << ": ptxas reported nothing; log:\n" << code.log.substr(0, 3000);
      const cuda::KernelResources& r = by_name[k];
      EXPECT_EQ(r.stack_frame_bytes + r.spill_store_bytes + r.spill_load_bytes, 0)
          << k << ": " << r.registers << " registers, stack " << r.stack_frame_bytes << ", spills "
          << r.spill_store_bytes << "/" << r.spill_load_bytes;
    }
  }
}

// The tensor-core kernel's output `got` against the scalar kernel's `want`: a 16-bit output within
// eps(dtype) (|want| + max |want|), the f32 log-sum-exp within 1e-5 (1 + |want|); the first few
// elements that are not, reported.
void expectAgreesWithTheScalarKernel(const Tensor& got, const Tensor& want, size_t output) {
  const double eps = want.dtype() == DataType::BFloat16 ? 0x1p-7 : want.dtype() == DataType::Half ? 0x1p-10 : 0;
  double max_abs = 0;
  for (int64_t e = 0; e < want.numel(); ++e)
    if (std::isfinite(want.get(e))) max_abs = std::max(max_abs, std::abs(want.get(e)));
  int bad = 0;
  for (int64_t e = 0; e < want.numel(); ++e) {
    const double a = got.get(e), b = want.get(e);
    const double allowed = eps > 0 ? eps * (std::abs(b) + max_abs) : 1e-5 * (1 + std::abs(b));
    if (!(std::abs(a - b) <= allowed) && !(std::isinf(a) && a == b) && bad++ < 3)
      ADD_FAILURE() << "output " << output << " element " << e << ": tensor cores " << a << ", scalar " << b;
  }
}

// The tensor-core forward kernel (16-bit operands: cuda_attention_mma.cpp) against the scalar one
// (MESHFUSE_CUDA_ATTENTION=scalar), both emulated on the same ring's two steps (the second
// continues the first's online softmax from the 16-bit output, so a rounding that differs by one
// unit in the last place carries into the second): within eps(dtype) (|want| + max |want|) of the
// output (16 times tighter than the comparisons with the CPU) and 1e-5 of the log-sum-exp. Head
// sizes that pad to the mma's 16 (4, 6, 24), that float4 loads do not divide (6, 5: element by
// element), several tiles of 64 rows with a partial one (132), heads above 128 (smaller key
// tiles), and the log-sum-exp alone.
TEST(CudaAttentionSteps, TensorCoreKernelMatchesTheScalarOne) {
  for (DataType dt : {DataType::BFloat16, DataType::Half})
    for (bool causal : {false, true}) {
      // Every case's kernels, both kinds, in one host library (one host compile per dtype and mask).
      std::vector<std::unique_ptr<Problem>> problems;
      std::vector<RingRun> runs;  // tensor cores, scalar, tensor cores, ...
      std::vector<std::string> traces;
      std::string source;
      for (Case c : {Case{1, 8, 4, 4}, Case{2, 40, 8, 6}, Case{1, 24, 6, 5}, Case{1, 132, 64, 64}, Case{1, 72, 136, 24}}) {
        c.causal = causal, c.dtype = dt;
        problems.push_back(std::make_unique<Problem>(c));
        const Problem& p = *problems.back();
        const int64_t chunk = c.s / 4;
        for (const Ring& ring : {balancedRings(p, chunk)[0], Ring{{p.lse->definition()}, {p.q, p.k}, own(chunk), rotating(chunk)}}) {
          traces.push_back(name(c) + (ring.exprs.size() == 2 ? ", output and lse" : ", lse alone"));
          runs.emplace_back(p, ring, fmt::format("m{}", runs.size()));
          ::setenv("MESHFUSE_CUDA_ATTENTION", "scalar", 1);
          runs.emplace_back(p, ring, fmt::format("s{}", runs.size()));
          ::unsetenv("MESHFUSE_CUDA_ATTENTION");
          ASSERT_NE(runs[runs.size() - 2].source().find("mma.sync"), std::string::npos) << traces.back();
          ASSERT_EQ(runs.back().source().find("mma.sync"), std::string::npos) << traces.back();
          source += runs[runs.size() - 2].source() + runs.back().source();
        }
      }
      cuda_testing::EmulatedLibrary lib(source);
      for (size_t r = 0; r < runs.size(); r += 2) {
        SCOPED_TRACE(traces[r / 2]);
        std::vector<Tensor> got = runs[r].runEmulated(lib), want = runs[r + 1].runEmulated(lib);
        for (size_t i = 0; i < want.size(); ++i) expectAgreesWithTheScalarKernel(got[i], want[i], i);
      }
    }
}

// The forward kernels on tensor cores compile for sm_90 (NVRTC and ptxas: the inline mma.sync)
// without spills or a stack frame, at the largest head sizes they take.
TEST(CudaAttentionSteps, TensorCoreKernelsCompileWithoutSpills) {
  // Without the log-sum-exp (as a decoder layer asks) and with it (ring steps): the f16 kernel at
  // head size 128 without it is the one ptxas once spilled.
  for (auto [c, with_lse] : {std::pair{Case{8, 1024, 64, 64, true, DataType::BFloat16}, true},
                             {Case{8, 2048, 128, 128, true, DataType::BFloat16}, false},
                             {Case{8, 2048, 128, 128, true, DataType::Half}, false},
                             {Case{8, 512, 128, 128, true, DataType::Half}, true},
                             {Case{4, 256, 256, 256, false, DataType::Half}, true}}) {
    SCOPED_TRACE(name(c) + (with_lse ? " with lse" : ""));
    Problem p(c, /*with_values=*/false);
    Segment seg{Segment::Kind::Gemm, {p.o->definition()}, {p.q, p.k, p.v}, {p.o}};
    if (with_lse) seg.exprs.push_back(p.lse->definition()), seg.outputs.push_back(p.lse);
    kir::Program program = kir::lowerSegment(
        p.f, seg, [](const TensorView* tv) { return tv->evaluateShape({}); }, "gemm #0");
    cuda::EmittedProgram e = cuda::emitCuda(program, "f", 132, 90);
    ASSERT_NE(e.source.find("mma.sync"), std::string::npos);
    cuda::CompiledCode code = cuda::compileCuda(e.source, "forward", {90, false, "", /*resource_usage=*/true});
    ASSERT_FALSE(code.image.empty());
    std::string kernel;  // the attention step's (the others widen q, k, v and round o)
    for (size_t i = 0; i < program.steps.size(); ++i)
      if (program.steps[i].kind == kir::Step::AttentionCall) kernel = e.steps[i].at(0).name;
    ASSERT_NE(e.source.find("__global__ void __launch_bounds__(128, 2) " + kernel), std::string::npos);
    auto it = std::find_if(code.resources.begin(), code.resources.end(),
                           [&](const cuda::KernelResources& r) { return r.name == kernel; });
    ASSERT_NE(it, code.resources.end()) << kernel << ": ptxas reported nothing; log:\n" << code.log.substr(0, 3000);
    const cuda::KernelResources& r = *it;
    std::cout << r.name << ": " << r.registers << " registers\n";
    EXPECT_EQ(r.stack_frame_bytes + r.spill_store_bytes + r.spill_load_bytes, 0)
        << r.name << ": " << r.registers << " registers, stack " << r.stack_frame_bytes << ", spills "
        << r.spill_store_bytes << "/" << r.spill_load_bytes;
    // An older GPU (sm_75) gets the scalar kernel.
    EXPECT_EQ(cuda::emitCuda(program, "f", 40, 75).source.find("mma.sync"), std::string::npos);
  }
}

}  // namespace
}  // namespace meshfuse
