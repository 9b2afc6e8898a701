// The CUDA C emitter and the GEMM plans, without a GPU: the generated kernels, compiled for the
// host by cuda_emulation.h and run block by block with CUDA's execution model, compute what the
// reference executor computes (within reference.h's tolerance), for every op in f32, bf16 and
// f16, the examples, decoder layers and random op chains, at an H100's launch geometry and at a
// small GPU's. Segments run as the CUDA backend runs them: linear/matmul as one planned cuBLASLt
// call (replayed by a plain GEMM), everything else lowered to kernel IR (loop nests -> emitted
// kernels, GEMM calls -> plans). (NVRTC compiles the same kernels: cuda_kernel_resources_test.)
#include "codegen/cuda/cuda_emitter.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>

#include "codegen/kernel_ir.h"
#include "codegen/kernel_lower.h"
#include "cuda_emulation.h"
#include "cuda_test_helpers.h"
#include "lower/segment.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/ops.h"
#include "meshfuse/reference.h"
#include "models.h"
#include "random_chains.h"
#include "test_helpers.h"

namespace meshfuse {
namespace {

using cuda_testing::EmulatedFusion;
using cuda_testing::Geometry;

struct FusionCase {
  std::string name;
  std::unique_ptr<Fusion> def;
  SymbolBindings sizes;
  std::vector<Tensor> inputs;
};

// Every case emitted for `g`, all kernels in one host library, each run and compared with the
// reference executor.
void expectEmulationMatchesReference(const std::vector<FusionCase>& cases, const Geometry& g) {
  SCOPED_TRACE(std::string("geometry ") + g.name);
  std::vector<std::unique_ptr<EmulatedFusion>> emulated;
  std::string source;
  for (size_t i = 0; i < cases.size(); ++i) {
    emulated.push_back(std::make_unique<EmulatedFusion>(*cases[i].def, cases[i].sizes, fmt::format("c{}", i), g.sm_count));
    source += emulated.back()->source(/*launchers=*/true);
  }
  cuda_testing::EmulatedLibrary lib(source);
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].name);
    std::vector<Tensor> want = evaluateReference(*cases[i].def, cases[i].inputs);
    std::vector<Tensor> got = emulated[i]->run(lib, cases[i].inputs, g.max_threads);
    ASSERT_EQ(got.size(), want.size());
    for (size_t o = 0; o < got.size(); ++o)
      EXPECT_TRUE(cuda_testing::closeTo(got[o], want[o], nullptr)) << "output " << o;
  }
}

std::vector<FusionCase> opCases(DataType dt) {
  std::vector<FusionCase> out;
  for (const cuda_testing::OpCase& c : cuda_testing::opCases()) {
    FusionCase k{c.name + " " + std::string(dtypeName(dt)), std::make_unique<Fusion>(), {}, {}};
    k.inputs = cuda_testing::buildCase(c, dt, *k.def);
    out.push_back(std::move(k));
  }
  return out;
}

const Geometry kGeometries[] = {cuda_testing::kH100, cuda_testing::kSmallGpu};

class CudaEmitter : public ::testing::TestWithParam<std::tuple<DataType, Geometry>> {};

TEST_P(CudaEmitter, EveryOpMatchesTheReferenceOnTheHost) {
  auto [dt, g] = GetParam();
  expectEmulationMatchesReference(opCases(dt), g);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaEmitter,
                         ::testing::Combine(::testing::Values(DataType::Float, DataType::BFloat16, DataType::Half),
                                            ::testing::ValuesIn(kGeometries)),
                         [](const auto& info) {
                           return std::string(dtypeName(std::get<0>(info.param))) + "_" + std::get<1>(info.param).name;
                         });

// ---- real fusions ------------------------------------------------------------------------

// The examples' definitions as one device runs them (their meshes and placements play no part in
// what a single device computes), with their symbolic sizes bound to 32.
std::vector<FusionCase> exampleCases() {
  std::vector<FusionCase> out;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(std::string(MESHFUSE_SOURCE_DIR) + "/examples"))
    if (e.path().extension() == ".mf") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& path : files) {
    std::ifstream in(path);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    FusionCase k{path.filename().string(), parseFusion(text, path.string()), {}, {}};
    for (const TensorView* tv : k.def->inputs())
      for (const Extent& e : tv->shape())
        if (!e.isStatic()) k.sizes[e.symbol()] = 32;
    for (size_t i = 0; i < k.def->inputs().size(); ++i)
      k.inputs.push_back(Tensor::random(k.def->inputs()[i]->dtype(), k.def->inputs()[i]->evaluateShape(k.sizes), 7 + i));
    out.push_back(std::move(k));
  }
  return out;
}

