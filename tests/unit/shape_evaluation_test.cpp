// Evaluating shapes: element counts that overflow, symbolic sizes bound at run time, sizes a
// reshape cannot produce, and tensors too large to exist. Each is a ShapeError/RuntimeError
// naming the tensor (and the op that defines it), never a wrapped-around size or an abort.
#include <gmock/gmock-matchers.h>
#include <gtest/gtest.h>

#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/ir/placement.h"
#include "meshfuse/reference.h"
#include "meshfuse/tensor.h"
#include "test_helpers.h"

namespace meshfuse {
namespace {

using ::testing::HasSubstr;
using testing_helpers::userErrorMessage;
using Ints = std::vector<int64_t>;

std::string parseError(const std::string& text) {
  return userErrorMessage(ErrorKind::Shape, [&] { parseFusion(text, "bad.mf"); });
}

TEST(ShapeEvaluation, CheckedNumel) {
  EXPECT_EQ(checkedNumel({}), 1);
  EXPECT_EQ(checkedNumel({3, 4}, 4), 12);
  EXPECT_EQ(checkedNumel({int64_t{1} << 62, int64_t{1} << 62, 0}), 0) << "a zero size wins over an overflow";
  EXPECT_EQ(checkedNumel({int64_t{1} << 62, int64_t{1} << 62}), std::nullopt);  // wraps to 0 unchecked
  EXPECT_EQ(checkedNumel({4294967296, 4294967297}), std::nullopt);
  EXPECT_EQ(checkedNumel({3037000500, 3037000500}), std::nullopt);
  EXPECT_EQ(checkedNumel({int64_t{1} << 61}, 1), int64_t{1} << 61);
  EXPECT_EQ(checkedNumel({int64_t{1} << 61}, 4), std::nullopt) << "elements fit but bytes do not";
  EXPECT_EQ(numel({2, 3, 4}), 24);
}

TEST(ShapeEvaluation, ConstantSizesThatOverflowAreRejectedWhereDefined) {
  Fusion f;
  EXPECT_EQ(userErrorMessage(ErrorKind::Shape,
                             [&] {
                               f.defineTensor({int64_t{1} << 62, int64_t{1} << 62}, DataType::Float, "a");
                             }),
            "input %a: shape [4611686018427387904, 4611686018427387904] of f32 has more elements or bytes than an "
            "int64 can count");
  EXPECT_THAT(parseError("fusion {\n  %a = input f32[3037000500, 3037000500]\n}\n"),
              HasSubstr("bad.mf:2:3: input %a: shape [3037000500, 3037000500] of f32 has more elements"));
  // An op whose output is too large (broadcast to absurd sizes) is rejected as well.
  TensorView* x = f.defineTensor({1}, DataType::Float, "x");
  EXPECT_EQ(userErrorMessage(ErrorKind::Shape,
                             [&] {
                               f.apply(OpKind::BroadcastInDim, {x},
                                       {{"shape", Ints{4294967296, 4294967297}}, {"broadcast_dims", Ints{1}}});
                             }),
            "broadcast_in_dim: the output: shape [4294967296, 4294967297] of f32 has more elements or bytes than an "
            "int64 can count");
}

TEST(ShapeEvaluation, SymbolicSizesAreCheckedWhenBound) {
  Fusion f;
  TensorView* a = f.defineTensor({Extent::symbolic("t"), Extent::symbolic("u")}, DataType::Float, "a");
  EXPECT_EQ(a->evaluateShape({{"t", 3}, {"u", 5}}), (Ints{3, 5}));
  EXPECT_EQ(userErrorMessage(ErrorKind::Shape,
                             [&] {
                               a->evaluateShape({{"t", 4294967296}, {"u", 4294967297}});
                             }),
            "input %a: shape [4294967296, 4294967297] of f32 has more elements or bytes than an int64 can count");
  EXPECT_EQ(userErrorMessage(ErrorKind::Shape,
                             [&] {
                               a->evaluateShape({{"t", 3}});
                             }),
            "input %a: symbolic size ?u is not bound");
}

TEST(ShapeEvaluation, SymbolicReshapeThatDoesNotDivideNamesTheReshape) {
  auto f = parseFusion(R"(fusion {
  %a = input f32[?t, 8]
  %b = reshape(%a, shape=[-1, 3])
  output %b
}
)",
                       "r.mf");
  const TensorView* b = f->outputs()[0];
  EXPECT_EQ(b->evaluateShape({{"t", 3}}), (Ints{8, 3}));
  EXPECT_EQ(userErrorMessage(ErrorKind::Shape,
                             [&] {
                               b->evaluateShape({{"t", 8}});
                             }),
            "%b = reshape(%a, shape=[-1, 3]): size ?t*8/3 is not an integer for ?t = 8 (64 is not divisible by 3)");
  // Run time: the same error, from the reference executor.
  EXPECT_THAT(userErrorMessage(ErrorKind::Shape,
                               [&] {
                                 evaluateReference(*f, {Tensor(DataType::Float, {8, 8})});
                               }),
              HasSubstr("%b = reshape(%a, shape=[-1, 3]): size ?t*8/3 is not an integer"));
}

TEST(ShapeEvaluation, HostTensorsBeyondTheAddressSpaceAreRefused) {
  EXPECT_EQ(userErrorMessage(ErrorKind::Runtime, [] { Tensor::empty(DataType::Float, {int64_t{1} << 46}); }),
            "cannot allocate a f32 tensor of shape [70368744177664]: 281474976710656 bytes, more than the 128 TiB a "
            "process can address");
  EXPECT_THAT(userErrorMessage(ErrorKind::Shape,
                               [] {
                                 Tensor::empty(DataType::Float, {int64_t{1} << 62, 4});
                               }),
              HasSubstr("has more elements or bytes than an int64 can count"));
}

TEST(ShapeEvaluation, RunTimeSizeMismatchesNameBothTensorsAndTheOp) {
  auto f = parseFusion(R"(fusion {
  %a = input f32[?t]
  %b = input f32[?t]
  %c = input f32[?u]
  %d = add(%a, %c)
  output %d
}
)",
                       "m.mf");
  // One symbol bound twice by the inputs: both inputs, both dims.
  EXPECT_EQ(userErrorMessage(ErrorKind::Shape,
                             [&] {
                               evaluateReference(*f, {Tensor(DataType::Float, {4}), Tensor(DataType::Float, {5}),
                                                      Tensor(DataType::Float, {4})});
                             }),
            "input 1 (%b): dim 0 is ?t = 5 but input 0 (%a) has ?t = 4 (dim 0)");
  // Two symbols an op requires equal: the op by its output and operands, and both tensors.
  EXPECT_EQ(userErrorMessage(ErrorKind::Shape,
                             [&] {
                               evaluateReference(*f, {Tensor(DataType::Float, {4}), Tensor(DataType::Float, {4}),
                                                      Tensor(DataType::Float, {6})});
                             }),
            "%d = add(%a, %c): dim 0 mismatch: %a has ?t = 4 but %c has ?u = 6");
}

}  // namespace
}  // namespace meshfuse
