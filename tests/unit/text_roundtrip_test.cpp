// The .mf text form: print -> parse -> print is the identity (DESIGN.md "Textual form"), for
// every op kind, meshes, placements, symbolic sizes, schedules, provenance and names.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>

#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/ir/placement.h"
#include "meshfuse/ir/printer.h"
#include "test_helpers.h"

namespace meshfuse {
namespace {

using Ints = std::vector<int64_t>;

// Prints `f`, parses the text back and prints again; the two texts must be identical.
std::string expectRoundTrip(const Fusion& f) {
  std::string text = printFusion(f);
  std::unique_ptr<Fusion> parsed;
  try {
    parsed = parseFusion(text, "roundtrip.mf");
  } catch (const std::exception& e) {
    ADD_FAILURE() << "the printed text does not parse: " << e.what() << "\n" << text;
    return text;
  }
  EXPECT_EQ(printFusion(*parsed), text);
  return text;
}

// Parses canonical text and prints it back unchanged.
void expectTextRoundTrip(const std::string& text) {
  std::unique_ptr<Fusion> f = parseFusion(text, "canonical.mf");
  EXPECT_EQ(printFusion(*f), text);
}

TEST(TextRoundTrip, EveryOpKind) {
  Fusion f;
  const DeviceMesh tp({0, 1, 2, 3});
  Extent t = Extent::symbolic("t");
  TensorView* x = f.defineTensor({t, 64}, DataType::Float, "x");
  TensorView* w = f.defineTensor({256, 64}, DataType::Float, "w");
  TensorView* b = f.defineTensor({256}, DataType::Float, "b");
  TensorView* ln_w = f.defineTensor({64}, DataType::Float);
  TensorView* ids = f.defineTensor({t, 64}, DataType::Int64);
  TensorView* q = f.defineTensor({2, 4, 16, 8}, DataType::BFloat16, "q");
  TensorView* kv = f.defineTensor({2, 4, 24, 8}, DataType::BFloat16, "kv");
  TensorView* labels = f.defineTensor({t}, DataType::Int64, "labels");
  applyPlacements(x, tp, {Placement::shard(0)});
  applyPlacements(w, tp, {Placement::shard(0)});
  for (OpKind k : allOpKinds()) {
    switch (opInfo(k).category) {
      case OpCategory::Unary: f.apply(k, {x}); break;
      case OpCategory::Binary: f.apply(k, {x, f.scalar(0.5)}); break;
      case OpCategory::Compare: f.apply(k, {ids, f.scalar(-3, DataType::Int64)}); break;
      default: break;
    }
  }
  f.apply(OpKind::Gelu, {x}, {{"approximate", std::string("tanh")}});
  f.apply(OpKind::Sub, {f.scalar(1.0), x});
  f.apply(OpKind::Mul, {x, x}, {}, "sq");
  TensorView* cond = f.apply(OpKind::Lt, {x, x});
  f.apply(OpKind::Where, {cond, x, f.scalar(-1.5)});
  f.apply(OpKind::Where, {cond, f.scalar(true, DataType::Bool), f.scalar(false, DataType::Bool)});
  f.apply(OpKind::Cast, {x}, {{"dtype", DataType::BFloat16}});
  f.apply(OpKind::Set, {x});
  f.apply(OpKind::Sum, {x}, {{"dims", Ints{1}}});
  f.apply(OpKind::Max, {x}, {{"dims", Ints{-1}}});
  f.apply(OpKind::Mean, {x}, {{"dims", Ints{0, 1}}});
  TensorView* lin = f.apply(OpKind::Linear, {x, w});
  f.apply(OpKind::Linear, {x, w, b}, {}, "biased");
  f.apply(OpKind::Matmul, {q, f.apply(OpKind::Permute, {kv}, {{"dims", Ints{0, 1, 3, 2}}})});
  f.apply(OpKind::BroadcastInDim, {b}, {{"shape", Ints{3, 256}}, {"broadcast_dims", Ints{1}}});
  f.apply(OpKind::Reshape, {x}, {{"shape", Ints{-1, 4, 16}}});
  f.apply(OpKind::Slice, {w}, {{"starts", Ints{0, 8}}, {"ends", Ints{256, 24}}});
  f.apply(OpKind::Cat, {w, w, w}, {{"dim", int64_t{0}}});
  f.apply(OpKind::Softmax, {lin}, {{"dim", int64_t{-1}}});
  f.apply(OpKind::LayerNorm, {x, ln_w, nullptr}, {{"eps", 1e-3}});
  f.apply(OpKind::LayerNorm, {x, nullptr, ln_w});
  f.apply(OpKind::LayerNorm, {x});
  f.apply(OpKind::RmsNorm, {x, ln_w});
  f.apply(OpKind::Sdpa, {q, kv, kv}, {{"is_causal", true}, {"scale", 0.125}});
  f.apply(OpKind::SdpaLse, {q, kv}, {{"is_causal", true}});
  f.apply(OpKind::SdpaGrad, {q, kv, kv, q}, {{"wrt", std::string("key")}, {"is_causal", true}});
  f.apply(OpKind::LogSoftmax, {lin}, {{"dim", int64_t{1}}});
  TensorView* rows = f.apply(OpKind::Embedding, {w, ids});
  f.apply(OpKind::EmbeddingBackward, {rows, ids}, {{"num_weights", int64_t{256}}});
  f.apply(OpKind::OneHot, {labels}, {{"num_classes", int64_t{5}}});
  f.apply(OpKind::CrossEntropy, {x, labels});
  f.apply(OpKind::CrossEntropy, {x, labels}, {{"ignore_index", int64_t{0}}, {"reduction", std::string("sum")}});
  TensorView* last = f.apply(OpKind::Sdpa, {q, kv, kv});
  f.addOutput(last);
  f.addOutput(lin);

  std::set<OpKind> used;
  for (const Expr* e : f.exprs()) used.insert(e->kind());
  EXPECT_EQ(used.size(), allOpKinds().size()) << "the fusion must use every op kind";

  std::string text = expectRoundTrip(f);
  for (OpKind k : allOpKinds())
    EXPECT_NE(text.find(" = " + std::string(opInfo(k).name) + "("), std::string::npos) << opInfo(k).name;
  // Spot checks of the canonical spelling.
  EXPECT_NE(text.find("%biased = linear(%x, %w, bias=%b) : f32[?t, 256, r64]\n"), std::string::npos) << text;
  EXPECT_NE(text.find("layer_norm(%x, bias=%0) : f32[?t, 64]\n"), std::string::npos) << text;
  EXPECT_NE(text.find("layer_norm(%x, weight=%0, eps=0.001)"), std::string::npos) << "non-default attrs printed";
  EXPECT_NE(text.find("rms_norm(%x, weight=%0) : f32[?t, 64]\n"), std::string::npos) << "default eps omitted";
  EXPECT_NE(text.find("sdpa_lse(%q, %kv, is_causal=true) : f32[2, 4, 16]\n"), std::string::npos) << "f32 whatever q is";
  EXPECT_NE(text.find("sdpa(%q, %kv, %kv, is_causal=true, scale=0.125)"), std::string::npos);
  EXPECT_NE(text.find("sdpa_grad(%q, %kv, %kv, %q, wrt=\"key\", is_causal=true) : bf16[2, 4, 24, 8]\n"),
            std::string::npos)
      << "shaped like the key";
  EXPECT_NE(text.find("gelu(%x, approximate=\"tanh\")"), std::string::npos);
  EXPECT_NE(text.find("cast(%x, dtype=bf16) : bf16[?t, 64]"), std::string::npos);
  EXPECT_NE(text.find("eq(%1, -3) : bool[?t, 64]"), std::string::npos) << text;
  EXPECT_NE(text.find("sub(1.0, %x)"), std::string::npos);
  EXPECT_NE(text.find("where(%"), std::string::npos);
  EXPECT_NE(text.find(", true, false)"), std::string::npos);
  EXPECT_NE(text.find("%x = input f32[?t, 64] @m0 {split(0, 4), parallelize(0, DIDx)}\n"), std::string::npos);
}

TEST(TextRoundTrip, GoldenTextOfAShardedFusion) {
  Fusion f;
  const DeviceMesh tp({0, 1, 2, 3});
  f.addMesh(tp, "tp");
  TensorView* inp = f.defineTensor({Extent::symbolic("t"), 64}, DataType::Float, "inp");
  applyPlacements(inp, tp, {Placement::replicate()});
  TensorView* up_w = f.defineTensor({256, 64}, DataType::Float, "up_w");
  applyPlacements(up_w, tp, {Placement::shard(0)});
  TensorView* y = f.apply(OpKind::Linear, {inp, up_w});
  applyPlacements(y, tp, {Placement::shard(1)});
  y->setPinned(false);
  y->setProvenance(Provenance::literal("linear: n from %up_w"));
  TensorView* g = f.apply(OpKind::Gelu, {y}, {{"approximate", std::string("tanh")}});
  f.addOutput(g);
  EXPECT_EQ(expectRoundTrip(f), R"(fusion {
  mesh @tp = [0, 1, 2, 3]
  %inp = input f32[?t, 64] @tp {}
  %up_w = input f32[256, 64] @tp {split(0, 4), parallelize(0, DIDx)}
  %0 = linear(%inp, %up_w) : f32[?t, 256, r64] @tp {split(1, 4), parallelize(1, DIDx)} from "linear: n from %up_w"
  %1 = gelu(%0, approximate="tanh") : f32[?t, 256]
  output %1
}
)");
}

TEST(TextRoundTrip, MeshesPlacementsSchedulesAndProvenance) {
  expectTextRoundTrip(R"(fusion {
  mesh @grid = [[0, 1], [2, 3]]
  mesh @pp = [4, 5, 6, 7]
  mesh @unused = [[[0], [1]], [[2], [3]]]
  %x = input bf16[?t, 64, r2] @grid {split(0, 2), parallelize(0, DIDy), parallelize(3, DIDx)}
  %w = input bf16[128, 64] @grid {split(0, 2), parallelize(0, DIDx)}
  %y = input f32[?t*2, 4] {split(1, 2, inner)}
  %0 = linear(%x, %w) : bf16[?t, 128, r64] @grid {split(0, 2), parallelize(0, DIDy), split(2, 2), parallelize(2, DIDx)} from "rule \"linear\" \\ from %w"
  %1 = set(%0) : bf16[?t, 128] @pp {split(0, 4), parallelize(0, DIDx), split(1, 2, inner), parallelize(2, Stream)}
  %2 = reshape(%1, shape=[-1, 4, 32]) : bf16[?t, 4, 32] {merge(1)}
  %3 = sum(%y, dims=[0]) : f32[r?t*2, 4] @pp {split(0, 4), parallelize(0, DIDx)} from ""
  %4 = reshape(%1, shape=[-1, 256]) : bf16[?t/2, 256] @pp {split(0, 4), parallelize(0, DIDx), split(1, 2), merge(1)}
  %5 = mul(%3, 0.5) : f32[4]
  output %2, %0, %5
}
)");
}

