// Vectorizable f32 math in LLVM IR (contract in llvm_math.h).
#include "codegen/llvm/llvm_math.h"

#include <llvm/IR/Intrinsics.h>

#include <cmath>
#include <initializer_list>

namespace meshfuse::cpu {
namespace {

llvm::Value* c(llvm::IRBuilder<>& b, double v) { return llvm::ConstantFP::get(b.getFloatTy(), v); }

// Horner: ((c0 * x + c1) * x + c2) ...
llvm::Value* horner(llvm::IRBuilder<>& b, llvm::Value* x, std::initializer_list<double> coeffs) {
  llvm::Value* p = nullptr;
  for (double k : coeffs) p = p == nullptr ? c(b, k) : b.CreateFAdd(b.CreateFMul(p, x), c(b, k));
  return p;
}

// x clamped to [lo, hi]; NaN stays NaN (ordered compares are false on NaN).
llvm::Value* clamp(llvm::IRBuilder<>& b, llvm::Value* x, double lo, double hi) {
  x = b.CreateSelect(b.CreateFCmpOGT(x, c(b, hi)), c(b, hi), x);
  return b.CreateSelect(b.CreateFCmpOLT(x, c(b, lo)), c(b, lo), x);
}

// 2^n for an i32 n in [-126, 127], from the exponent bits.
llvm::Value* pow2(llvm::IRBuilder<>& b, llvm::Value* n) {
  llvm::Value* bits = b.CreateShl(b.CreateAdd(n, b.getInt32(127)), 23);
  return b.CreateBitCast(bits, b.getFloatTy());
}

// Within these formulas floating-point ops may fuse (FMA) but never reassociate: that would
// undo the two-part ln2 of exp's range reduction.
class ContractOnly {
 public:
  explicit ContractOnly(llvm::IRBuilder<>& b) : guard_(b) {
    llvm::FastMathFlags f;
    f.setAllowContract(true);
    b.setFastMathFlags(f);
  }

