// Kernel IR nodes: constructors (with constant folding of index arithmetic) and the printer of
// `meshfuse dump --stage=kernels`.
#include "codegen/kernel_ir.h"

#include <fmt/format.h>

#include <cmath>

#include "meshfuse/error.h"
#include "meshfuse/ir/extent.h"
#include "meshfuse/ir/op_kind.h"

namespace meshfuse::kir {

const char* typeName(Type t) {
  switch (t) {
    case Type::Bool: return "bool";
    case Type::I64: return "i64";
    case Type::F32: return "f32";
    case Type::F64: return "f64";
  }
  return "?";
}

Type valueTypeOf(DataType dt) {
  switch (dt) {
    case DataType::Float:
    case DataType::BFloat16:
    case DataType::Half: return Type::F32;
    case DataType::Int64: return Type::I64;
    case DataType::Bool: return Type::Bool;
  }
  MF_CHECK(false, "unknown dtype");
}

const char* opName(Op op) {
  switch (op) {
#define MESHFUSE_X(e, s) \
  case Op::e: return s;
    MESHFUSE_KIR_OPS(MESHFUSE_X)
#undef MESHFUSE_X
  }
  return "?";
}

int64_t Buffer::numel() const { return meshfuse::numel(shape); }

int64_t Program::addBuffer(Buffer b) {
  buffers.push_back(std::move(b));
  return static_cast<int64_t>(buffers.size()) - 1;
}

int64_t Program::addScalar(Scalar::Kind k, Type t) {
  scalars.push_back({k, t});
  return static_cast<int64_t>(scalars.size()) - 1;
}

namespace {

Expr make(Node n) { return std::make_shared<const Node>(std::move(n)); }

bool isComparison(Op op) {
  return op == Op::Eq || op == Op::Ne || op == Op::Lt || op == Op::Le || op == Op::Gt || op == Op::Ge;
}

}  // namespace

Expr constant(double v, Type t) { return make({Op::Const, t, v}); }
Expr index(int64_t v) { return constant(static_cast<double>(v), Type::I64); }
Expr var(int64_t scalar, Type t) { return make({Op::Var, t, 0, scalar}); }

Expr load(int64_t buffer, Type t, Expr flat_index) {
  MF_CHECK(flat_index->type == Type::I64, "a load index must be i64");
  return make({Op::Load, t, 0, buffer, DataType::Float, {std::move(flat_index)}});
}

bool isConst(const Expr& e, double v) { return e->op == Op::Const && e->value == v; }

bool sameExpr(const Expr& a, const Expr& b) {
  if (a == b) return true;
  if (a->op != b->op || a->type != b->type || a->value != b->value || a->id != b->id || a->round_to != b->round_to ||
      a->args.size() != b->args.size())
    return false;
  for (size_t i = 0; i < a->args.size(); ++i)
    if (!sameExpr(a->args[i], b->args[i])) return false;
  return true;
}

Expr unary(Op op, Expr x) {
  Type t = x->type;
  return make({op, t, 0, -1, DataType::Float, {std::move(x)}});
}

Expr round(Expr x, DataType to) {
  MF_CHECK(x->type == Type::F32, "round applies to f32 values");
  if (to == DataType::Float) return x;
  return make({Op::Round, Type::F32, 0, -1, to, {std::move(x)}});
}

Expr cast(Expr x, Type to) {
  if (x->type == to) return x;
  if (x->op == Op::Const) {
    double v = x->value;
    if (to == Type::Bool) v = v != 0 ? 1 : 0;
    if (to == Type::I64) v = std::trunc(v);
    if (to == Type::F32) v = static_cast<float>(v);
    return constant(v, to);
  }
  return make({Op::Cast, to, 0, -1, DataType::Float, {std::move(x)}});
}

Expr binary(Op op, Expr a, Expr b) {
  MF_CHECK(a->type == b->type, "{} of {} and {}", opName(op), typeName(a->type), typeName(b->type));
  Type t = isComparison(op) ? Type::Bool : a->type;
  if (a->type == Type::I64) {  // index arithmetic: fold what makes the printed IR noisy
    bool ca = a->op == Op::Const, cb = b->op == Op::Const;
    auto iv = [](const Expr& e) { return static_cast<int64_t>(e->value); };
    if (ca && cb) {
      switch (op) {
        case Op::Add: return index(iv(a) + iv(b));
        case Op::Sub: return index(iv(a) - iv(b));
        case Op::Mul: return index(iv(a) * iv(b));
        case Op::Div:
          if (iv(b) != 0) return index(iv(a) / iv(b));
          break;
        case Op::Rem:
          if (iv(b) != 0) return index(iv(a) % iv(b));
          break;
        default: break;
      }
    }
    if (op == Op::Add && isConst(a, 0)) return b;
    if ((op == Op::Add || op == Op::Sub) && isConst(b, 0)) return a;
    if (op == Op::Mul && (isConst(a, 0) || isConst(b, 1))) return a;  // 0 * b, a * 1
    if (op == Op::Mul && (isConst(b, 0) || isConst(a, 1))) return b;  // a * 0, 1 * b
    if (op == Op::Div && isConst(b, 1)) return a;
    if (op == Op::Rem && isConst(b, 1)) return index(0);
  }
  return make({op, t, 0, -1, DataType::Float, {std::move(a), std::move(b)}});
}

Expr select(Expr cond, Expr a, Expr b) {
  MF_CHECK(cond->type == Type::Bool && a->type == b->type, "select({}, {}, {})", typeName(cond->type),
           typeName(a->type), typeName(b->type));
  Type t = a->type;
  return make({Op::Select, t, 0, -1, DataType::Float, {std::move(cond), std::move(a), std::move(b)}});
}

// ---- printer ----------------------------------------------------------------------------------

namespace {

class Printer {
 public:
  explicit Printer(const Program& p) : p_(p) {}