// The plan search's choice of routes (Fusion::reshardByBytes) is part of the program: a dump
// after propagation decomposes as the search measured it.
TEST(TextRoundTrip, ReshardByBytes) {
  const char* text = R"(fusion {
  mesh @grid = [[0, 1], [2, 3]]
  reshard by bytes
  %x = input f32[2, 5, r2] @grid {parallelize(2, DIDy), split(0, 2), parallelize(0, DIDx)}
  %0 = neg(%x) : f32[2, 5] @grid {split(0, 2), parallelize(0, DIDy)}
  output %0
}
)";
  expectTextRoundTrip(text);
  EXPECT_TRUE(parseFusion(text)->reshardByBytes());
  EXPECT_TRUE(parseFusion(text)->clone()->reshardByBytes());
  EXPECT_FALSE(parseFusion("fusion {\n  %x = input f32[2]\n  output %x\n}\n")->reshardByBytes());
}

TEST(TextRoundTrip, ParsedShardingMatchesTheText) {
  std::unique_ptr<Fusion> f = parseFusion(R"(fusion {
  mesh @grid = [[0, 1], [2, 3]]
  %x = input f32[8, 6, r2] @grid {split(1, 2), parallelize(1, DIDx), parallelize(3, DIDy)}
  %0 = neg(%x) : f32[8, 6] @grid {split(0, 2), parallelize(0, DIDy)} from "because"
  output %0
}
)");
  TensorView* x = f->findTensor("%x");
  ASSERT_NE(x, nullptr);
  EXPECT_TRUE(x->pinned()) << "an annotation without `from` is a user pin";
  EXPECT_EQ(placementsOf(x), (std::vector<Placement>{Placement::partial(), Placement::shard(1)}));
  TensorView* y = f->findTensor("%0");
  ASSERT_NE(y, nullptr);
  EXPECT_FALSE(y->pinned());
  EXPECT_EQ(y->provenance(), "because");
  EXPECT_EQ(placementsOf(y), (std::vector<Placement>{Placement::shard(0), Placement::replicate()}));
  EXPECT_EQ(f->numMeshes(), 1);
  EXPECT_EQ(f->meshName(0), "grid");
}

