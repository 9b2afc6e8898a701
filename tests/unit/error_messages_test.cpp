// User errors (DESIGN.md "Errors"): every bad input raises a meshfuse::UserError (never an
// InternalError, never a crash) of the right kind, whose message names the op, the tensors,
// both sides of a mismatch and, for text, the exact "file:LINE:COL".
#include <gmock/gmock-matchers.h>
#include <gtest/gtest.h>

#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/ir/placement.h"
#include "meshfuse/ir/verifier.h"
#include "meshfuse/ops.h"
#include "test_helpers.h"

namespace meshfuse {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using testing_helpers::userErrorMessage;
using Ints = std::vector<int64_t>;

// The message of the UserError (of `kind`) that parsing `text` as "bad.mf" raises.
std::string parseError(ErrorKind kind, const std::string& text) {
  return userErrorMessage(kind, [&] { parseFusion(text, "bad.mf"); });
}

// ---- shapes and dtypes (C++ API) -----------------------------------------------------

TEST(ErrorMessages, AddShapeMismatchNamesBothSides) {
  Fusion f;
  TensorView* a = f.defineTensor({4, 8}, DataType::Float, "a");
  TensorView* b = f.defineTensor({4, 16}, DataType::Float, "b");
  EXPECT_EQ(userErrorMessage(ErrorKind::Shape,
                             [&] {
                               f.apply(OpKind::Add, {a, b});
                             }),
            "add: dim 1 mismatch: %a has 8 but %b has 16");
  TensorView* v = f.defineTensor({4}, DataType::Float, "v");
  EXPECT_THAT(userErrorMessage(ErrorKind::Shape,
                               [&] {
                                 f.apply(OpKind::Mul, {v, b});
                               }),
              HasSubstr("mul: rank mismatch: %v has shape [4] but %b has shape [4, 16]"));
  EXPECT_TRUE(f.exprs().empty()) << "a rejected op adds nothing";
}

TEST(ErrorMessages, AddShapeMismatchInTextHasTheLocation) {
  EXPECT_EQ(parseError(ErrorKind::Shape, R"(fusion {
  %a = input f32[4, 8]
  %b = input f32[4, 16]
  %c = add(%a, %b)
}
)"),
            "bad.mf:4:8: add: dim 1 mismatch: %a has 8 but %b has 16");
}

TEST(ErrorMessages, LinearContractedDimMismatch) {
  Fusion f;
  TensorView* x = f.defineTensor({Extent::symbolic("t"), 64}, DataType::Float, "x");
  TensorView* w = f.defineTensor({256, 32}, DataType::Float, "w");
  EXPECT_EQ(userErrorMessage(ErrorKind::Shape,
                             [&] {
                               f.apply(OpKind::Linear, {x, w});
                             }),
            "linear: contracted dim (k) mismatch: %x has 64 but %w has 32");
  TensorView* wb = f.defineTensor({256, 64}, DataType::BFloat16, "wb");
  EXPECT_THAT(userErrorMessage(ErrorKind::Dtype,
                               [&] {
                                 f.apply(OpKind::Linear, {x, wb});
                               }),
              HasSubstr("linear: dtype mismatch: %x is f32 but %wb is bf16"));
}

TEST(ErrorMessages, ExpOfAnIntegerTensor) {
  Fusion f;
  TensorView* i = f.defineTensor({4}, DataType::Int64, "i");
  EXPECT_EQ(userErrorMessage(ErrorKind::Dtype, [&] { f.apply(OpKind::Exp, {i}); }),
            "exp: expected a floating-point tensor (f32, bf16, f16) but %i is i64");
}

TEST(ErrorMessages, SdpaRefusesAnExplicitZeroScale) {
  Fusion f;
  TensorView* q = f.defineTensor({1, 2, 4, 8}, DataType::Float, "q");
  EXPECT_EQ(userErrorMessage(ErrorKind::Value, [&] { ops::sdpa(q, q, q, false, 0.0); }),
            "sdpa: scale 0 would zero every attention score; leave it unset for 1/sqrt(head size)");
  EXPECT_NO_THROW(ops::sdpa(q, q, q, false, 0.5));
}