std::vector<FusionCase> decoderCases() {
  std::vector<FusionCase> out;
  for (DataType dt : {DataType::Float, DataType::BFloat16, DataType::Half}) {
    FusionCase k{fmt::format("decoder layer {}", dtypeName(dt)), std::make_unique<Fusion>(), {}, {}};
    models::buildDecoderLayer(*k.def, {.batch = 2, .seq = 16, .hidden = 64, .heads = 4, .dtype = dt});
    for (size_t i = 0; i < k.def->inputs().size(); ++i)
      k.inputs.push_back(Tensor::random(dt, k.def->inputs()[i]->evaluateShape({}), 21 + i));
    out.push_back(std::move(k));
  }
  FusionCase mlp{"mlp block f32", std::make_unique<Fusion>(), {{"s0", 48}}, {}};
  models::buildMlp(*mlp.def, 64, /*residual=*/true);
  for (size_t i = 0; i < mlp.def->inputs().size(); ++i)
    mlp.inputs.push_back(Tensor::random(DataType::Float, mlp.def->inputs()[i]->evaluateShape(mlp.sizes), 31 + i));
  out.push_back(std::move(mlp));
  return out;
}

// Chains of the CPU backend's differential test (kernel_differential_test.cpp): the segmenter
// fuses them into multi-op kernels with reductions over every axis, normalizations and layout
// changes.
std::vector<FusionCase> chainCases(DataType dt, uint64_t first, uint64_t count) {
  std::vector<FusionCase> out;
  for (uint64_t seed = first; seed < first + count; ++seed) {
    FusionCase k{fmt::format("chain {} ({})", seed, dtypeName(dt)), std::make_unique<Fusion>(), {}, {}};
    k.inputs = testing_helpers::ChainBuilder(*k.def, dt, seed).build();
    out.push_back(std::move(k));
  }
  return out;
}

// The tiled attention kernel (cuda_attention.cpp) with its log-sum-exp output beside the attention
// output, causal and not, f32 and bf16, at sequence lengths around and across its tiles (64 x 64
// at head size 32; 32 x 32 at head size 128, the decoder layer's), more keys than queries and
// fewer.
std::vector<FusionCase> attentionCases() {
  std::vector<FusionCase> out;
  struct Size {
    int64_t s, skv, d, dv;
  };
  for (DataType dt : {DataType::Float, DataType::BFloat16})
    for (bool causal : {false, true})
      for (Size z : {Size{1, 1, 32, 24}, Size{31, 31, 32, 24}, Size{64, 64, 32, 24}, Size{130, 130, 32, 24},
                     Size{45, 130, 32, 24}, Size{130, 45, 32, 24}, Size{70, 70, 128, 128}}) {
        FusionCase k{fmt::format("sdpa {} {} s {} skv {} d {} dv {}", dtypeName(dt), causal ? "causal" : "full", z.s,
                                 z.skv, z.d, z.dv),
                     std::make_unique<Fusion>(), {}, {}};
        TensorView* q = k.def->defineTensor({1, 2, z.s, z.d}, dt, "q");
        TensorView* kk = k.def->defineTensor({1, 2, z.skv, z.d}, dt, "k");
        TensorView* v = k.def->defineTensor({1, 2, z.skv, z.dv}, dt, "v");
        k.def->addOutput(ops::sdpa(q, kk, v, causal));
        k.def->addOutput(ops::sdpaLse(q, kk, causal));
        for (size_t i = 0; i < k.def->inputs().size(); ++i)
          k.inputs.push_back(Tensor::random(dt, k.def->inputs()[i]->evaluateShape({}), 41 + i));
        out.push_back(std::move(k));
      }
  return out;
}

class CudaEmitterFusions : public ::testing::TestWithParam<Geometry> {};

TEST_P(CudaEmitterFusions, TiledAttentionMatchesTheReferenceOnTheHost) {
  std::vector<FusionCase> cases = attentionCases();
  expectEmulationMatchesReference(cases, GetParam());
  // One kernel per case computes both outputs.
  for (const FusionCase& c : cases) {
    std::vector<Segment> segs = segmentFusion(*c.def);
    ASSERT_EQ(segs.size(), 1u) << c.name;
    EXPECT_EQ(segs[0].outputs.size(), 2u) << c.name;
  }
}

TEST_P(CudaEmitterFusions, ExamplesMatchTheReferenceOnTheHost) {
  expectEmulationMatchesReference(exampleCases(), GetParam());
}

TEST_P(CudaEmitterFusions, DecoderLayersMatchTheReferenceOnTheHost) {
  expectEmulationMatchesReference(decoderCases(), GetParam());
}

