// segment: which ops share a segment, the order of segments, and their exact inputs/outputs.
#include "lower/segment.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>

#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/ops.h"
#include "lower/pipeline.h"

namespace meshfuse {
namespace {

// "kernel: add, gelu" per segment.
std::vector<std::string> summary(const std::vector<Segment>& segs) {
  std::vector<std::string> out;
  for (const Segment& s : segs) {
    std::string line = std::string(segmentKindName(s.kind)) + ":";
    for (size_t i = 0; i < s.exprs.size(); ++i) line += (i ? ", " : " ") + std::string(s.exprs[i]->name());
    out.push_back(line);
  }
  return out;
}

// The contract of segmentFusion: every op in exactly one segment, segments in dependency order,
// inputs = values read from outside, outputs = values used outside, fusion outputs or unused.
void expectWellFormed(const Fusion& f, const std::vector<Segment>& segs) {
  std::set<const Expr*> seen;
  std::set<const Val*> available(f.inputs().begin(), f.inputs().end());
  for (const Segment& s : segs) {
    std::set<const Expr*> mine(s.exprs.begin(), s.exprs.end());
    std::set<const TensorView*> read, produced;
    for (const Expr* e : s.exprs) {
      EXPECT_TRUE(seen.insert(e).second) << e->name() << " is in two segments";
      for (const Val* v : e->inputs())
        if (v && v->valKind() == ValKind::TensorView && !(v->definition() && mine.count(v->definition())))
          read.insert(static_cast<const TensorView*>(v));
      produced.insert(e->output());
    }
    EXPECT_EQ(std::set<const TensorView*>(s.inputs.begin(), s.inputs.end()), read);
    EXPECT_EQ(s.inputs.size(), read.size()) << "an input listed twice";
    for (const TensorView* in : s.inputs)
      EXPECT_TRUE(available.count(in)) << f.displayName(in) << " is read before it is made";
    std::set<const TensorView*> outs;
    for (const TensorView* o : produced) {
      bool outside = f.isOutput(o) || o->uses().empty();
      for (const Expr* u : o->uses()) outside |= !mine.count(u);
      if (outside) outs.insert(o);
    }
    EXPECT_EQ(std::set<const TensorView*>(s.outputs.begin(), s.outputs.end()), outs);
    available.insert(s.outputs.begin(), s.outputs.end());
  }
  EXPECT_EQ(seen.size(), f.exprs().size());
}

TEST(Segment, MlpBlockIsTwoGemmsWithTheirEpilogueKernels) {
  Fusion f;
  TensorView* x = f.defineTensor({-1, 64}, DataType::Float, "x");
  TensorView* w1 = f.defineTensor({256, 64}, DataType::Float, "w1");
  TensorView* b1 = f.defineTensor({256}, DataType::Float, "b1");
  TensorView* w2 = f.defineTensor({64, 256}, DataType::Float, "w2");
  TensorView* b2 = f.defineTensor({64}, DataType::Float, "b2");
  f.addOutput(ops::add(ops::linear(ops::gelu(ops::linear(x, w1, b1), "tanh"), w2, b2), x));
  std::vector<Segment> segs = segmentFusion(f);
  EXPECT_EQ(summary(segs), (std::vector<std::string>{"gemm: linear", "kernel: gelu", "gemm: linear", "kernel: add"}));
  expectWellFormed(f, segs);
}

TEST(Segment, PointwiseReductionAndNormalizationChainIsOneKernel) {
  Fusion f;
  TensorView* x = f.defineTensor({8, 32}, DataType::Float, "x");
  TensorView* b = f.defineTensor({32}, DataType::Float, "b");
  TensorView* y = ops::add(x, ops::broadcastInDim(b, {1, 32}, {1}));
  TensorView* z = ops::softmax(ops::sub(y, ops::mean(y, {1}, true)), 1);
  f.addOutput(ops::layerNorm(ops::gelu(z)));
  std::vector<Segment> segs = segmentFusion(f);
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_EQ(segs[0].kind, Segment::Kind::Kernel);
  EXPECT_EQ(segs[0].inputs, (std::vector<const TensorView*>{b, x}));  // first-use order
  expectWellFormed(f, segs);
}

TEST(Segment, IntermediateFusionOutputsAreSegmentOutputs) {
  Fusion f;
  TensorView* x = f.defineTensor({4, 4}, DataType::Float, "x");
  TensorView* a = ops::exp(x);
  TensorView* b = ops::tanh(a);
  TensorView* c = ops::mul(b, a);
  f.addOutput(b);
  f.addOutput(c);
  std::vector<Segment> segs = segmentFusion(f);
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_EQ(segs[0].outputs, (std::vector<const TensorView*>{b, c}));  // not a: used only inside
  expectWellFormed(f, segs);
}

TEST(Segment, NoFusionThatWouldMakeACycleThroughAGemm) {
  // a -> linear -> add and a -> add: fusing add into a's kernel would need the GEMM both before
  // and after that kernel.
  Fusion f;
  TensorView* x = f.defineTensor({4, 8}, DataType::Float, "x");
  TensorView* w = f.defineTensor({8, 8}, DataType::Float, "w");
  TensorView* a = ops::exp(x);
  f.addOutput(ops::add(a, ops::linear(a, w)));
  std::vector<Segment> segs = segmentFusion(f);
  EXPECT_EQ(summary(segs), (std::vector<std::string>{"kernel: exp", "gemm: linear", "kernel: add"}));
  expectWellFormed(f, segs);
}

TEST(Segment, GemmsReadLoneTransposesInPlace) {
  Fusion f;
  TensorView* a = f.defineTensor({2, 3, 4}, DataType::Float, "a");
  TensorView* bt = f.defineTensor({2, 5, 4}, DataType::Float, "bt");
  TensorView* x = f.defineTensor({6, 4}, DataType::Float, "x");
  TensorView* wt = f.defineTensor({4, 7}, DataType::Float, "wt");
  f.addOutput(ops::matmul(a, ops::permute(bt, {0, 2, 1})));
  f.addOutput(ops::linear(x, ops::permute(wt, {1, 0})));
  // Not absorbed: a permute of other dims, and a transpose that something else reads too.
  TensorView* a3 = f.defineTensor({3, 2, 4}, DataType::Float, "a3");
  f.addOutput(ops::matmul(ops::permute(a3, {1, 0, 2}), f.defineTensor({4, 5}, DataType::Float, "b2")));
  TensorView* shared = ops::permute(wt, {1, 0});
  f.addOutput(ops::linear(x, shared));
  f.addOutput(shared);
  std::vector<Segment> segs = segmentFusion(f);
  EXPECT_EQ(summary(segs),
            (std::vector<std::string>{"gemm: permute, matmul", "gemm: permute, linear", "kernel: permute",
                                      "gemm: matmul", "kernel: permute", "gemm: linear"}));
  expectWellFormed(f, segs);
}

TEST(Segment, IndependentProducerChainsMergeIntoTheirConsumer) {
  Fusion f;
  TensorView* x = f.defineTensor({4, 8}, DataType::Float, "x");
  TensorView* y = f.defineTensor({4, 8}, DataType::Float, "y");
  TensorView* a = ops::exp(x);
  TensorView* b = ops::tanh(y);
  f.addOutput(ops::mul(a, b));
  std::vector<Segment> segs = segmentFusion(f);
  EXPECT_EQ(summary(segs), (std::vector<std::string>{"kernel: exp, tanh, mul"}));
  expectWellFormed(f, segs);
}

TEST(Segment, OpsOnDifferentMeshesStayApart) {
  std::unique_ptr<Fusion> f = parseFusion(R"(fusion {
  mesh @a = [0]
  mesh @b = [1]
  %x = input f32[4, 8] @a {}
  %y = exp(%x) : f32[4, 8] @a {}
  %z = tanh(%y) : f32[4, 8] @b {}
  output %z
})",
                                          "<test>");
  std::vector<Segment> segs = segmentFusion(*f);
  EXPECT_EQ(summary(segs), (std::vector<std::string>{"kernel: exp", "kernel: tanh"}));
  expectWellFormed(*f, segs);
}