TEST(ErrorMessages, WhereNeedsABoolCondition) {
  Fusion f;
  TensorView* c = f.defineTensor({4}, DataType::Float, "c");
  EXPECT_EQ(userErrorMessage(ErrorKind::Dtype,
                             [&] {
                               f.apply(OpKind::Where, {c, c, c});
                             }),
            "where: condition %c must be bool but is f32");
}

TEST(ErrorMessages, ReshapeElementCountMismatch) {
  Fusion f;
  TensorView* x = f.defineTensor({4, 6}, DataType::Float, "x");
  EXPECT_EQ(userErrorMessage(ErrorKind::Shape,
                             [&] {
                               f.apply(OpKind::Reshape, {x}, {{"shape", Ints{5, 5}}});
                             }),
            "reshape: cannot reshape %x of shape [4, 6] (24 elements) into [5, 5]");
  EXPECT_THAT(userErrorMessage(ErrorKind::Shape,
                               [&] {
                                 f.apply(OpKind::Reshape, {x}, {{"shape", Ints{5, -1}}});
                               }),
              HasSubstr("into [5, -1]"));
}

// Found by the fuzzers (fuzz/regressions): sizes whose product overflowed (undefined behaviour)
// and a size-0 dim beside a symbolic one (an invalid symbolic extent: an internal error).
TEST(ErrorMessages, ReshapeSizesThatNoInt64CountsOrThatHoldNoElements) {
  Fusion f;
  TensorView* x = f.defineTensor({8}, DataType::Float, "x");
  EXPECT_EQ(userErrorMessage(ErrorKind::Shape,
                             [&] {
                               f.apply(OpKind::Reshape, {x}, {{"shape", Ints{int64_t{1} << 62, 4}}});
                             }),
            "reshape: shape [4611686018427387904, 4] has more elements than an int64 can count");
  TensorView* t = f.defineTensor({Extent::symbolic("t"), 4}, DataType::Float, "t");
  EXPECT_EQ(userErrorMessage(ErrorKind::Shape,
                             [&] {
                               f.apply(OpKind::Reshape, {t}, {{"shape", Ints{-1, 0}}});
                             }),
            "reshape: the -1 in [-1, 0] is ambiguous: the other sizes hold 0 elements, so any size fits it");
  // No elements in, none out: the -1 is 0 whatever ?t is.
  TensorView* empty = f.defineTensor({Extent::symbolic("t"), 0}, DataType::Float, "empty");
  EXPECT_EQ(ops::reshape(empty, {-1, 2})->shape(), (std::vector<Extent>{0, 2}));
}

TEST(ErrorMessages, SdpaNeedsRank4) {
  Fusion f;
  TensorView* q = f.defineTensor({2, 16, 8}, DataType::Float, "q");
  TensorView* k = f.defineTensor({2, 4, 16, 8}, DataType::Float, "k");
  EXPECT_EQ(userErrorMessage(ErrorKind::Shape,
                             [&] {
                               f.apply(OpKind::Sdpa, {q, k, k});
                             }),
            "sdpa: query [b, heads, s, e] %q must have rank 4 but has shape [2, 16, 8]");
}

TEST(ErrorMessages, AttributesAreCheckedAgainstTheSchema) {
  Fusion f;
  TensorView* x = f.defineTensor({4}, DataType::Float, "x");
  EXPECT_EQ(userErrorMessage(ErrorKind::Value,
                             [&] {
                               f.apply(OpKind::Neg, {x}, {{"alpha", int64_t{2}}});
                             }),
            "neg: unknown attribute 'alpha' (expected one of: none)");
  EXPECT_EQ(userErrorMessage(ErrorKind::Value, [&] { f.apply(OpKind::Sum, {x}); }),
            "sum: missing required attribute 'dims' (ints)");
  EXPECT_EQ(userErrorMessage(ErrorKind::Value,
                             [&] {
                               f.apply(OpKind::Sum, {x}, {{"dims", int64_t{0}}});
                             }),
            "sum: attribute 'dims' must be of type ints but got 0");
  EXPECT_THAT(userErrorMessage(ErrorKind::Value,
                               [&] {
                                 f.apply(OpKind::Softmax, {x}, {{"dimm", int64_t{0}}});
                               }),
              HasSubstr("softmax: unknown attribute 'dimm' (expected one of: dim)"));
  EXPECT_EQ(userErrorMessage(ErrorKind::Value, [&] { f.apply(OpKind::Add, {x}); }),
            "add: expected 2 operands but got 1");
}

