// The CUDA kernel writer's expressions (contract in kernel_writer.h): loads, conversions and the
// CUDA spelling of each kernel IR op. Apart from the statements and modes, which only call expr().
#include <fmt/format.h>

#include "codegen/cuda/kernel_writer.h"
#include "meshfuse/error.h"

namespace meshfuse::cuda {

// ---- expressions ------------------------------------------------------------------------
std::string KernelWriter::expr(const Expr& e) {
  switch (e->op) {
    case Op::Const: return literal(e->value, e->type);
    case Op::Var: {
      auto r = rename_.find(e->id);
      return r != rename_.end() ? r->second : fmt::format("s{}", e->id);
    }
    case Op::Load: return load(e);
    default: break;
  }
  // Values are named once per scope (as the CPU emitter memoizes): the IR shares subtrees.
  for (auto s = memo_.rbegin(); s != memo_.rend(); ++s)
    if (auto it = s->find(e.get()); it != s->end()) return it->second;
  std::string text = compute(e);
  std::string name = fmt::format("e{}", next_value_++);
  line(fmt::format("const {} {} = {};", ctype(e->type), name, text));
  memo_.back()[e.get()] = name;
  return name;
}

std::string KernelWriter::index(int64_t buffer, const Expr& idx) {
  std::string i = expr(idx);
  if (!private_.count(buffer)) return i;
  // A private temporary: thread mode interleaves workers (coalesced), block mode gives each
  // block a contiguous copy.
  if (mode_ == Mode::Thread) return fmt::format("({}) * mf_W + mf_w", i);
  return fmt::format("mf_w * {}LL + ({})", p_.buffers.at(buffer).numel(), i);
}

std::string KernelWriter::load(const Expr& e) {
  const DataType dt = p_.buffers.at(e->id).dtype;
  auto lane = lane_ >= 0 ? vector_loads_.find(e.get()) : vector_loads_.end();
  std::string v = lane != vector_loads_.end() ? fmt::format("{}[{}]", lane->second, lane_)
                                              : fmt::format("b{}[{}]", e->id, index(e->id, e->args.at(0)));
  switch (dt) {
    case DataType::BFloat16: v = fmt::format("mf_bf16_to_f32({})", v); break;
    case DataType::Half: v = fmt::format("mf_f16_to_f32({})", v); break;
    case DataType::Bool: v = fmt::format("({} != 0)", v); break;
    default: break;
  }
  return convert(v, kir::valueTypeOf(dt), e->type);
}

std::string KernelWriter::convert(const std::string& v, Type from, Type to) {
  if (from == to) return v;
  if (to == Type::Bool) return fmt::format("({} != 0)", v);
  // float -> i64 truncates, saturates and maps NaN to 0, as the CPU's fptosi.sat: spelled out,
  // so that the host emulation (where the plain cast is undefined out of range) agrees.
  if (to == Type::I64 && isFloat(from)) return fmt::format("mf_f2ll({})", v);
  return fmt::format("static_cast<{}>({})", ctype(to), v);
}

std::string KernelWriter::compute(const Expr& e) {
  if (e->op == Op::Round) {
    std::string x = expr(e->args[0]);
    return e->round_to == DataType::Half ? fmt::format("mf_f16_to_f32(mf_f32_to_f16({}))", x)
                                         : fmt::format("mf_round_bf16({})", x);
  }
  if (e->op == Op::Cast) return convert(expr(e->args[0]), e->args[0]->type, e->type);
  if (e->op == Op::Select) return fmt::format("({} ? {} : {})", expr(e->args[0]), expr(e->args[1]), expr(e->args[2]));
  if (e->args.size() == 1) return unary(e->op, expr(e->args[0]), e->args[0]->type);
  return binary(e->op, expr(e->args[0]), expr(e->args[1]), e->args[0]->type);
}

std::string KernelWriter::unary(Op op, const std::string& x, Type t) {
  const bool f32 = t == Type::F32;
  auto fn = [&](const char* name) { return fmt::format("{}{}({})", name, f32 ? "f" : "", x); };
  switch (op) {
    case Op::Neg: return fmt::format("(-{})", x);
    case Op::Abs: return isFloat(t) ? fn("fabs") : fmt::format("llabs({})", x);
    case Op::Exp: return fn("exp");
    case Op::Log: return fn("log");
    case Op::Sqrt: return fn("sqrt");
    case Op::Rsqrt: return fmt::format("({} / {})", f32 ? "1.0f" : "1.0", fn("sqrt"));
    case Op::Recip: return fmt::format("({} / {})", f32 ? "1.0f" : "1.0", x);
    case Op::Tanh: return fn("tanh");
    case Op::Erf: return fn("erf");
    case Op::Trunc: return fn("trunc");
    default: break;
  }
  MF_CHECK(false, "{} is not a unary kernel op", kir::opName(op));
}

std::string KernelWriter::binary(Op op, const std::string& a, const std::string& b, Type t) {
  const bool f32 = t == Type::F32;
  switch (op) {
    case Op::Add: return fmt::format("({} + {})", a, b);
    case Op::Sub: return fmt::format("({} - {})", a, b);
    case Op::Mul: return fmt::format("({} * {})", a, b);
    case Op::Div: return fmt::format("({} / {})", a, b);  // integers: of indices (non-negative)
    case Op::Rem:
      return isFloat(t) ? fmt::format("fmod{}({}, {})", f32 ? "f" : "", a, b) : fmt::format("({} % {})", a, b);
    case Op::Pow: return fmt::format("pow{}({}, {})", f32 ? "f" : "", a, b);
    case Op::Max: return fmt::format("({0} < {1} ? {1} : {0})", a, b);
    case Op::Min: return fmt::format("({1} < {0} ? {1} : {0})", a, b);
    case Op::Eq: return fmt::format("({} == {})", a, b);
    case Op::Ne: return fmt::format("({} != {})", a, b);
    case Op::Lt: return fmt::format("({} < {})", a, b);
    case Op::Le: return fmt::format("({} <= {})", a, b);
    case Op::Gt: return fmt::format("({} > {})", a, b);
    case Op::Ge: return fmt::format("({} >= {})", a, b);
    default: break;
  }
  MF_CHECK(false, "{} is not a binary kernel op", kir::opName(op));
}

}  // namespace meshfuse::cuda
