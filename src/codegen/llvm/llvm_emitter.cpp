// Kernel IR -> LLVM IR (contract in llvm_emitter.h).
#include "codegen/llvm/llvm_emitter.h"

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Support/raw_ostream.h>

#include <cmath>
#include <map>
#include <set>
#include <unordered_map>

#include "meshfuse/error.h"
#include "codegen/llvm/llvm_math.h"

namespace meshfuse::cpu {
namespace {

using kir::Expr;
using kir::Op;
using kir::Stmt;
using kir::Type;

class FunctionEmitter {
 public:
  FunctionEmitter(llvm::Module& m, const kir::Program& p) : m_(m), ctx_(m.getContext()), p_(p), b_(ctx_) {
    llvm::FastMathFlags f;
    f.setAllowReassoc(true);
    f.setAllowContract(true);
    b_.setFastMathFlags(f);
  }

  void emit(const kir::LoopNest& nest, const std::string& name) {
    llvm::Type* ptr = llvm::PointerType::getUnqual(ctx_);
    std::vector<llvm::Type*> params(p_.buffers.size(), ptr);
    auto* body_ty = llvm::FunctionType::get(b_.getVoidTy(), params, false);
    auto* body = llvm::Function::Create(body_ty, llvm::Function::InternalLinkage, name + ".body", m_);
    body->addFnAttr(llvm::Attribute::AlwaysInline);
    body->addFnAttr(llvm::Attribute::NoUnwind);
    for (unsigned i = 0; i < params.size(); ++i) {
      if (!p_.buffers[i].may_alias) body->addParamAttr(i, llvm::Attribute::NoAlias);
      body->addParamAttr(i, llvm::Attribute::NoCapture);
      buffers_.push_back(body->getArg(i));
    }
    llvm::BasicBlock* entry = llvm::BasicBlock::Create(ctx_, "entry", body);
    b_.SetInsertPoint(entry);
    entry_ = entry;
    scopes_.emplace_back();
    std::map<int64_t, bool> never_nan;
    findNeverNan(nest.body, never_nan);
    for (const auto& [id, ok] : never_nan)
      if (ok) never_nan_.insert(id);
    stmts(nest.body);
    b_.CreateRetVoid();

    // The entry point: void name(void** buffers).
    auto* fn = llvm::Function::Create(llvm::FunctionType::get(b_.getVoidTy(), {ptr}, false),
                                      llvm::Function::ExternalLinkage, name, m_);
    fn->addFnAttr(llvm::Attribute::NoUnwind);
    b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", fn));
    std::vector<llvm::Value*> args;
    for (unsigned i = 0; i < params.size(); ++i)
      args.push_back(b_.CreateLoad(ptr, b_.CreateConstInBoundsGEP1_64(ptr, fn->getArg(0), i)));
    b_.CreateCall(body, args);
    b_.CreateRetVoid();
  }

 private:
  llvm::Type* typeOf(Type t) {
    switch (t) {
      case Type::Bool: return b_.getInt1Ty();
      case Type::I64: return b_.getInt64Ty();
      case Type::F32: return b_.getFloatTy();
      case Type::F64: return b_.getDoubleTy();
    }
    return nullptr;
  }

  llvm::Type* storageOf(DataType dt) {
    switch (dt) {
      case DataType::Float: return b_.getFloatTy();
      case DataType::BFloat16:
      case DataType::Half: return b_.getInt16Ty();
      case DataType::Int64: return b_.getInt64Ty();
      case DataType::Bool: return b_.getInt8Ty();
    }
    return nullptr;
  }

  // ---- statements -------------------------------------------------------------------------------
  void stmts(const std::vector<Stmt>& body) {
    for (const Stmt& s : body) {
      switch (s.kind) {
        case Stmt::For: loop(s); break;
        case Stmt::Let: scalars_[s.id] = expr(s.value); break;
        case Stmt::Assign: b_.CreateStore(assigned(s), accumulator(s.id)); break;
        case Stmt::Store: store(s); break;
      }
    }
  }