// ---- names ---------------------------------------------------------------------------

TEST(ErrorMessages, DuplicateAndReservedNames) {
  Fusion f;
  TensorView* x = f.defineTensor({4}, DataType::Float, "x");
  EXPECT_EQ(userErrorMessage(ErrorKind::Name, [&] { f.defineTensor({4}, DataType::Float, "x"); }), "duplicate name %x");
  EXPECT_EQ(userErrorMessage(ErrorKind::Name, [&] { f.apply(OpKind::Neg, {x}, {}, "x"); }), "duplicate name %x");
  EXPECT_THAT(userErrorMessage(ErrorKind::Name, [&] { f.defineTensor({4}, DataType::Float, "7"); }),
              HasSubstr("name %7 is reserved"));
  EXPECT_EQ(parseError(ErrorKind::Name, "fusion {\n  %x = input f32[4]\n  %x = input f32[4]\n}\n"),
            "bad.mf:3:3: duplicate name %x");
}

TEST(ErrorMessages, UndefinedValueAndMesh) {
  EXPECT_EQ(parseError(ErrorKind::Name, "fusion {\n  %x = input f32[4]\n  %y = neg(%nope)\n}\n"),
            "bad.mf:3:12: undefined value %nope");
  EXPECT_EQ(parseError(ErrorKind::Name, "fusion {\n  %x = input f32[4] @nope {}\n}\n"),
            "bad.mf:2:21: undefined mesh @nope");
  EXPECT_EQ(parseError(ErrorKind::Name, "fusion {\n  output %z\n}\n"), "bad.mf:2:10: undefined value %z");
}

// ---- meshes and placements -----------------------------------------------------------

TEST(ErrorMessages, MalformedMeshes) {
  EXPECT_EQ(parseError(ErrorKind::Mesh, "fusion {\n  mesh @m = [[0, 1], [2]]\n}\n"),
            "bad.mf:2:22: malformed mesh: ragged nesting (a list of 1 where the first list at this level had 2)");
  EXPECT_EQ(parseError(ErrorKind::Mesh, "fusion {\n  mesh @m = [0, 1, 1]\n}\n"),
            "bad.mf:2:13: malformed mesh: device id 1 appears twice");
  EXPECT_THAT(parseError(ErrorKind::Mesh, "fusion {\n  mesh @m = [[0, 1], 2]\n}\n"),
              HasSubstr("mixes device ids and nested lists"));
  EXPECT_EQ(userErrorMessage(ErrorKind::Mesh,
                             [] {
                               DeviceMesh({0, 1, 2}, {2, 2});
                             }),
            "malformed mesh: shape [2, 2] holds 4 devices but 3 device ids were given");
  EXPECT_EQ(userErrorMessage(ErrorKind::Mesh,
                             [] {
                               DeviceMesh({0, 1, 1});
                             }),
            "malformed mesh: device id 1 appears twice");
  EXPECT_THAT(userErrorMessage(ErrorKind::Mesh, [] { DeviceMesh({0, -2}); }), HasSubstr("device id -2 is negative"));
  EXPECT_THAT(userErrorMessage(ErrorKind::Mesh, [] { DeviceMesh(Ints{}); }), HasSubstr("at least one device"));
  EXPECT_THAT(userErrorMessage(ErrorKind::Mesh,
                               [] {
                                 DeviceMesh({0, 1}, {1, 1, 1, 2});
                               }),
              HasSubstr("rank 4 mesh, but at most 3 mesh axes"));
}

