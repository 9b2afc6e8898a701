// The IR verifier: one test per check, each asserting the message. Structural and type defects
// only a pass can make are internal errors; defects a user's fusion can carry (DID axes, meshes,
// no outputs) are UserErrors.
#include "meshfuse/ir/verifier.h"

#include <gmock/gmock-matchers.h>
#include <gtest/gtest.h>

#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/parser.h"
#include "test_helpers.h"

namespace meshfuse {

// Builds IR that the Fusion API cannot: it is the verifier's job to catch such IR when a pass
// corrupts the fusion's lists.
struct FusionTestAccess {
  static void appendExpr(Fusion& f, Expr* e) { f.exprs_.push_back(e); }
  static void appendInput(Fusion& f, TensorView* tv) { f.inputs_.push_back(tv); }
};

namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using testing_helpers::userErrorMessage;

// The message of the InternalError `f` throws ("" and a failure otherwise).
template <typename F>
std::string internalErrorMessage(F&& f) {
  try {
    f();
  } catch (const InternalError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected an InternalError but got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected an InternalError but nothing was thrown";
  return "";
}

TEST(Verifier, AcceptsWhatTheApiBuilds) {
  std::unique_ptr<Fusion> f = parseFusion(R"(fusion {
  mesh @m = [0, 1]
  %x = input f32[?t, 8] @m {split(1, 2), parallelize(1, DIDx)}
  %w = input f32[6, 8] @m {split(1, 2), parallelize(1, DIDx)}
  %y = linear(%x, %w) : f32[?t, 6, r8] @m {split(2, 2), parallelize(2, DIDx)}
  %z = neg(%y) : f32[?t, 6, r2] @m {parallelize(2, DIDx)}
  output %z
}
)");
  EXPECT_NO_THROW(verify(*f, {.require_meshes = true}));  // Partial dims are placement, not type
}

TEST(Verifier, UseBeforeDefinition) {
  Fusion f;
  TensorView* a = f.defineTensor({4}, DataType::Float, "a");
  TensorView* b = f.apply(OpKind::Neg, {a}, {}, "b");
  TensorView* c = f.apply(OpKind::Exp, {a}, {}, "c");
  f.addOutput(c);
  f.replaceOperand(b->definition(), a, c);  // %b = neg(%c) comes before %c's definition
  EXPECT_THAT(internalErrorMessage([&] { verify(f); }), EndsWith("%b = neg(%c): uses %c before its definition"));
}

TEST(Verifier, ValueDefinedTwice) {
  Fusion f;
  TensorView* a = f.defineTensor({4}, DataType::Float, "a");
  TensorView* b = f.apply(OpKind::Neg, {a}, {}, "b");
  f.addOutput(b);
  FusionTestAccess::appendExpr(f, b->definition());
  EXPECT_THAT(internalErrorMessage([&] { verify(f); }), EndsWith("%b is defined twice"));
}

TEST(Verifier, InputWithADefinition) {
  Fusion f;
  TensorView* a = f.defineTensor({4}, DataType::Float, "a");
  TensorView* b = f.apply(OpKind::Neg, {a}, {}, "b");
  f.addOutput(b);
  FusionTestAccess::appendInput(f, b);
  EXPECT_THAT(internalErrorMessage([&] { verify(f); }), EndsWith("input %b has a definition"));
}

TEST(Verifier, OperandOfAnotherFusion) {
  Fusion f, g;
  TensorView* a = f.defineTensor({4}, DataType::Float, "a");
  TensorView* b = f.apply(OpKind::Neg, {a}, {}, "b");
  f.addOutput(b);
  f.replaceOperand(b->definition(), a, g.defineTensor({4}, DataType::Float, "other"));
  EXPECT_THAT(internalErrorMessage([&] { verify(f); }),
              EndsWith("%b = neg(%other): an operand belongs to another fusion"));
}

TEST(Verifier, OutputNeverDefined) {
  Fusion f;
  TensorView* a = f.defineTensor({4}, DataType::Float, "a");
  TensorView* b = f.apply(OpKind::Neg, {a}, {}, "b");
  TensorView* c = f.apply(OpKind::Exp, {a}, {}, "c");
  f.addOutput(c);
  f.removeExpr(b->definition());
  f.replaceOutput(c, b);  // the output is the result of an op no longer in the program
  f.removeExpr(c->definition());
  EXPECT_THAT(internalErrorMessage([&] { verify(f); }), EndsWith("output %b is never defined"));
}

TEST(Verifier, NoOutputsIsAUserErrorWhenCompiled) {
  Fusion f;
  f.apply(OpKind::Neg, {f.defineTensor({4}, DataType::Float, "a")});
  EXPECT_NO_THROW(verify(f)) << "a definition may be empty while it is being built";
  EXPECT_EQ(userErrorMessage(ErrorKind::Value, [&] { requireOutputs(f); }),
            "the fusion has no outputs: nothing it computes would be returned (mark results with `output %x` or "
            "add_output)");
}

TEST(Verifier, WrongDtypeAndShapeAfterReplaceOperand) {
  // An operand replaced by one of another type: %0 = neg(%b) : f32[4] where %b became i64[7, 3].
  Fusion f;
  TensorView* a = f.defineTensor({4}, DataType::Float, "a");
  TensorView* b = f.defineTensor({7, 3}, DataType::Int64, "b");
  TensorView* y = f.apply(OpKind::Neg, {a});
  f.addOutput(y);
  f.replaceOperand(y->definition(), a, b);
  EXPECT_THAT(internalErrorMessage([&] { verify(f); }),
              EndsWith("%0 = neg(%b): the output is f32[4] but neg of its operands gives i64[7, 3]"));
}

TEST(Verifier, WrongDtype) {
  Fusion f;
  TensorView* a = f.defineTensor({4}, DataType::Float, "a");
  TensorView* h = f.defineTensor({4}, DataType::Half, "h");
  TensorView* y = f.apply(OpKind::Exp, {a}, {}, "y");
  f.addOutput(y);
  f.replaceOperand(y->definition(), a, h);
  EXPECT_THAT(internalErrorMessage([&] { verify(f); }),
              EndsWith("%y = exp(%h): the output is f32[4] but exp of its operands gives f16[4]"));
}

TEST(Verifier, WrongShape) {
  Fusion f;
  TensorView* x = f.defineTensor({Extent::symbolic("t"), 8}, DataType::Float, "x");
  TensorView* x2 = f.defineTensor({Extent::symbolic("t"), 16}, DataType::Float, "x2");
  TensorView* w = f.defineTensor({6, 8}, DataType::Float, "w");
  TensorView* w2 = f.defineTensor({5, 16}, DataType::Float, "w2");
  TensorView* y = f.apply(OpKind::Linear, {x, w}, {}, "y");
  f.addOutput(y);
  f.replaceOperand(y->definition(), x, x2);
  f.replaceOperand(y->definition(), w, w2);
  EXPECT_THAT(internalErrorMessage([&] { verify(f); }),
              EndsWith("%y = linear(%x2, %w2): the output is f32[?t, 6, r8] but linear of its operands gives "
                       "f32[?t, 5, r16]"));
}

TEST(Verifier, OperandsTheOpNoLongerAccepts) {
  Fusion f;
  TensorView* a = f.defineTensor({4}, DataType::Float, "a");
  TensorView* b = f.defineTensor({4}, DataType::Float, "b");
  TensorView* c = f.defineTensor({5}, DataType::Float, "c");
  TensorView* y = f.apply(OpKind::Add, {a, b}, {}, "y");
  f.addOutput(y);
  f.replaceOperand(y->definition(), b, c);
  EXPECT_THAT(internalErrorMessage([&] { verify(f); }),
              EndsWith("%y = add(%a, %c): the op does not accept its operands: add: dim 0 mismatch: %a has 4 but "
                       "%c has 5"));
}

TEST(Verifier, DidWithoutAMesh) {
  std::unique_ptr<Fusion> f =
      parseFusion("fusion {\n  %x = input f32[4] {split(0, 2), parallelize(0, DIDx)}\n  output %x\n}\n");
  EXPECT_EQ(userErrorMessage(ErrorKind::Placement, [&] { verify(*f); }),
            "%x: loop axis 0 is parallelized on DIDx but the tensor has no mesh");
}

TEST(Verifier, DidBeyondTheMeshRank) {
  Fusion f;
  TensorView* x = f.defineTensor({4}, DataType::Float, "x");
  x->split(0, 2)->parallelize(0, ParallelType::DIDy);  // no mesh yet: not checked here
  x->setDeviceMesh(DeviceMesh({0, 1}));
  f.addOutput(x);
  EXPECT_EQ(userErrorMessage(ErrorKind::Placement, [&] { verify(f); }),
            "%x: loop axis 0 is parallelized on DIDy, which is beyond the axes of rank-1 mesh [0, 1]");
}

TEST(Verifier, DidExtentDiffersFromTheMeshAxis) {
  Fusion f;
  TensorView* x = f.defineTensor({8}, DataType::Float, "x");
  x->setDeviceMesh(DeviceMesh({0, 1}));
  x->split(0, 2)->parallelize(0, ParallelType::DIDx);
  x->setDeviceMesh(DeviceMesh({0, 1, 2, 3}));  // the DID axis still has 2 parts
  f.addOutput(x);
  EXPECT_EQ(userErrorMessage(ErrorKind::Placement, [&] { verify(f); }),
            "%x: loop axis 0 (DIDx) has extent 2 but mesh axis 0 of [0, 1, 2, 3] has 4 devices");
}

TEST(Verifier, MeshRequiredAfterPropagation) {
  std::unique_ptr<Fusion> f = parseFusion("fusion {\n  %x = input f32[4]\n  output %x\n}\n");
  EXPECT_NO_THROW(verify(*f));
  EXPECT_EQ(userErrorMessage(ErrorKind::Placement, [&] { verify(*f, {.require_meshes = true}); }),
            "%x has no device mesh");
}

}  // namespace
}  // namespace meshfuse