  std::string scalar(int64_t id) const {
    switch (p_.scalars.at(id).kind) {
      case Scalar::Loop: return fmt::format("i{}", id);
      case Scalar::Let: return fmt::format("v{}", id);
      case Scalar::Accumulator: return fmt::format("acc{}", id);
    }
    return "?";
  }

  // An index at the top of a load or store reads best without its outer parentheses.
  std::string top(const Expr& e) const {
    std::string s = expr(e);
    return s.size() > 1 && s.front() == '(' && e->type == Type::I64 && e->args.size() == 2 ? s.substr(1, s.size() - 2)
                                                                                           : s;
  }

  std::string expr(const Expr& e) const {
    switch (e->op) {
      case Op::Const:
        if (e->type == Type::Bool) return e->value != 0 ? "true" : "false";
        if (e->type == Type::I64) return fmt::format("{}", static_cast<int64_t>(e->value));
        return formatFloat(e->value);
      case Op::Var: return scalar(e->id);
      case Op::Load: return fmt::format("b{}[{}]", e->id, top(e->args[0]));
      case Op::Round: return fmt::format("round_{}({})", dtypeName(e->round_to), expr(e->args[0]));
      case Op::Cast: return fmt::format("{}({})", typeName(e->type), expr(e->args[0]));
      default: break;
    }
    if (e->type == Type::I64 && e->args.size() == 2) {  // index arithmetic reads best infix
      const char* sym = e->op == Op::Add   ? "+"
                        : e->op == Op::Sub ? "-"
                        : e->op == Op::Mul ? "*"
                        : e->op == Op::Div ? "/"
                        : e->op == Op::Rem ? "%"
                                           : nullptr;
      if (sym) return fmt::format("({} {} {})", expr(e->args[0]), sym, expr(e->args[1]));
    }
    std::vector<std::string> args;
    for (const Expr& a : e->args) args.push_back(expr(a));
    return fmt::format("{}({})", opName(e->op), fmt::join(args, ", "));
  }