TEST(ErrorMessages, MeshNestedBeyondTheRankLimitStopsAtTheFourthBracket) {
  // 50,000 levels: rejected at the first level too many, before the parser recurses further.
  std::string deep = "fusion {\n  mesh @m = " + std::string(50000, '[') + "0" + std::string(50000, ']') + "\n}\n";
  EXPECT_EQ(parseError(ErrorKind::Mesh, deep),
            "bad.mf:2:16: malformed mesh: nested more than 3 deep, but at most 3 mesh axes (DIDz, DIDy, DIDx) are "
            "supported");
  EXPECT_NO_THROW(
      parseFusion("fusion {\n  mesh @m = [[[0, 1]], [[2, 3]]]\n  %x = input f32[2] @m\n  output %x\n}\n", "ok.mf"));
}

TEST(ErrorMessages, DeviceIdsBeforeANestedListAreMalformed) {
  // [0, [1]] mixes a device id and a nested list just like [[0, 1], 2] does.
  EXPECT_THAT(parseError(ErrorKind::Mesh, "fusion {\n  mesh @m = [0, [1]]\n}\n"), HasSubstr("bad.mf:2:"));
}

TEST(ErrorMessages, DidAxisBeyondTheMeshRank) {
  Fusion f;
  TensorView* x = f.defineTensor({4}, DataType::Float, "x");
  x->setDeviceMesh(DeviceMesh({0, 1}))->split(0, 2);
  EXPECT_THAT(userErrorMessage(ErrorKind::Placement, [&] { x->parallelize(0, ParallelType::DIDy); }),
              HasSubstr("DIDy is beyond the axes of rank-1 mesh [0, 1] (which has DIDx)"));
  EXPECT_THAT(
      parseError(ErrorKind::Placement,
                 "fusion {\n  mesh @m = [0, 1]\n  %x = input f32[4] @m {split(0, 2), parallelize(0, DIDy)}\n}\n"),
      AllOf(StartsWith("bad.mf:3:38: "), HasSubstr("DIDy is beyond the axes of rank-1 mesh [0, 1]")));
}

TEST(ErrorMessages, DidAxisBeyondTheMeshRankNamesTheTensor) {
  // val.h: the schedule API throws "with the tensor's name on bad arguments".
  Fusion f;
  TensorView* x = f.defineTensor({4}, DataType::Float, "x");
  x->setDeviceMesh(DeviceMesh({0, 1}))->split(0, 2);
  EXPECT_THAT(userErrorMessage(ErrorKind::Placement, [&] { x->parallelize(0, ParallelType::DIDy); }),
              AllOf(HasSubstr("%x"), HasSubstr("DIDy")));
}

TEST(ErrorMessages, PlacementsThatDoNotFit) {
  Fusion f;
  TensorView* x = f.defineTensor({6, 16}, DataType::Float, "x");
  const DeviceMesh grid({0, 1, 2, 3}, {2, 2});
  EXPECT_EQ(userErrorMessage(ErrorKind::Placement, [&] { applyPlacements(x, grid, {Placement::shard(0)}); }),
            "%x: got 1 placements [Shard(0)] for a rank-2 mesh [[0, 1], [2, 3]] (one placement per mesh axis is "
            "needed)");
  EXPECT_EQ(userErrorMessage(ErrorKind::Placement,
                             [&] {
                               applyPlacements(x, grid, {Placement::replicate(), Placement::shard(-3)});
                             }),
            "%x: placement Shard(-3) on mesh axis 1 names a dim that %x of rank 2 does not have");
}

TEST(ErrorMessages, AFusionWithoutOutputs) {
  EXPECT_EQ(parseError(ErrorKind::Value, "fusion {\n  %a = input f32[4]\n  %b = neg(%a)\n}\n"),
            "bad.mf:4:1: the fusion has no outputs: nothing it computes would be returned (mark results with "
            "`output %x` or add_output)");
}

TEST(ErrorMessages, ArgumentsGivenTwiceAreRejectedAtTheSecond) {
  const std::string head = "fusion {\n  %x = input f32[2, 4]\n  %w = input f32[3, 4]\n  %b = input f32[3]\n";
  EXPECT_EQ(parseError(ErrorKind::Parse, head + "  %y = linear(%x, %w, bias=%b, bias=%b)\n  output %y\n}\n"),
            "bad.mf:5:32: linear: operand 'bias' is given twice");
  EXPECT_EQ(parseError(ErrorKind::Parse, head + "  %y = sum(%x, dims=[0], dims=[5])\n  output %y\n}\n"),
            "bad.mf:5:26: sum: attribute 'dims' is given twice");
  EXPECT_EQ(parseError(ErrorKind::Parse, head + "  %y = linear(%x, bias=%b, %w)\n  output %y\n}\n"),
            "bad.mf:5:28: linear: a positional operand after named arguments");
}