TEST(TextRoundTrip, PositionalNamesAreRenumberedByPosition) {
  // The example of printer.h: %2 and %3 are positional, so they print as %0 and %1.
  const char* doc = R"(fusion {
  mesh @tp = [0, 1, 2, 3]
  %inp = input f32[?t, 64] @tp {}
  %up_w = input f32[256, 64] @tp {split(0, 4), parallelize(0, DIDx)}
  %2 = linear(%inp, %up_w) : f32[?t, 256, r64] @tp {split(1, 4), parallelize(1, DIDx)} from "..."
  %3 = gelu(%2, approximate="tanh") : f32[?t, 256]
  output %3
}
)";
  std::unique_ptr<Fusion> f = parseFusion(doc);
  std::string printed = printFusion(*f);
  std::string expected = doc;
  expected.replace(expected.find("%2 = linear"), 2, "%0");
  expected.replace(expected.find("gelu(%2"), 7, "gelu(%0");
  expected.replace(expected.find("%3 = gelu"), 2, "%1");
  expected.replace(expected.find("output %3"), 9, "output %1");
  EXPECT_EQ(printed, expected);
  expectRoundTrip(*f);
}

TEST(TextRoundTrip, UserNamesAndPositionalNamesInterleave) {
  Fusion f;
  TensorView* a = f.defineTensor({4}, DataType::Float);
  TensorView* named = f.defineTensor({4}, DataType::Float, "w.1_b");
  TensorView* c = f.apply(OpKind::Add, {a, named});
  TensorView* d = f.apply(OpKind::Mul, {c, a}, {}, "scaled");
  f.addOutput(f.apply(OpKind::Neg, {d}));
  EXPECT_EQ(expectRoundTrip(f), R"(fusion {
  %0 = input f32[4]
  %w.1_b = input f32[4]
  %1 = add(%0, %w.1_b) : f32[4]
  %scaled = mul(%1, %0) : f32[4]
  %2 = neg(%scaled) : f32[4]
  output %2
}
)");
}