TEST(Segment, TensorParallelMlpKeepsCollectivesApartAndFusesTheBiasAfterTheAllreduce) {
  CompiledProgram p = compile(parseFusion(R"(fusion {
  mesh @tp = [0, 1, 2, 3]
  %inp = input f32[?t, 64] @tp {}
  %up_w = input f32[256, 64] @tp {split(0, 4), parallelize(0, DIDx)}
  %up_b = input f32[256] @tp {split(0, 4), parallelize(0, DIDx)}
  %down_w = input f32[64, 256] @tp {split(1, 4), parallelize(1, DIDx)}
  %down_b = input f32[64] @tp {}
  %up = linear(%inp, %up_w, bias=%up_b)
  %act = gelu(%up, approximate="tanh")
  %down = linear(%act, %down_w, bias=%down_b)
  %out = add(%down, %inp)
  output %out
})",
                                          "<test>"));
  const std::vector<Segment>& segs = *p.host.segments;
  EXPECT_EQ(summary(segs), (std::vector<std::string>{"gemm: linear", "kernel: gelu", "gemm: linear", "comm: set",
                                                     "kernel: broadcast_in_dim, add, add"}));
  expectWellFormed(*p.fusion, segs);
}

TEST(Segment, TensorParallelDecoderLayer) {
  // examples/decoder_layer.mf: Megatron tensor parallelism on 4 ranks.
  const std::string path = std::string(MESHFUSE_SOURCE_DIR) + "/examples/decoder_layer.mf";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  std::stringstream text;
  text << in.rdbuf();
  CompiledProgram p = compile(parseFusion(text.str(), path));
  const std::vector<Segment>& segs = *p.host.segments;
  EXPECT_EQ(summary(segs), (std::vector<std::string>{
                               "kernel: layer_norm", "gemm: linear", "kernel: reshape, permute", "gemm: linear",
                               "kernel: reshape, permute", "gemm: linear", "kernel: reshape, permute", "gemm: sdpa",
                               "kernel: permute, reshape", "gemm: linear", "comm: set", "kernel: add, layer_norm",
                               "gemm: linear", "kernel: gelu", "gemm: linear", "comm: set", "kernel: add"}));
  expectWellFormed(*p.fusion, segs);
}

}  // namespace
}  // namespace meshfuse