TEST(ErrorMessages, UnknownStringEscapesAreRejectedWithTheirLocation) {
  EXPECT_EQ(
      parseError(ErrorKind::Parse, "fusion {\n  %x = input f32[4]\n  %y = gelu(%x, approximate=\"ta\\qnh\")\n}\n"),
      "bad.mf:3:32: unknown escape '\\q' in a string (known: \\\\ \\\" \\n \\t \\r \\xNN)");
  // The escapes the printer writes are read back.
  std::unique_ptr<Fusion> f =
      parseFusion("fusion {\n  %x = input f32[4]\n  %y = gelu(%x, approximate=\"\\x74a\\x6eh\")\n  output %y\n}\n");
  EXPECT_EQ(f->exprs()[0]->attr<std::string>("approximate"), "tanh");
}

TEST(ErrorMessages, MessagesEscapeBytesThatAreNotPrintable) {
  EXPECT_EQ(parseError(ErrorKind::Parse, "\x01\x02"), "bad.mf:1:1: unexpected character '\\x01'");
  EXPECT_EQ(parseError(ErrorKind::Parse, "fusion {\n  %x = input f32[4]\n  \xC3\xA9\n}\n"),
            "bad.mf:3:3: unexpected character '\\xC3'");
  EXPECT_EQ(parseError(ErrorKind::Parse,
                       "\xEF\xBB\xBF"
                       "fusion {\n}\n"),
            "bad.mf:1:1: the file starts with a UTF-8 byte-order mark (bytes \\xEF\\xBB\\xBF); save it without one");
  EXPECT_EQ(parseError(ErrorKind::Value, "fusion {\n  %x = input f32[4]\n  %y = gelu(%x, approximate=\"a\tb\")\n}\n"),
            "bad.mf:3:8: gelu: approximate must be \"none\" or \"tanh\" but is \"a\\tb\"");
  EXPECT_EQ(parseError(ErrorKind::Parse, "fusion {\n  %x = input f32[4]\n  output \"a\x1b[31m\"\n}\n"),
            "bad.mf:3:10: expected a value name like %3 but found string \"a\\x1B[31m\"");
}

// ---- parse errors at known positions -------------------------------------------------

TEST(ErrorMessages, ParseErrorsPointAtTheOffendingToken) {
  const std::string x = "fusion {\n  %x = input f32[4]\n";
  EXPECT_EQ(parseError(ErrorKind::Parse, x + "  %y = frobnicate(%x)\n}\n"), "bad.mf:3:8: unknown op 'frobnicate'");
  EXPECT_EQ(parseError(ErrorKind::Parse, x + "  %y neg(%x)\n}\n"), "bad.mf:3:6: expected '=' but found 'neg'");
  EXPECT_EQ(parseError(ErrorKind::Parse, x + "  %y = gelu(%x, approximate=\"tanh)\n}\n"),
            "bad.mf:3:29: unterminated string");
  EXPECT_EQ(parseError(ErrorKind::Parse, x + "  %y = neg(%x) $\n}\n"), "bad.mf:3:16: unexpected character '$'");
  EXPECT_THAT(parseError(ErrorKind::Parse, x + "  %y = neg(%x)\n"),
              HasSubstr("bad.mf:4:1: expected '}' to close the fusion but found end of input"));
  EXPECT_EQ(parseError(ErrorKind::Parse, x + "  %y = sum(%x, dims=0)\n}\n"),
            "bad.mf:3:21: expected '[' but found number 0");
  EXPECT_EQ(parseError(ErrorKind::Parse, "fusion {\n  %x = input f32[4] {parallelize(0, DIDw)}\n}\n"),
            "bad.mf:2:37: unknown parallel type 'DIDw' (expected DIDx, DIDy, DIDz, Stream or Serial)");
  EXPECT_EQ(parseError(ErrorKind::Parse, "graph {\n}\n"), "bad.mf:1:1: expected 'fusion' but found 'graph'");
}