TEST(TextRoundTrip, CommentsAndWhitespaceAreNotSignificant) {
  std::unique_ptr<Fusion> f = parseFusion(R"(# a comment line
fusion{   mesh @m=[0,1]  # trailing comment
%x=input f32[4]@m{split(0,2),parallelize(0,DIDx)}
%0=exp(%x):f32[4] output %0}
)");
  EXPECT_EQ(printFusion(*f), R"(fusion {
  mesh @m = [0, 1]
  %x = input f32[4] @m {split(0, 2), parallelize(0, DIDx)}
  %0 = exp(%x) : f32[4]
  output %0
}
)");
}

TEST(TextRoundTrip, PartialPlacementOnAnOpOutput) {
  // A Partial() placement adds a reduction dim to an op's output; its printed annotation
  // (f32[4, r2]) must parse back although the op itself infers f32[4].
  Fusion f;
  TensorView* x = f.defineTensor({4}, DataType::Float, "x");
  TensorView* y = f.apply(OpKind::Neg, {x});
  applyPlacements(y, DeviceMesh({0, 1}), {Placement::partial()});
  f.addOutput(y);
  expectRoundTrip(f);
}

TEST(TextRoundTrip, EveryNameTheApiAcceptsRoundTrips) {
  // Either defineTensor rejects a name the lexer cannot read back (NameError), or it prints
  // and parses back.
  for (std::string name : {"a-b", "has space", "x%y", "quo\"te"}) {
    Fusion f;
    try {
      f.addOutput(f.defineTensor({4}, DataType::Float, name));
    } catch (const UserError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Name) << e.what();
      continue;
    }
    SCOPED_TRACE("name: " + name);
    expectRoundTrip(f);
  }
}