  void stmts(const std::vector<Stmt>& body, int indent, std::string& out) const {
    std::string pad(static_cast<size_t>(indent), ' ');
    for (const Stmt& s : body) {
      switch (s.kind) {
        case Stmt::For:
          out += fmt::format("{}for {} in [0, {}) {{\n", pad, scalar(s.id), s.extent);
          stmts(s.body, indent + 2, out);
          out += pad + "}\n";
          break;
        case Stmt::Let: out += fmt::format("{}let {} = {}\n", pad, scalar(s.id), expr(s.value)); break;
        case Stmt::Assign: out += fmt::format("{}{} = {}\n", pad, scalar(s.id), expr(s.value)); break;
        case Stmt::Store: out += fmt::format("{}store b{}[{}] = {}\n", pad, s.id, top(s.index), expr(s.value)); break;
      }
    }
  }

  std::string operand(const Gemm::Operand& o) const {
    return fmt::format("b{}{}[+{}, ld {}]", o.buffer, o.trans ? "^T" : "", o.offset, o.ld);
  }

  std::string gemm(const Gemm& g) const {
    std::vector<std::string> batch;
    for (const Gemm::BatchDim& d : g.batch)
      batch.push_back(fmt::format("{} (strides {}, {}, {})", d.extent, d.stride_a, d.stride_b, d.stride_c));
    return fmt::format("gemm m={} n={} k={}{}: {} = {} * {} x {}{}\n", g.m, g.n, g.k,
                       batch.empty() ? "" : fmt::format(" batch [{}]", fmt::join(batch, ", ")), operand(g.c),
                       formatFloat(g.alpha), operand(g.a), operand(g.b),
                       g.beta == 0 ? "" : fmt::format(" + {} * {}", formatFloat(g.beta), operand(g.c)));
  }

 private:
  const Program& p_;
};

}  // namespace

std::string printProgram(const Program& p) {
  Printer pr(p);
  std::string out = fmt::format("program {} {{\n", p.name);
  for (size_t i = 0; i < p.buffers.size(); ++i) {
    const Buffer& b = p.buffers[i];
    const char* role = b.role == Buffer::Input ? "in  " : b.role == Buffer::Output ? "out " : "temp";
    out += fmt::format("  buffer b{} {} {}{}[{}]\n", i, role, b.name.empty() ? "" : b.name + " : ", dtypeName(b.dtype),
                       fmt::join(b.shape, ", "));
  }
  for (const Step& s : p.steps) {
    if (s.kind == Step::GemmCall) {
      out += "  " + pr.gemm(s.gemm);
      continue;
    }
    if (s.kind == Step::AttentionCall) {
      const Attention& a = s.attention;
      auto buf = [](int64_t b) { return b < 0 ? std::string("-") : fmt::format("b{}", b); };
      if (a.wrt >= 0) {
        out += fmt::format(
            "  attention_grad wrt={}{} batch={} s={} skv={} d={} dv={} scale={}{}: {}{} = q {}, k {}, v {}, g {}, "
            "lse {}, delta {}\n",
            a.wrt == 0   ? "query"
            : a.wrt == 1 ? "key"
                         : "value",
            a.dv_out >= 0 ? ",value" : "", a.batch, a.s, a.skv, a.d, a.dv, formatFloat(a.scale),
            a.causal ? " causal" : "", buf(a.o), a.dv_out >= 0 ? ", " + buf(a.dv_out) : std::string(), buf(a.q),
            buf(a.k), buf(a.v), buf(a.g), buf(a.lse_in), buf(a.delta));
        continue;
      }
      out += fmt::format("  attention batch={} s={} skv={} d={} dv={} scale={}{}{}: o {}, lse {} = q {}, k {}, v {}\n",
                         a.batch, a.s, a.skv, a.d, a.dv, formatFloat(a.scale), a.causal ? " causal" : "",
                         a.operands == DataType::Float ? "" : fmt::format(" operands={}", dtypeName(a.operands)),
                         buf(a.o), buf(a.lse), buf(a.q), buf(a.k), buf(a.v));
      continue;
    }
    out += fmt::format("  loops {} {{\n", s.loops.name);
    pr.stmts(s.loops.body, 4, out);
    out += "  }\n";
  }
  return out + "}\n";
}

}  // namespace meshfuse::kir
