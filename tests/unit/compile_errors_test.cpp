// Programs the multi-device pipeline cannot compile fail with a typed error that names the
// tensors and says what is unsupported (no crash, no wrong program).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "meshfuse/ir/parser.h"
#include "lower/pipeline.h"
#include "test_helpers.h"

namespace meshfuse {
namespace {

using ::testing::HasSubstr;
using testing_helpers::userErrorMessage;

std::string compileError(ErrorKind kind, const std::string& text, PipelineOptions options = {}) {
  return userErrorMessage(kind, [&] { compile(parseFusion(text, "bad.mf"), options); });
}

// Between meshes of different shapes a value moves only to or from a single device (a gather,
// reduce, broadcast or scatter); here the operand of an op on the weight's mesh would need both.
TEST(CompileErrors, OperandOnAMultiDeviceMeshOfAnotherShape) {
  EXPECT_THAT(compileError(ErrorKind::Unsupported, R"(fusion {
  mesh @a = [0, 1]
  mesh @b = [2, 3, 4]
  %x = input f32[4, 8] @a {split(0, 2), parallelize(0, DIDx)}
  %w = input f32[6, 8] @b {}
  %y = linear(%x, %w)
  output %y
})"),
              HasSubstr("%x (for %y): cannot move from [Shard(0)] on mesh [0, 1] to [Replicate()] on mesh [2, 3, 4]: "
                        "between meshes of different shapes a value moves only to or from a single device (gather or "
                        "reduce to it, broadcast or scatter from it)"));
}

TEST(CompileErrors, MicrobatchesThroughAReductionOverTheRows) {
  EXPECT_THAT(compileError(ErrorKind::Unsupported, R"(fusion {
  mesh @s0 = [0]
  %x = input f32[8, 4] @s0 {split(0, 2), parallelize(0, Stream)}
  %y = sum(%x, dims=[0])
  output %y
})"),
              HasSubstr("sum: %x is split into microbatches along dim 0, which sum does not keep as the rows"));
}

TEST(CompileErrors, MicrobatchesMustSplitDimZero) {
  EXPECT_THAT(compileError(ErrorKind::Unsupported, R"(fusion {
  mesh @s0 = [0]
  %x = input f32[8, 4] @s0 {split(1, 2), parallelize(1, Stream)}
  %y = neg(%x)
  output %y
})"),
              HasSubstr("%x: microbatches must split dim 0 (its Stream-parallel split is on dim 1)"));
}

TEST(CompileErrors, OverlapInsideAMicrobatchedPipeline) {
  PipelineOptions o;
  o.overlap.algorithm = parseOverlapAlgorithm("ring");
  EXPECT_THAT(compileError(ErrorKind::Unsupported, R"(fusion {
  mesh @s0 = [0]
  %x = input f32[8, 4] @s0 {split(0, 2), parallelize(0, Stream)}
  %y = neg(%x)
  output %y
})",
                           o),
              HasSubstr("overlap decomposition (--overlap=ring) inside a microbatched pipeline is not supported"));
}

TEST(CompileErrors, UnknownOverlapAlgorithmAndBadChunks) {
  const std::string mlp = R"(fusion {
  mesh @m = [0, 1]
  %x = input f32[8, 4] @m {split(0, 2), parallelize(0, DIDx)}
  %y = neg(%x)
  output %y
})";
  PipelineOptions o;
  // The algorithm is an enum: a bad name is refused where text becomes options (CLI, Python).
  EXPECT_EQ(userErrorMessage(ErrorKind::Value, [] { parseOverlapAlgorithm("zigzag"); }),
            "overlap algorithm 'zigzag': expected none, collective or ring");
  o.overlap.algorithm = parseOverlapAlgorithm("collective");
  o.overlap.chunks = -2;
  EXPECT_THAT(compileError(ErrorKind::Value, mlp, o), HasSubstr("overlap chunks must be >= 0"));
}

TEST(CompileErrors, ASetCannotMakeAPendingSum) {
  EXPECT_THAT(compileError(ErrorKind::Unsupported, R"(fusion {
  mesh @m = [0, 1]
  %x = input f32[4, 8] @m {split(0, 2), parallelize(0, DIDx)}
  %y = set(%x) : f32[4, 8, r2] @m {parallelize(2, DIDx)}
  output %y
})"),
              HasSubstr("set: %y is pinned Partial() on mesh axis 0 but its input %x is Shard(0); a set makes a "
                        "pending sum (Partial) only of a whole value (Replicate)"));
}

TEST(CompileErrors, SetAttributesAreChecked) {
  EXPECT_THAT(
      userErrorMessage(
          ErrorKind::Value,
          [] { parseFusion("fusion {\n  %x = input f32[4]\n  %y = set(%x, overlap=\"sometimes\")\n}\n", "bad.mf"); }),
      HasSubstr("bad.mf:3:8: set: overlap must be \"none\", \"collective\" or \"ring\" but is \"sometimes\""));
  EXPECT_THAT(
      userErrorMessage(
          ErrorKind::Value,
          [] { parseFusion("fusion {\n  %x = input f32[4]\n  %y = gelu(%x, approximate=\"fast\")\n}\n", "bad.mf"); }),
      HasSubstr("gelu: approximate must be \"none\" or \"tanh\" but is \"fast\""));
}

TEST(CompileErrors, PassesRunOutOfOrderSayWhichPassMustComeFirst) {
  const char* tp = R"(fusion {
  mesh @tp = [0, 1]
  %x = input f32[4, 8] @tp {}
  %w = input f32[6, 8] @tp {split(0, 2), parallelize(0, DIDx)}
  %y = linear(%x, %w)
  output %y
})";
  for (const char* pass :
       {"decompose-reshardings", "layout-for-communication", "propagate-streams", "decompose-for-overlap"}) {
    std::unique_ptr<Fusion> f = parseFusion(tp, "tp.mf");
    EXPECT_EQ(userErrorMessage(ErrorKind::Value, [&] { runPasses(*f, {pass}); }),
              fmt::format("{} needs propagate-shardings first: %y has no device mesh (run "
                          "--pass=propagate-shardings,{})",
                          pass, pass));
  }
  std::unique_ptr<Fusion> f = parseFusion(tp, "tp.mf");
  EXPECT_NO_THROW(runPasses(*f, {"propagate-shardings", "decompose-reshardings"}));
}

TEST(CompileErrors, AFusionWithoutOutputs) {
  auto f = std::make_unique<Fusion>();
  f->apply(OpKind::Neg, {f->defineTensor({4}, DataType::Float, "a")});
  EXPECT_THAT(userErrorMessage(ErrorKind::Value, [&] { compile(std::move(f)); }),
              HasSubstr("the fusion has no outputs: nothing it computes would be returned"));
}

TEST(CompileErrors, AFusionWithoutMeshesCompilesForOneDevice) {
  // Not an error: the issue's own demo (examples/mlp_block.mf) has no mesh; it is the program of
  // the one-device mesh [0], without collectives.
  CompiledProgram p = compile(parseFusion(R"(fusion {
  %x = input f32[?t, 8]
  %w = input f32[6, 8]
  %y = linear(%x, %w)
  output %y
})",
                                          "one.mf"));
  EXPECT_EQ(p.fusion->numMeshes(), 1);
  EXPECT_EQ(p.fusion->mesh(0), DeviceMesh({0}));
  EXPECT_TRUE(collectives(programForRank(p, 0), {{"t", 4}}).empty());
}

}  // namespace
}  // namespace meshfuse