TEST(TextRoundTrip, UnnamedMeshDoesNotCollideWithAUserMeshName) {
  Fusion f;
  f.addMesh(DeviceMesh({0, 1}), "m1");  // index 0, user-named m1
  TensorView* x = f.defineTensor({4}, DataType::Float, "x");
  x->setDeviceMesh(DeviceMesh({0, 1, 2, 3}));  // index 1, unnamed: printed as @m1 too
  f.addOutput(x);
  expectRoundTrip(f);
}

TEST(TextRoundTrip, ProvenanceWithANewline) {
  Fusion f;
  TensorView* x = f.defineTensor({4}, DataType::Float, "x");
  x->setDeviceMesh(DeviceMesh({0, 1}));
  x->setPinned(false);
  x->setProvenance(Provenance::literal("first rule\nthen second rule"));
  f.addOutput(x);
  expectRoundTrip(f);
}

TEST(TextRoundTrip, NonFiniteScalars) {
  Fusion f;
  TensorView* x = f.defineTensor({4}, DataType::Float, "x");
  f.addOutput(f.apply(OpKind::Maximum, {x, f.scalar(-INFINITY)}));
  expectRoundTrip(f);
}

TEST(TextRoundTrip, EveryDoubleScalarParsesBackToItsBits) {
  // The parser reads every number the printer writes: subnormals (5e-324 used to fail), the
  // extremes, -0.0, and a spread of bit patterns; inf, -inf and nan as the printer writes them.
  std::vector<double> values = {5e-324,
                                -5e-324,
                                2.2250738585072009e-308,
                                2.2250738585072014e-308,
                                1.7976931348623157e308,
                                -1.7976931348623157e308,
                                -0.0,
                                0.0,
                                0.1,
                                1e-30,
                                123456789012345678.0,
                                1e+20};
  uint64_t bits = 0x9E3779B97F4A7C15ull;
  for (int i = 0; i < 2000; ++i) {  // xorshift over all exponents
    bits ^= bits << 13, bits ^= bits >> 7, bits ^= bits << 17;
    double d;
    std::memcpy(&d, &bits, sizeof d);
    if (std::isfinite(d)) values.push_back(d);
  }
  for (double v : values) {
    Fusion f;
    TensorView* x = f.defineTensor({4}, DataType::Float, "x");
    f.addOutput(f.apply(OpKind::Mul, {x, f.scalar(v)}));
    std::string text = expectRoundTrip(f);
    std::unique_ptr<Fusion> g = parseFusion(text, "scalar.mf");
    double back = static_cast<const Scalar*>(g->exprs()[0]->input(size_t{1}))->value();
    EXPECT_EQ(std::memcmp(&back, &v, sizeof v), 0) << formatFloat(v) << " read back as " << formatFloat(back);
  }
  for (double v : {INFINITY, -INFINITY, NAN, -NAN}) {
    Fusion f;
    TensorView* x = f.defineTensor({4}, DataType::Float, "x");
    f.addOutput(f.apply(OpKind::Mul, {x, f.scalar(v)}));
    expectRoundTrip(f);
  }
  EXPECT_EQ(formatFloat(-NAN), "nan") << "NaN is printed without a sign (the lexer has no -nan)";
}

TEST(TextRoundTrip, StringsWithControlCharactersAndUtf8) {
  Fusion f;
  TensorView* x = f.defineTensor({4}, DataType::Float, "x");
  x->setDeviceMesh(DeviceMesh({0, 1}));
  x->setPinned(false);
  x->setProvenance(Provenance::literal("tab\there, cr\r, bell\x07, del\x7f, quote\" backslash\\ caf\xC3\xA9"));
  f.addOutput(x);
  std::string text = expectRoundTrip(f);
  EXPECT_NE(text.find(R"(from "tab\there, cr\r, bell\x07, del\x7F, quote\" backslash\\ caf)"
                      "\xC3\xA9\""),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace meshfuse
