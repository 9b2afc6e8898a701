// Every kernel meshfuse launches on a GPU, compiled without a GPU by the backend's own NVRTC path
// to an sm_90 CUBIN (not only PTX: ptxas runs, as it does when the backend loads a kernel), must
// not spill registers nor use a stack frame: ptxas's verbose report of each kernel is read and any
// spill or stack byte fails the test. Compiled: the runtime's own kernels; every op of the IR in
// f32, bf16 and f16; the program of every rank of every example and lit-test fusion that compiles
// (local shapes, symbolic sizes bound to 4096, kernels emitted for an H100's 132 SMs); and the
// decoder layer and MLP block at realistic sizes in each float dtype.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>

#include "cuda_emulation.h"
#include "cuda_test_helpers.h"
#include "meshfuse/ir/parser.h"
#include "codegen/kernel_dump.h"
#include "lower/pipeline.h"
#include "models.h"
#include "codegen/cuda/cuda_emitter.h"
#include "runtime/cuda/nvrtc_compiler.h"
#include "codegen/cuda/runtime_kernels.h"

namespace meshfuse {
namespace {

constexpr int kH100Sms = 132;

// Compiles `source` to an sm_90 CUBIN; every kernel of `kernels` must be in ptxas's report with
// no spill and no stack frame.
void expectCompiledWithoutSpills(const std::string& source, const std::string& what,
                                 const std::vector<std::string>& kernels) {
  auto start = std::chrono::steady_clock::now();
  cuda::CompiledCode code = cuda::compileCuda(source, "resources", {90, false, "", /*resource_usage=*/true});
  ASSERT_FALSE(code.image.empty()) << what;
  std::map<std::string, cuda::KernelResources> by_name;
  for (const cuda::KernelResources& r : code.resources) by_name[r.name] = r;
  for (const std::string& k : kernels) {
    auto it = by_name.find(k);
    if (it == by_name.end()) {
      ADD_FAILURE() << what << ": ptxas reported nothing for kernel " << k << "; its log:\n" << code.log.substr(0, 3000);
      continue;
    }
    const cuda::KernelResources& r = it->second;
    EXPECT_TRUE(r.stack_frame_bytes == 0 && r.spill_store_bytes == 0 && r.spill_load_bytes == 0)
        << what << ": kernel " << k << " uses " << r.registers << " registers, a " << r.stack_frame_bytes
        << "-byte stack frame, spills " << r.spill_store_bytes << " bytes and reloads " << r.spill_load_bytes;
  }
  ::testing::Test::RecordProperty(what, fmt::format("{} kernels in {:.1f} s", kernels.size(),
                                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()));
}

// The emitted source of `programs` (names made unique by `prefix`) and its kernels, programs
// already seen (the same segment and local shapes on another rank) left out.
struct Batch {
  std::string source;
  std::vector<std::string> kernels;
  std::set<std::string> seen;
  int64_t programs = 0;
  void add(const kir::Program& p, const std::string& prefix) {
    if (!seen.insert(printProgram(p)).second) return;
    cuda::EmittedProgram e = cuda::emitCuda(p, fmt::format("{}_{}", prefix, programs++), kH100Sms);
    source += e.source;
    for (const auto& step : e.steps)
      for (const cuda::KernelLaunch& k : step) kernels.push_back(k.name);
  }
};

TEST(CudaKernelResources, RuntimeKernels) {
  std::vector<std::string> kernels;
  for (DataType dt : {DataType::Float, DataType::BFloat16, DataType::Half, DataType::Int64, DataType::Bool})
    kernels.push_back(cuda::accumulateKernelName(dt));
  for (int unit : {1, 2, 4, 8, 16}) kernels.push_back(cuda::copyBlockKernelName(unit));
  expectCompiledWithoutSpills(cuda::runtimeKernelsSource(), "runtime kernels", kernels);
}

class CudaKernelResourcesOps : public ::testing::TestWithParam<DataType> {};

TEST_P(CudaKernelResourcesOps, EveryOp) {
  std::string source;
  std::vector<std::string> kernels;
  std::vector<std::unique_ptr<Fusion>> defs;
  for (const cuda_testing::OpCase& c : cuda_testing::opCases()) {
    defs.push_back(std::make_unique<Fusion>());
    cuda_testing::buildCase(c, GetParam(), *defs.back());
    cuda_testing::EmulatedFusion f(*defs.back(), {}, c.name, kH100Sms);
    source += f.source(false);
    for (const auto& l : f.launches())
      for (const auto& step : l.emitted.steps)
        for (const cuda::KernelLaunch& k : step) kernels.push_back(k.name);
  }
  expectCompiledWithoutSpills(source, fmt::format("every op in {}", dtypeName(GetParam())), kernels);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaKernelResourcesOps,
                         ::testing::Values(DataType::Float, DataType::BFloat16, DataType::Half),
                         [](const auto& info) { return std::string(dtypeName(info.param)); });

// The pieces of a .mf file: the whole file, or those between "# -----" lines (lit's
// --split-input-file convention), each as text.
std::vector<std::string> pieces(const std::string& text) {
  std::vector<std::string> out(1);
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# -----", 0) == 0) {
      out.emplace_back();
      continue;
    }
    out.back() += line + "\n";
  }
  return out;
}

