// The CUDA C emitter and the GEMM plans, without a GPU: every op's generated program compiles
// with NVRTC for sm_90, and, compiled for the host by cuda_emulation.h and run block by block,
// computes what the reference executor computes, in f32, bf16 and f16. Segments run as the CUDA
// backend runs them: linear/matmul as one planned cuBLASLt call (replayed by a plain GEMM),
// everything else lowered to kernel IR (loop nests -> emitted kernels, GEMM calls -> plans).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>

#include "cuda_emulation.h"
#include "cuda_test_helpers.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/kernel_ir.h"
#include "meshfuse/reference.h"
#include "meshfuse/segment.h"
#include "runtime/cuda/cuda_emitter.h"
#include "runtime/cuda/gemm_plan.h"
#include "runtime/cuda/nvrtc_compiler.h"

namespace meshfuse {
namespace {

using cuda_testing::OpCase;

constexpr int kSmCount = 2;  // small grids: the emulation runs blocks one after another

std::vector<int64_t> staticShape(const TensorView* tv) {
  std::vector<int64_t> s;
  for (const Extent& e : tv->shape()) s.push_back(e.evaluate({}));
  return s;
}

// One segment, as the CUDA backend would run it.
struct Launch {
  bool direct = false;  // a planned cuBLASLt call
  cuda::GemmPlan plan;
  kir::Program program;
  cuda::EmittedProgram emitted;
};

struct Case {
  OpCase op;
  std::unique_ptr<Fusion> def;
  std::vector<Tensor> inputs;
  std::vector<Segment> segments;
  std::vector<Launch> launches;
};

std::vector<Case> lowerAll(DataType dt) {
  std::vector<Case> cases;
  for (const OpCase& c : cuda_testing::opCases()) {
    Case k{c, std::make_unique<Fusion>(), {}, {}, {}};
    k.inputs = cuda_testing::buildCase(c, dt, *k.def);
    k.segments = segmentFusion(*k.def);
    for (size_t i = 0; i < k.segments.size(); ++i) {
      const Segment& seg = k.segments[i];
      Launch l;
      const Expr* first = seg.exprs.front();
      if (seg.kind == Segment::Kind::Gemm && (first->kind() == OpKind::Linear || first->kind() == OpKind::Matmul)) {
        std::vector<std::vector<int64_t>> shapes;
        for (const TensorView* tv : seg.inputs) shapes.push_back(staticShape(tv));
        l.plan = cuda::planGemm(seg, shapes);
        l.direct = l.plan.k > 0;
      }
      if (!l.direct) {
        const std::string prefix = fmt::format("{}_{}_{}", c.name, dtypeName(dt), i);
        l.program = kir::lowerSegment(*k.def, seg, staticShape, prefix);
        l.emitted = cuda::emitCuda(l.program, prefix, kSmCount);
      }
      k.launches.push_back(std::move(l));
    }
    cases.push_back(std::move(k));
  }
  return cases;
}

std::string combinedSource(const std::vector<Case>& cases, bool launchers) {
  std::string src;
  for (const Case& c : cases)
    for (const Launch& l : c.launches) {
      if (l.direct) continue;
      src += l.emitted.source;
      if (!launchers) continue;
      const std::string bufs = "MfBufs_" + l.program.name;
      for (const auto& step : l.emitted.steps)
        for (const cuda::KernelLaunch& k : step) src += cuda_testing::emulationLauncher(k.name, bufs);
    }
  return src;
}

// Runs a case's segments in order on host tensors.
std::vector<Tensor> runEmulated(const Case& c, cuda_testing::EmulatedLibrary& lib) {
  std::map<const TensorView*, Tensor> values;
  for (size_t i = 0; i < c.inputs.size(); ++i) values[c.def->inputs()[i]] = c.inputs[i];
  for (size_t s = 0; s < c.segments.size(); ++s) {
    const Segment& seg = c.segments[s];
    const Launch& l = c.launches[s];
    std::vector<Tensor> outs;
    for (const TensorView* tv : seg.outputs) outs.push_back(Tensor::empty(tv->dtype(), staticShape(tv)));
    std::vector<void*> ptrs;
    for (const TensorView* tv : seg.inputs) ptrs.push_back(values.at(tv).data());
    for (Tensor& t : outs) ptrs.push_back(t.data());
    if (l.direct) {
      cuda_testing::emulateGemm(l.plan, ptrs[l.plan.a_input], ptrs[l.plan.b_input],
                                l.plan.bias_input >= 0 ? ptrs[l.plan.bias_input] : nullptr, ptrs[seg.inputs.size()]);
    } else {
      std::vector<Tensor> temps;
      for (size_t b = ptrs.size(); b < l.program.buffers.size(); ++b) {
        const kir::Buffer& buf = l.program.buffers[b];
        temps.push_back(Tensor(buf.dtype, {buf.numel() * l.emitted.copies[b]}));
        ptrs.push_back(temps.back().data());
      }
      if (ptrs.empty()) ptrs.push_back(nullptr);
      for (size_t i = 0; i < l.program.steps.size(); ++i) {
        // Two warps per block stand for the GPU's eight: every loop strides by blockDim and the
        // block reduction still combines several warps, with 4x fewer host threads.
        for (const cuda::KernelLaunch& k : l.emitted.steps[i]) lib.launch(k.name, ptrs, k.blocks, std::min(k.threads, 64));
        if (l.program.steps[i].kind != kir::Step::GemmCall) continue;
        for (const cuda::KirGemmCall& g : cuda::planKirGemm(l.program.steps[i].gemm)) {
          auto at = [&](int64_t b, int64_t off) { return static_cast<float*>(ptrs[b]) + off; };
          cuda_testing::emulateGemm(g.plan, at(g.plan.a_input, g.a_offset), at(g.plan.b_input, g.b_offset), nullptr,
                                    at(l.program.steps[i].gemm.c.buffer, g.d_offset));
        }
      }
    }
    for (size_t i = 0; i < seg.outputs.size(); ++i) values[seg.outputs[i]] = outs[i];
  }
  std::vector<Tensor> result;
  for (const TensorView* o : c.def->outputs()) result.push_back(values.at(o));
  return result;
}

class CudaEmitter : public ::testing::TestWithParam<DataType> {};

TEST_P(CudaEmitter, EveryOpCompilesForSm90) {
  const std::vector<Case> cases = lowerAll(GetParam());
  const std::string src = combinedSource(cases, false);
  cuda::CompiledCode ptx = cuda::compileCuda(src, "every_op", {90, true, ""});
  for (const Case& c : cases)
    for (const Launch& l : c.launches)
      for (const auto& step : l.emitted.steps)
        for (const cuda::KernelLaunch& k : step)
          EXPECT_NE(ptx.image.find(".entry " + k.name), std::string::npos) << k.name;
}

TEST_P(CudaEmitter, EveryOpMatchesTheReferenceOnTheHost) {
  if (std::system("c++ --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "no host C++ compiler (c++) to emulate with";
  const DataType dt = GetParam();
  std::vector<Case> cases = lowerAll(dt);
  cuda_testing::EmulatedLibrary lib(combinedSource(cases, true));
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op.name + " " + std::string(dtypeName(dt)));
    std::vector<Tensor> want = evaluateReference(*c.def, c.inputs);
    std::vector<Tensor> got = runEmulated(c, lib);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_TRUE(cuda_testing::closeTo(got[i], want[i], nullptr, cuda_testing::toleranceFor(c.op, want[i].dtype())))
          << "output " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaEmitter, ::testing::Values(DataType::Float, DataType::BFloat16, DataType::Half),
                         [](const auto& info) { return std::string(dtypeName(info.param)); });

TEST(CudaEmitterModes, RowsRunOnBlocksAndPointwiseOnThreads) {
  auto emit = [](const std::function<TensorView*(TensorView*)>& build, std::vector<int64_t> shape) {
    Fusion f;
    TensorView* x = f.defineTensor(std::vector<Extent>(shape.begin(), shape.end()), DataType::BFloat16, "x");
    f.addOutput(build(x));
    std::vector<Segment> segs = segmentFusion(f);
    kir::Program p = kir::lowerSegment(f, segs.at(0), staticShape, "t");
    return cuda::emitCuda(p, "t", 132);
  };
  cuda::EmittedProgram softmax = emit([](TensorView* x) { return ops::softmax(x, 1); }, {8192, 4096});
  EXPECT_NE(softmax.source.find("block mode over 8192 outer iteration(s)"), std::string::npos) << softmax.source;
  EXPECT_NE(softmax.source.find("mf_block_reduce(mf_p"), std::string::npos) << softmax.source;
  ASSERT_EQ(softmax.steps.at(0).size(), 1u);
  EXPECT_EQ(softmax.steps[0][0].blocks, 132 * 16);
  cuda::EmittedProgram gelu = emit([](TensorView* x) { return ops::gelu(x, "tanh"); }, {8192, 4096});
  EXPECT_NE(gelu.source.find("thread mode over 33554432 outer iteration(s), 8 per thread (vectorized)"),
            std::string::npos) << gelu.source;
  EXPECT_NE(gelu.source.find("*reinterpret_cast<const uint4*>"), std::string::npos) << gelu.source;
  EXPECT_EQ(gelu.source.substr(gelu.source.find("// step")).find("__syncthreads"), std::string::npos)
      << "a pointwise kernel needs no barrier";
}

}  // namespace
}  // namespace meshfuse
