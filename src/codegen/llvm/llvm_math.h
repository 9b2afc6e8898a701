// Branch-free f32 math and 16-bit float conversions as plain LLVM IR (no calls), so that loops
// using them vectorize: LLVM has no vectorizable exp/log/tanh/erf without a vector library.
//
//   exp   Cephes expf: x = n ln2 + r, a degree-6 polynomial for e^r, 2^n from exponent bits
//         (two factors, so results down to the subnormals and up to FLT_MAX are exact-range)
//   log   Cephes logf: mantissa/exponent split, degree-9 polynomial
//   tanh  Eigen's 13/6 rational approximation on [-7.9, 7.9] (|error| <= 4e-7)
//   erf   Eigen's 13/8 rational approximation on [-4, 4] (|error| <= 5e-7)
// Special values follow libm: exp(-inf) = 0, exp(+inf) = inf, log(0) = -inf, log(x < 0) = NaN,
// NaN in gives NaN out. The unit tests compare each against libm over a dense range.
#pragma once

#include <llvm/IR/IRBuilder.h>

namespace meshfuse::cpu {

llvm::Value* emitExp(llvm::IRBuilder<>& b, llvm::Value* x);
llvm::Value* emitLog(llvm::IRBuilder<>& b, llvm::Value* x);
llvm::Value* emitTanh(llvm::IRBuilder<>& b, llvm::Value* x);
llvm::Value* emitErf(llvm::IRBuilder<>& b, llvm::Value* x);

// bf16 <-> f32 on bit patterns (i16): widening is exact; narrowing rounds to nearest even and
// keeps NaN a (quiet) NaN, as floatToBf16Bits does.
llvm::Value* emitBf16ToF32(llvm::IRBuilder<>& b, llvm::Value* bits);
llvm::Value* emitF32ToBf16(llvm::IRBuilder<>& b, llvm::Value* x);
// IEEE half <-> f32 on bit patterns (i16), round to nearest even (F16C instructions on x86).
llvm::Value* emitHalfToF32(llvm::IRBuilder<>& b, llvm::Value* bits);
llvm::Value* emitF32ToHalf(llvm::IRBuilder<>& b, llvm::Value* x);

}  // namespace meshfuse::cpu