  void loop(const Stmt& s) {
    if (s.extent <= 0) return;
    llvm::Function* fn = b_.GetInsertBlock()->getParent();
    llvm::BasicBlock* pre = b_.GetInsertBlock();
    llvm::BasicBlock* head = llvm::BasicBlock::Create(ctx_, "loop", fn);
    llvm::BasicBlock* exit = llvm::BasicBlock::Create(ctx_, "loop.exit", fn);
    b_.CreateBr(head);
    b_.SetInsertPoint(head);
    llvm::PHINode* i = b_.CreatePHI(b_.getInt64Ty(), 2, "i" + std::to_string(s.id));
    i->addIncoming(b_.getInt64(0), pre);
    scalars_[s.id] = i;
    scopes_.emplace_back();
    stmts(s.body);
    scopes_.pop_back();
    llvm::Value* next = b_.CreateAdd(i, b_.getInt64(1), "", /*HasNUW=*/true, /*HasNSW=*/true);
    i->addIncoming(next, b_.GetInsertBlock());
    b_.CreateCondBr(b_.CreateICmpULT(next, b_.getInt64(s.extent)), head, exit);
    b_.SetInsertPoint(exit);
  }

  // The value of `acc = v`. A max reduction `acc = max(acc, x)` into an accumulator that never
  // holds NaN (every assignment is a non-NaN constant or such a max) is lowered as
  // maxnum(acc, x with NaN as -inf): the same value ((acc < x ? x : acc) ignores a NaN x too),
  // but with both operands known not NaN, which LLVM 15 needs before it vectorizes the loop.
  llvm::Value* assigned(const Stmt& s) {
    const Expr& v = s.value;
    const bool fp = v->type == Type::F32 || v->type == Type::F64;
    if (!fp || v->op != Op::Max || !isSelf(v->args[0], s.id) || !never_nan_.count(s.id)) return expr(v);
    llvm::Value* acc = expr(v->args[0]);
    llvm::Value* x = expr(v->args[1]);
    x = b_.CreateSelect(b_.CreateFCmpUNO(x, x), llvm::ConstantFP::getInfinity(x->getType(), true), x);
    llvm::IRBuilder<>::FastMathFlagGuard guard(b_);
    llvm::FastMathFlags f = b_.getFastMathFlags();
    f.setNoNaNs();
    f.setNoSignedZeros();
    b_.setFastMathFlags(f);
    return b_.CreateBinaryIntrinsic(llvm::Intrinsic::maxnum, acc, x);
  }
  static bool isSelf(const Expr& e, int64_t acc) { return e->op == Op::Var && e->id == acc; }

  // Accumulators whose every assignment is a non-NaN constant or acc = max(acc, x).
  void findNeverNan(const std::vector<Stmt>& body, std::map<int64_t, bool>& ok) {
    for (const Stmt& s : body) {
      if (s.kind == Stmt::For) findNeverNan(s.body, ok);
      if (s.kind != Stmt::Assign) continue;
      const Expr& v = s.value;
      bool fine = (v->op == Op::Const && !std::isnan(v->value)) || (v->op == Op::Max && isSelf(v->args[0], s.id));
      auto [it, fresh] = ok.emplace(s.id, fine);
      if (!fresh) it->second = it->second && fine;
    }
  }

  llvm::Value* accumulator(int64_t id) {
    auto it = accumulators_.find(id);
    if (it != accumulators_.end()) return it->second;
    llvm::IRBuilder<> at(entry_, entry_->begin());
    return accumulators_[id] = at.CreateAlloca(typeOf(p_.scalars.at(id).type), nullptr, "acc" + std::to_string(id));
  }

  void store(const Stmt& s) {
    const DataType dt = p_.buffers.at(s.id).dtype;
    llvm::Value* v = expr(s.value);
    switch (dt) {
      case DataType::BFloat16: v = emitF32ToBf16(b_, v); break;
      case DataType::Half: v = emitF32ToHalf(b_, v); break;
      case DataType::Bool: v = b_.CreateZExt(v, b_.getInt8Ty()); break;
      default: break;
    }
    b_.CreateStore(v, b_.CreateInBoundsGEP(storageOf(dt), buffers_.at(s.id), expr(s.index)));
  }

  // ---- expressions ------------------------------------------------------------------------------
  llvm::Value* expr(const Expr& e) {
    // Loads and accumulator reads are not memoized: a store may come between two of them.
    const bool memo = e->op != Op::Load && !(e->op == Op::Var && p_.scalars.at(e->id).kind == kir::Scalar::Accumulator);
    if (memo)
      for (auto s = scopes_.rbegin(); s != scopes_.rend(); ++s)
        if (auto it = s->find(e.get()); it != s->end()) return it->second;
    llvm::Value* v = compute(e);
    if (memo) scopes_.back()[e.get()] = v;
    return v;
  }