TEST(CudaKernelResources, EveryExampleAndLitFusionOnEveryRank) {
  std::vector<std::filesystem::path> files;
  for (const char* dir : {"/examples", "/tests/lit"})
    for (const auto& e : std::filesystem::recursive_directory_iterator(std::string(MESHFUSE_SOURCE_DIR) + dir))
      if (e.path().extension() == ".mf") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  Batch batch;
  int64_t compiled = 0, refused = 0;
  for (const auto& path : files) {
    std::ifstream in(path);
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    const std::string rel = std::filesystem::relative(path, MESHFUSE_SOURCE_DIR).string();
    std::vector<std::string> parts = pieces(text);
    for (size_t i = 0; i < parts.size(); ++i) {
      try {
        std::unique_ptr<Fusion> f = parseFusion(parts[i], rel);
        SymbolBindings sizes;
        for (const TensorView* tv : f->inputs())
          for (const Extent& e : tv->shape())
            if (!e.isStatic()) sizes[e.symbol()] = 4096;
        PipelineOptions o;
        o.sizes = sizes;
        CompiledProgram p = compile(std::move(f), o);
        std::set<int64_t> ranks;
        for (int64_t m = 0; m < p.fusion->numMeshes(); ++m)
          for (int64_t d : p.fusion->mesh(m).devices()) ranks.insert(d);
        if (ranks.empty()) ranks.insert(0);
        for (int64_t r : ranks)
          for (const kir::Program& k : kernelPrograms(p, r, sizes)) batch.add(k, "f");
        ++compiled;
      } catch (const UserError&) {
        ++refused;  // an error test's input (lit/errors, an expected-error case): nothing to launch
      }
    }
  }
  EXPECT_GE(compiled, 40) << "fusions compiled (" << refused << " refused)";
  ::testing::Test::RecordProperty("fusions", fmt::format("{} compiled, {} refused, {} distinct programs", compiled, refused,
                                        batch.programs));
  expectCompiledWithoutSpills(batch.source, "examples and lit fusions", batch.kernels);
}

TEST(CudaKernelResources, DecoderLayerAndMlpAtRealisticSizes) {
  Batch batch;
  for (DataType dt : {DataType::Float, DataType::BFloat16, DataType::Half}) {
    Fusion f;
    models::buildDecoderLayer(f, {.batch = 2, .seq = 2048, .hidden = 4096, .heads = 32, .dtype = dt});
    cuda_testing::EmulatedFusion e(f, {}, fmt::format("dec_{}", dtypeName(dt)), kH100Sms);
    for (const auto& l : e.launches())
      if (!l.direct && !l.copy) batch.add(l.program, fmt::format("dec_{}", dtypeName(dt)));
  }
  Fusion mlp;
  models::buildMlp(mlp, 4096, /*residual=*/true);
  cuda_testing::EmulatedFusion e(mlp, {{"s0", 8192}}, "mlp", kH100Sms);
  for (const auto& l : e.launches())
    if (!l.direct && !l.copy) batch.add(l.program, "mlp");
  EXPECT_GT(batch.kernels.size(), 5u);
  expectCompiledWithoutSpills(batch.source, "decoder layers and MLP block at realistic sizes", batch.kernels);
}

// ptxas's report as NVRTC returns it, parsed.
TEST(CudaKernelResources, PtxasReportIsParsed) {
  const std::string log =
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Compiling entry function 'k1' for 'sm_90'\n"
      "ptxas info    : Function properties for k1\n"
      "    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n"
      "ptxas info    : Used 40 registers, used 1 barriers, 360 bytes cmem[0]\n"
      "ptxas info    : Compiling entry function 'k2' for 'sm_90'\n"
      "ptxas info    : Function properties for k2\n"
      "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 12 registers, 360 bytes cmem[0]\n";
  std::vector<cuda::KernelResources> r = cuda::parsePtxasResources(log);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].name, "k1");
  EXPECT_EQ(r[0].stack_frame_bytes, 16);
  EXPECT_EQ(r[0].spill_store_bytes, 8);
  EXPECT_EQ(r[0].spill_load_bytes, 4);
  EXPECT_EQ(r[0].registers, 40);
  EXPECT_EQ(r[1].name, "k2");
  EXPECT_EQ(r[1].registers, 12);
  EXPECT_EQ(r[1].stack_frame_bytes, 0);
}

}  // namespace
}  // namespace meshfuse