TEST_P(CudaEmitterFusions, RandomChainsMatchTheReferenceOnTheHost) {
  // Fewer at an H100's geometry: 256 host threads per block make its emulation slow.
  const uint64_t n = GetParam().max_threads > 64 ? 12 : 30;
  std::vector<FusionCase> cases = chainCases(DataType::Float, 1, n);
  for (FusionCase& c : chainCases(DataType::BFloat16, 1, n)) cases.push_back(std::move(c));
  expectEmulationMatchesReference(cases, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Geometries, CudaEmitterFusions, ::testing::ValuesIn(kGeometries),
                         [](const auto& info) { return std::string(info.param.name); });

// Float -> i64 saturates and maps NaN to 0 everywhere: the emitted kernels (here on the host,
// where a plain cast would be undefined), the reference and the CPU backend.
TEST(CudaEmitterCasts, FloatToInt64SaturatesAsTheCpuDoes) {
  std::vector<FusionCase> cases;
  FusionCase k{"cast f32 -> i64", std::make_unique<Fusion>(), {}, {}};
  TensorView* x = k.def->defineTensor({8}, DataType::Float, "x");
  k.def->addOutput(ops::cast(x, DataType::Int64));
  Tensor t = Tensor::empty(DataType::Float, {8});
  const double values[] = {NAN, INFINITY, -INFINITY, 1e30, -1e30, 3.75, -3.75, 0x1p62};
  for (int i = 0; i < 8; ++i) t.set(i, values[i]);
  k.inputs = {t};
  std::vector<Tensor> want = evaluateReference(*k.def, k.inputs);
  const int64_t expected[] = {0, INT64_MAX, INT64_MIN, INT64_MAX, INT64_MIN, 3, -3, int64_t{1} << 62};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(static_cast<const int64_t*>(want[0].data())[i], expected[i]) << i;
  cases.push_back(std::move(k));
  expectEmulationMatchesReference(cases, cuda_testing::kSmallGpu);
}

// ---- how the emitter parallelizes ---------------------------------------------------------

cuda::EmittedProgram emitOne(const std::function<TensorView*(TensorView*)>& build, std::vector<int64_t> shape,
                             DataType dt = DataType::BFloat16) {
  Fusion f;
  TensorView* x = f.defineTensor(std::vector<Extent>(shape.begin(), shape.end()), dt, "x");
  f.addOutput(build(x));
  std::vector<Segment> segs = segmentFusion(f);
  kir::Program p = kir::lowerSegment(f, segs.at(0), [](const TensorView* tv) { return tv->evaluateShape({}); }, "t");
  return cuda::emitCuda(p, "t", 132);
}

TEST(CudaEmitterModes, RowsRunOnBlocksAndPointwiseOnThreads) {
  cuda::EmittedProgram softmax = emitOne([](TensorView* x) { return ops::softmax(x, 1); }, {8192, 4096});
  EXPECT_NE(softmax.source.find("block mode over 8192 outer iteration(s)"), std::string::npos) << softmax.source;
  // The row's max and sum: each thread's partial over the row, then a block reduction.
  EXPECT_NE(softmax.source.find("mf_q0 = mf_block_reduce(mf_q0, MfMax());"), std::string::npos) << softmax.source;
  EXPECT_NE(softmax.source.find("mf_block_reduce(mf_q3, MfAdd());"), std::string::npos) << softmax.source;
  ASSERT_EQ(softmax.steps.at(0).size(), 1u);
  EXPECT_EQ(softmax.steps[0][0].blocks, 132 * 16);
  cuda::EmittedProgram gelu = emitOne([](TensorView* x) { return ops::gelu(x, "tanh"); }, {8192, 4096});
  EXPECT_NE(gelu.source.find("thread mode over 33554432 outer iteration(s), 8 per thread (vectorized)"),
            std::string::npos) << gelu.source;
  EXPECT_NE(gelu.source.find("*reinterpret_cast<const uint4*>"), std::string::npos) << gelu.source;
  EXPECT_EQ(gelu.source.substr(gelu.source.find("// step")).find("__syncthreads"), std::string::npos)
      << "a pointwise kernel needs no barrier";
}

// A reduction over the outer dim of [8192, 4096] (a bias gradient) was one block per column
// whose 256 threads all ran the 8192-long loop while thread 0 stored: now 32 columns per block,
// the block's 8 warps each summing an eighth of the rows.
TEST(CudaEmitterModes, OuterDimReductionsRunInColumns) {
  cuda::EmittedProgram sum = emitOne([](TensorView* x) { return ops::sum(x, {0}); }, {8192, 4096});
  EXPECT_NE(sum.source.find("columns mode over 4096 outer iteration(s)"), std::string::npos) << sum.source;
  EXPECT_NE(sum.source.find("mf_col[mf_row][mf_lane]"), std::string::npos) << sum.source;
  EXPECT_EQ(sum.source.find("if (threadIdx.x == 0)"), std::string::npos) << "no serial loop guarded by thread 0";
  // The columns kernel (after the one that zeroes the f32 sums; a last one rounds them to bf16).
  const size_t at = sum.source.find("columns mode");
  const std::vector<cuda::KernelLaunch>& launches = sum.steps.back();
  const std::string bounds = "__launch_bounds__(256) ";
  const size_t name_at = sum.source.find(bounds, at) + bounds.size();
  const std::string name = sum.source.substr(name_at, sum.source.find('(', name_at) - name_at);
  auto k = std::find_if(launches.begin(), launches.end(), [&](const cuda::KernelLaunch& l) { return l.name == name; });
  ASSERT_NE(k, launches.end()) << sum.source.substr(at);
  EXPECT_EQ(k->blocks, 4096 / 32);
}

// A full reduction was one block of 256 threads, serially (the accumulation's store does not vary
// with its loops): now a grid of partial results, combined by a second launch.
TEST(CudaEmitterModes, FullReductionsRunOnAGrid) {
  cuda::EmittedProgram sum = emitOne([](TensorView* x) { return ops::sum(x, {0, 1}); }, {8192, 4096});
  ASSERT_EQ(sum.extra_bytes.size(), 1u) << sum.source;
  const std::vector<cuda::KernelLaunch>& launches = sum.steps.back();
  ASSERT_EQ(launches.size(), 2u) << sum.source;
  EXPECT_EQ(launches[0].blocks, 132 * 4) << "the partials fill the GPU";
  EXPECT_EQ(launches[1].blocks, 1);
  EXPECT_EQ(sum.extra_bytes[0], 132 * 4 * 4);
  EXPECT_NE(sum.source.find("mf_partials[blockIdx.x]"), std::string::npos) << sum.source;
  // A small one stays one block, its loop spread over the block's threads.
  cuda::EmittedProgram small = emitOne([](TensorView* x) { return ops::sum(x, {0, 1}); }, {33, 40});
  EXPECT_TRUE(small.extra_bytes.empty());
  EXPECT_NE(small.source.find("for (long long mf_f = threadIdx.x;"), std::string::npos) << small.source;
}

// A reduction over a middle dim inside a row: each thread owns output elements and loops over the
// reduced dim (the loops interchanged), instead of thread 0 storing every element.
TEST(CudaEmitterModes, MiddleDimReductionsInterchangeTheLoops) {
  cuda::EmittedProgram sum = emitOne([](TensorView* x) { return ops::sum(x, {1}); }, {64, 512, 256});
  EXPECT_NE(sum.source.find("for (long long mf_i = threadIdx.x;"), std::string::npos) << sum.source;
  EXPECT_EQ(sum.source.find("if (threadIdx.x == 0)"), std::string::npos) << sum.source;
}

// embedding_backward's scatter-add writes rows its indices name: two tokens may name one row, so the
// token loop must never be split across threads (the store's index involves the token only
// through a load). Each thread owns hidden columns and walks the tokens serially: no race, no
// atomics, the same sum order as the CPU.
TEST(CudaEmitterModes, ScatterRowsRunSeriallyPerColumn) {
  Fusion f;
  TensorView* g = f.defineTensor({4096, 512}, DataType::Float, "g");
  TensorView* i = f.defineTensor({4096}, DataType::Int64, "i");
  f.addOutput(ops::embeddingBackward(g, i, 1000));
  std::vector<Segment> segs = segmentFusion(f);
  kir::Program p = kir::lowerSegment(f, segs.at(0), [](const TensorView* tv) { return tv->evaluateShape({}); }, "t");
  cuda::EmittedProgram e = cuda::emitCuda(p, "t", 132);
  // The zeroing kernel, then the scatter: thread mode over the 512 columns, the tokens serial.
  EXPECT_NE(e.source.find("thread mode over 512 outer iteration(s)\n"), std::string::npos) << e.source;
  const std::string scatter = e.source.substr(e.source.find("thread mode over 512 outer iteration(s)"));
  EXPECT_NE(scatter.find("< 4096LL; ++s"), std::string::npos) << "a serial loop over the tokens\n" << scatter;
  EXPECT_EQ(scatter.find("atomic"), std::string::npos) << scatter;
}

}  // namespace
}  // namespace meshfuse