  llvm::Value* compute(const Expr& e) {
    switch (e->op) {
      case Op::Const:
        switch (e->type) {
          case Type::Bool: return b_.getInt1(e->value != 0);
          case Type::I64: return b_.getInt64(static_cast<int64_t>(e->value));
          case Type::F32: return llvm::ConstantFP::get(b_.getFloatTy(), e->value);
          case Type::F64: return llvm::ConstantFP::get(b_.getDoubleTy(), e->value);
        }
        break;
      case Op::Var: {
        if (p_.scalars.at(e->id).kind == kir::Scalar::Accumulator)
          return b_.CreateLoad(typeOf(e->type), accumulator(e->id));
        auto it = scalars_.find(e->id);
        MF_CHECK(it != scalars_.end(), "scalar {} is read before it is defined", e->id);
        return it->second;
      }
      case Op::Load: return loadElement(e);
      case Op::Round: {
        llvm::Value* x = expr(e->args[0]);
        if (e->round_to == DataType::Half) return emitHalfToF32(b_, emitF32ToHalf(b_, x));
        llvm::Value* r = emitBf16ToF32(b_, emitF32ToBf16(b_, x));
        return b_.CreateSelect(b_.CreateFCmpUNO(x, x), x, r);
      }
      case Op::Cast: return convert(expr(e->args[0]), e->args[0]->type, e->type);
      case Op::Select: return b_.CreateSelect(expr(e->args[0]), expr(e->args[1]), expr(e->args[2]));
      default: break;
    }
    if (e->args.size() == 1) return unaryOp(e->op, expr(e->args[0]), e->type);
    return binaryOp(e->op, expr(e->args[0]), expr(e->args[1]), e->args[0]->type);
  }

  llvm::Value* loadElement(const Expr& e) {
    const DataType dt = p_.buffers.at(e->id).dtype;
    llvm::Value* v =
        b_.CreateLoad(storageOf(dt), b_.CreateInBoundsGEP(storageOf(dt), buffers_.at(e->id), expr(e->args[0])));
    switch (dt) {
      case DataType::BFloat16: return emitBf16ToF32(b_, v);
      case DataType::Half: return emitHalfToF32(b_, v);
      case DataType::Bool: return b_.CreateICmpNE(v, b_.getInt8(0));
      default: return v;
    }
  }

  llvm::Value* convert(llvm::Value* v, Type from, Type to) {
    const bool ff = from == Type::F32 || from == Type::F64, tf = to == Type::F32 || to == Type::F64;
    if (from == to) return v;
    if (to == Type::Bool)
      return ff ? b_.CreateFCmpUNE(v, llvm::ConstantFP::get(v->getType(), 0.0))
                : b_.CreateICmpNE(v, llvm::ConstantInt::get(v->getType(), 0));
    if (ff && tf) return from == Type::F32 ? b_.CreateFPExt(v, typeOf(to)) : b_.CreateFPTrunc(v, typeOf(to));
    if (tf) return from == Type::Bool ? b_.CreateUIToFP(v, typeOf(to)) : b_.CreateSIToFP(v, typeOf(to));
    if (from == Type::Bool) return b_.CreateZExt(v, typeOf(to));
    // Float -> i64 saturates (NaN -> 0) instead of producing poison.
    return b_.CreateIntrinsic(llvm::Intrinsic::fptosi_sat, {typeOf(to), v->getType()}, {v});
  }