TEST(ErrorMessages, MissingCloseParen) {
  std::string msg = parseError(ErrorKind::Parse, "fusion {\n  %x = input f32[4]\n  %y = neg(%x\n  output %y\n}\n");
  EXPECT_THAT(msg, StartsWith("bad.mf:4:3: expected "));
  EXPECT_THAT(msg, HasSubstr("but found 'output'"));
}

TEST(ErrorMessages, MissingCloseParenSaysWhatWasExpected) {
  // Reported as "expected ',' but found 'output'", which never mentions the missing ')'.
  std::string msg = parseError(ErrorKind::Parse, "fusion {\n  %x = input f32[4]\n  %y = neg(%x\n  output %y\n}\n");
  EXPECT_THAT(msg, HasSubstr("')'"));
}

TEST(ErrorMessages, BadDtypesInText) {
  EXPECT_EQ(parseError(ErrorKind::Dtype, "fusion {\n  %x = input f33[4]\n}\n"),
            "bad.mf:2:14: unknown dtype 'f33' (expected f32, bf16, f16, i64 or bool)");
  EXPECT_EQ(parseError(ErrorKind::Dtype, "fusion {\n  %i = input i64[4]\n  %y = exp(%i)\n}\n"),
            "bad.mf:3:8: exp: expected a floating-point tensor (f32, bf16, f16) but %i is i64");
  EXPECT_THAT(parseError(ErrorKind::Dtype, "fusion {\n  %x = input f32[4]\n  %y = cast(%x, dtype=f64)\n}\n"),
              HasSubstr("bad.mf:3:23: unknown dtype 'f64'"));
}

TEST(ErrorMessages, AnnotationsAndAttributesInText) {
  const std::string x = "fusion {\n  %x = input f32[4]\n";
  EXPECT_EQ(parseError(ErrorKind::Shape, x + "  %y = neg(%x) : f32[8]\n}\n"),
            "bad.mf:3:18: the annotated type f32[8] does not match the type f32[4] that neg produces");
  EXPECT_EQ(parseError(ErrorKind::Value, x + "  %y = neg(%x, alpha=2)\n}\n"),
            "bad.mf:3:16: neg has no operand or attribute named 'alpha'");
  EXPECT_EQ(parseError(ErrorKind::Value, x + "  %y = sum(%x)\n}\n"),
            "bad.mf:3:8: sum: missing required attribute 'dims' (ints)");
  EXPECT_EQ(parseError(ErrorKind::Shape, "fusion {\n  %x = input f32[-3]\n}\n"),
            "bad.mf:2:3: input %x: dim 0 has negative size -3");
}

TEST(ErrorMessages, PartialDimsOfAnInputMustComeLast) {
  // parser.cpp says "reduction (Partial) dims of an input must come last" but never fires:
  // f32[r2, 8] is silently read as f32[8, r2], so schedule axes then point at other dims.
  EXPECT_THAT(parseError(ErrorKind::Parse, "fusion {\n  %x = input f32[r2, 8]\n}\n"),
              HasSubstr("bad.mf:2:14: reduction (Partial) dims of an input must come last"));
}

TEST(ErrorMessages, OutOfRangeNumbersAreParseErrors) {
  EXPECT_THAT(parseError(ErrorKind::Parse, "fusion {\n  %x = input f32[99999999999999999999]\n}\n"),
              HasSubstr("bad.mf:2:"));
  EXPECT_THAT(parseError(ErrorKind::Parse, "fusion {\n  %x = input f32[4]\n  %y = add(%x, -.)\n}\n"),
              HasSubstr("bad.mf:3:"));
}

TEST(ErrorMessages, CatWithAScalarOperand) {
  Fusion f;
  TensorView* x = f.defineTensor({4}, DataType::Float, "x");
  EXPECT_THAT(userErrorMessage(ErrorKind::Value,
                               [&] {
                                 f.apply(OpKind::Cat, {x, f.scalar(1.0)}, {{"dim", int64_t{0}}});
                               }),
              HasSubstr("cat: operand 'xs' must be a tensor, got scalar 1.0"));
}

}  // namespace
}  // namespace meshfuse