 private:
  llvm::IRBuilder<>::FastMathFlagGuard guard_;
};

}  // namespace

llvm::Value* emitExp(llvm::IRBuilder<>& b, llvm::Value* x) {
  ContractOnly guard(b);
  const double hi = 88.72283935546875, lo = -104.0;
  llvm::Value* xc = clamp(b, x, lo, hi);
  llvm::Value* fx =
      b.CreateUnaryIntrinsic(llvm::Intrinsic::floor, b.CreateFAdd(b.CreateFMul(xc, c(b, M_LOG2E)), c(b, 0.5)));
  // r = x - n ln2, with ln2 split in two so that n * C1 is exact.
  llvm::Value* r =
      b.CreateFSub(b.CreateFSub(xc, b.CreateFMul(fx, c(b, 0.693359375))), b.CreateFMul(fx, c(b, -2.12194440e-4)));
  llvm::Value* z = b.CreateFMul(r, r);
  llvm::Value* p = horner(
      b, r, {1.9875691500E-4, 1.3981999507E-3, 8.3334519073E-3, 4.1665795894E-2, 1.6666665459E-1, 5.0000001201E-1});
  p = b.CreateFAdd(b.CreateFAdd(b.CreateFMul(p, z), r), c(b, 1.0));
  // n in [-150, 128]: 2^n as 2^(n/2) * 2^(n - n/2), both factors in range.
  llvm::Value* n = b.CreateFPToSI(fx, b.getInt32Ty());
  llvm::Value* n1 = b.CreateAShr(n, 1);
  llvm::Value* y = b.CreateFMul(b.CreateFMul(p, pow2(b, n1)), pow2(b, b.CreateSub(n, n1)));
  y = b.CreateSelect(b.CreateFCmpOGT(x, c(b, hi)), c(b, INFINITY), y);
  y = b.CreateSelect(b.CreateFCmpOLT(x, c(b, lo)), c(b, 0.0), y);
  return b.CreateSelect(b.CreateFCmpUNO(x, x), x, y);
}

llvm::Value* emitLog(llvm::IRBuilder<>& b, llvm::Value* x) {
  ContractOnly guard(b);
  llvm::Type* i32 = b.getInt32Ty();
  // Subnormal inputs are scaled into the normal range first (and the exponent corrected).
  llvm::Value* tiny = b.CreateFCmpOLT(x, c(b, 1.17549435e-38));
  llvm::Value* xs = b.CreateSelect(tiny, b.CreateFMul(x, c(b, 8388608.0)), x);
  llvm::Value* bits = b.CreateBitCast(xs, i32);
  llvm::Value* e =
      b.CreateSIToFP(b.CreateSub(b.CreateAnd(b.CreateLShr(bits, 23), 0xff), b.getInt32(126)), b.getFloatTy());
  e = b.CreateFSub(e, b.CreateSelect(tiny, c(b, 23.0), c(b, 0.0)));
  // m in [0.5, 1); below sqrt(1/2) use 2m (and e - 1) so that m - 1 is small.
  llvm::Value* m = b.CreateBitCast(b.CreateOr(b.CreateAnd(bits, 0x807fffff), 0x3f000000), b.getFloatTy());
  llvm::Value* small = b.CreateFCmpOLT(m, c(b, 0.707106781186547524));
  e = b.CreateFSub(e, b.CreateSelect(small, c(b, 1.0), c(b, 0.0)));
  m = b.CreateFSub(b.CreateSelect(small, b.CreateFAdd(m, m), m), c(b, 1.0));
  llvm::Value* z = b.CreateFMul(m, m);
  llvm::Value* y = horner(b, m,
                          {7.0376836292E-2, -1.1514610310E-1, 1.1676998740E-1, -1.2420140846E-1, 1.4249322787E-1,
                           -1.6668057665E-1, 2.0000714765E-1, -2.4999993993E-1, 3.3333331174E-1});
  y = b.CreateFMul(b.CreateFMul(y, m), z);
  y = b.CreateFAdd(y, b.CreateFMul(e, c(b, -2.12194440e-4)));
  y = b.CreateFSub(y, b.CreateFMul(z, c(b, 0.5)));
  llvm::Value* r = b.CreateFAdd(b.CreateFAdd(m, y), b.CreateFMul(e, c(b, 0.693359375)));
  r = b.CreateSelect(b.CreateFCmpOEQ(x, c(b, INFINITY)), x, r);
  r = b.CreateSelect(b.CreateFCmpOEQ(x, c(b, 0.0)), c(b, -INFINITY), r);
  r = b.CreateSelect(b.CreateFCmpOLT(x, c(b, 0.0)), c(b, NAN), r);
  return b.CreateSelect(b.CreateFCmpUNO(x, x), x, r);
}

llvm::Value* emitTanh(llvm::IRBuilder<>& b, llvm::Value* x) {
  ContractOnly guard(b);
  llvm::Value* xc = clamp(b, x, -7.90531110763549805, 7.90531110763549805);
  llvm::Value* x2 = b.CreateFMul(xc, xc);
  llvm::Value* p = horner(b, x2,
                          {-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11, 5.12229709037114e-08,
                           1.48572235717979e-05, 6.37261928875436e-04, 4.89352455891786e-03});
  llvm::Value* q =
      horner(b, x2, {1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03});
  llvm::Value* r = b.CreateFDiv(b.CreateFMul(xc, p), q);
  // Tiny |x|: tanh(x) = x to f32 precision (and the rational form loses relative accuracy).
  llvm::Value* absx = b.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x);
  return b.CreateSelect(b.CreateFCmpOLT(absx, c(b, 0.0004)), x, r);
}

llvm::Value* emitErf(llvm::IRBuilder<>& b, llvm::Value* x) {
  ContractOnly guard(b);
  llvm::Value* xc = clamp(b, x, -4.0, 4.0);
  llvm::Value* x2 = b.CreateFMul(xc, xc);
  llvm::Value* p = horner(b, x2,
                          {-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
                           -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02});
  llvm::Value* q = horner(b, x2,
                          {-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
                           -1.42647390514189e-02});
  return b.CreateFDiv(b.CreateFMul(xc, p), q);
}

llvm::Value* emitBf16ToF32(llvm::IRBuilder<>& b, llvm::Value* bits) {
  return b.CreateBitCast(b.CreateShl(b.CreateZExt(bits, b.getInt32Ty()), 16), b.getFloatTy());
}

llvm::Value* emitF32ToBf16(llvm::IRBuilder<>& b, llvm::Value* x) {
  llvm::Value* u = b.CreateBitCast(x, b.getInt32Ty());
  llvm::Value* lsb = b.CreateAnd(b.CreateLShr(u, 16), 1);
  llvm::Value* rounded = b.CreateLShr(b.CreateAdd(u, b.CreateAdd(lsb, b.getInt32(0x7fff))), 16);
  return b.CreateSelect(b.CreateFCmpUNO(x, x), b.getInt16(0x7fc0), b.CreateTrunc(rounded, b.getInt16Ty()));
}

llvm::Value* emitHalfToF32(llvm::IRBuilder<>& b, llvm::Value* bits) {
  return b.CreateFPExt(b.CreateBitCast(bits, b.getHalfTy()), b.getFloatTy());
}

llvm::Value* emitF32ToHalf(llvm::IRBuilder<>& b, llvm::Value* x) {
  return b.CreateBitCast(b.CreateFPTrunc(x, b.getHalfTy()), b.getInt16Ty());
}

}  // namespace meshfuse::cpu