  llvm::Value* unaryOp(Op op, llvm::Value* x, Type t) {
    const bool fp = t == Type::F32 || t == Type::F64;
    auto one = [&] { return llvm::ConstantFP::get(x->getType(), 1.0); };
    switch (op) {
      case Op::Neg: return fp ? b_.CreateFNeg(x) : b_.CreateNeg(x);
      case Op::Abs:
        return fp ? b_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x)
                  : b_.CreateBinaryIntrinsic(llvm::Intrinsic::abs, x, b_.getInt1(false));
      case Op::Sqrt: return b_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, x);
      case Op::Rsqrt: return b_.CreateFDiv(one(), b_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, x));
      case Op::Recip: return b_.CreateFDiv(one(), x);
      case Op::Trunc: return b_.CreateUnaryIntrinsic(llvm::Intrinsic::trunc, x);
      case Op::Exp:
      case Op::Log:
      case Op::Tanh:
      case Op::Erf: {
        // The polynomials are f32; an f64 operand (never produced by lowering today) goes
        // through them in f32.
        llvm::Value* xf = t == Type::F32 ? x : b_.CreateFPTrunc(x, b_.getFloatTy());
        llvm::Value* r = op == Op::Exp    ? emitExp(b_, xf)
                         : op == Op::Log  ? emitLog(b_, xf)
                         : op == Op::Tanh ? emitTanh(b_, xf)
                                          : emitErf(b_, xf);
        return t == Type::F32 ? r : b_.CreateFPExt(r, x->getType());
      }
      default: break;
    }
    MF_CHECK(false, "{} is not a unary kernel op", kir::opName(op));
  }

  llvm::Value* binaryOp(Op op, llvm::Value* a, llvm::Value* b, Type t) {
    const bool fp = t == Type::F32 || t == Type::F64;
    switch (op) {
      case Op::Add: return fp ? b_.CreateFAdd(a, b) : b_.CreateAdd(a, b, "", false, t == Type::I64);
      case Op::Sub: return fp ? b_.CreateFSub(a, b) : b_.CreateSub(a, b, "", false, t == Type::I64);
      case Op::Mul: return fp ? b_.CreateFMul(a, b) : b_.CreateMul(a, b, "", false, t == Type::I64);
      case Op::Div: return fp ? b_.CreateFDiv(a, b) : b_.CreateUDiv(a, b);  // integer division: of indices
      case Op::Rem: return fp ? b_.CreateFRem(a, b) : b_.CreateURem(a, b);
      case Op::Pow: return b_.CreateBinaryIntrinsic(llvm::Intrinsic::pow, a, b);
      case Op::Max: return b_.CreateSelect(lessThan(a, b, fp), b, a);
      case Op::Min: return b_.CreateSelect(lessThan(b, a, fp), b, a);
      case Op::Eq: return fp ? b_.CreateFCmpOEQ(a, b) : b_.CreateICmpEQ(a, b);
      case Op::Ne: return fp ? b_.CreateFCmpUNE(a, b) : b_.CreateICmpNE(a, b);
      case Op::Lt: return fp ? b_.CreateFCmpOLT(a, b) : b_.CreateICmpSLT(a, b);
      case Op::Le: return fp ? b_.CreateFCmpOLE(a, b) : b_.CreateICmpSLE(a, b);
      case Op::Gt: return fp ? b_.CreateFCmpOGT(a, b) : b_.CreateICmpSGT(a, b);
      case Op::Ge: return fp ? b_.CreateFCmpOGE(a, b) : b_.CreateICmpSGE(a, b);
      default: break;
    }
    MF_CHECK(false, "{} is not a binary kernel op", kir::opName(op));
  }
  llvm::Value* lessThan(llvm::Value* a, llvm::Value* b, bool fp) {
    return fp ? b_.CreateFCmpOLT(a, b) : b_.CreateICmpSLT(a, b);
  }

  llvm::Module& m_;
  llvm::LLVMContext& ctx_;
  const kir::Program& p_;
  llvm::IRBuilder<> b_;
  llvm::BasicBlock* entry_ = nullptr;
  std::vector<llvm::Value*> buffers_;
  std::unordered_map<int64_t, llvm::Value*> scalars_;       // loop variables and lets
  std::unordered_map<int64_t, llvm::Value*> accumulators_;  // their allocas
  std::set<int64_t> never_nan_;                             // accumulators findNeverNan cleared
  std::vector<std::unordered_map<const kir::Node*, llvm::Value*>> scopes_;
};

}  // namespace

EmittedModule emitModule(const kir::Program& program, const std::string& prefix) {
  EmittedModule out;
  out.context = std::make_unique<llvm::LLVMContext>();
  out.module = std::make_unique<llvm::Module>(prefix, *out.context);
  for (size_t i = 0; i < program.steps.size(); ++i) {
    const kir::Step& s = program.steps[i];
    if (s.kind != kir::Step::Loops) {
      out.functions.emplace_back();
      continue;
    }
    std::string name = prefix + "_" + std::to_string(i);
    FunctionEmitter(*out.module, program).emit(s.loops, name);
    out.functions.push_back(name);
  }
  std::string err;
  llvm::raw_string_ostream os(err);
  MF_CHECK(!llvm::verifyModule(*out.module, &os), "the CPU emitter made invalid LLVM IR for {}: {}\n{}", program.name,
           os.str(), kir::printProgram(program));
  return out;
}

}  // namespace meshfuse::cpu
