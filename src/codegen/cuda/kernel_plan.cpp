// Loop-nest analysis for the CUDA emitter (contract in kernel_plan.h).
#include "codegen/cuda/kernel_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "meshfuse/error.h"

namespace meshfuse::cuda {
namespace {

bool loadsBuffer(const Expr& e, int64_t buffer) {
  if (e->op == Op::Load && e->id == buffer) return true;
  return std::any_of(e->args.begin(), e->args.end(), [&](const Expr& a) { return loadsBuffer(a, buffer); });
}

// ---- vectorization of pointwise nests -------------------------------------------------------
// In a loop-free body, a load or store whose index steps by 1 with the innermost outer loop
// moves V consecutive elements per thread as one 16-byte (or narrower) access.
// The coefficient of loop variable `v` in an index expression that is affine in it; nullopt
// otherwise. `lets` resolves let-bound scalars.
std::optional<int64_t> coefficient(const Expr& e, int64_t v, const std::map<int64_t, Expr>& lets) {
  switch (e->op) {
    case Op::Const: return 0;
    case Op::Var: {
      if (e->id == v) return 1;
      auto it = lets.find(e->id);
      return it == lets.end() ? std::optional<int64_t>(0) : coefficient(it->second, v, lets);
    }
    case Op::Add:
    case Op::Sub: {
      auto a = coefficient(e->args[0], v, lets), b = coefficient(e->args[1], v, lets);
      if (!a || !b) return std::nullopt;
      return e->op == Op::Add ? *a + *b : *a - *b;
    }
    case Op::Mul: {
      auto a = coefficient(e->args[0], v, lets), b = coefficient(e->args[1], v, lets);
      if (!a || !b) return std::nullopt;
      if (*a == 0 && *b == 0) return 0;
      if (*b == 0 && e->args[1]->op == Op::Const) return *a * static_cast<int64_t>(e->args[1]->value);
      if (*a == 0 && e->args[0]->op == Op::Const) return *b * static_cast<int64_t>(e->args[0]->value);
      return std::nullopt;
    }
    default: {
      for (const Expr& a : e->args) {
        auto c = coefficient(a, v, lets);
        if (!c || *c != 0) return std::nullopt;  // v under a division, remainder, ...: not affine
      }
      return 0;
    }
  }
}

void collectLoads(const Expr& e, std::vector<const kir::Node*>& out) {
  if (e->op == Op::Load && std::find(out.begin(), out.end(), e.get()) == out.end()) out.push_back(e.get());
  for (const Expr& a : e->args) collectLoads(a, out);
}

}  // namespace

const char* ctype(Type t) {
  switch (t) {
    case Type::Bool: return "bool";
    case Type::I64: return "long long";
    case Type::F32: return "float";
    case Type::F64: return "double";
  }
  return "?";
}

const char* storageType(DataType dt) {
  switch (dt) {
    case DataType::Float: return "float";
    case DataType::BFloat16: return "mf_bf16";
    case DataType::Half: return "mf_f16";
    case DataType::Int64: return "long long";
    case DataType::Bool: return "unsigned char";
  }
  return "?";
}

bool isFloat(Type t) { return t == Type::F32 || t == Type::F64; }

std::string literal(double v, Type t) {
  switch (t) {
    case Type::Bool: return v != 0 ? "true" : "false";
    case Type::I64: return fmt::format("{}LL", static_cast<long long>(v));
    case Type::F32:
    case Type::F64: {
      const bool f = t == Type::F32;
      if (std::isnan(v)) return f ? "MF_NAN_F" : "MF_NAN_D";
      if (std::isinf(v)) return std::string(v < 0 ? "(-" : "(") + (f ? "MF_INF_F)" : "MF_INF_D)");
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%a", f ? static_cast<double>(static_cast<float>(v)) : v);
      return f ? fmt::format("{}f", buf) : std::string(buf);
    }
  }
  return "?";
}

void exprUses(const Expr& e, std::set<int64_t>* scalars, std::set<int64_t>* buffers) {
  if (e->op == Op::Var && scalars) scalars->insert(e->id);
  if (e->op == Op::Load && buffers) buffers->insert(e->id);
  for (const Expr& a : e->args) exprUses(a, scalars, buffers);
}

void walk(const std::vector<Stmt>& body, const std::function<void(const Stmt&)>& f) {
  for (const Stmt& s : body) {
    f(s);
    if (s.kind == Stmt::For) walk(s.body, f);
  }
}

Uses usesOf(const std::vector<Stmt>& body) {
  Uses u;
  walk(body, [&](const Stmt& s) {
    if (s.value) exprUses(s.value, &u.scalars, &u.buffers);
    if (s.index) exprUses(s.index, &u.scalars, &u.buffers);
    if (s.kind == Stmt::Store) u.stored.insert(s.id), u.buffers.insert(s.id);
    if (s.kind == Stmt::Assign) u.assigned.insert(s.id);
  });
  return u;
}

std::set<int64_t> definedIn(const std::vector<Stmt>& body) {
  std::set<int64_t> d;
  walk(body, [&](const Stmt& s) {
    if (s.kind != Stmt::Store) d.insert(s.id);
  });
  return d;
}

void positionalVars(const Expr& e, std::set<int64_t>* vars) {
  if (e->op == Op::Var) vars->insert(e->id);
  if (e->op == Op::Load) return;
  for (const Expr& a : e->args) positionalVars(a, vars);
}

bool involvesAll(const Expr& index, const std::vector<int64_t>& vars) {
  std::set<int64_t> used;
  positionalVars(index, &used);
  return std::all_of(vars.begin(), vars.end(), [&](int64_t v) { return used.count(v) > 0; });
}

std::vector<const Stmt*> perfectLoops(const std::vector<Stmt>& root) {
  std::vector<const Stmt*> loops;
  const std::vector<Stmt>* body = &root;
  while (body->size() == 1 && body->front().kind == Stmt::For) {
    loops.push_back(&body->front());
    body = &body->front().body;
  }
  return loops;
}

Nest outerNest(const std::vector<Stmt>& root, const std::set<int64_t>& row_local) {
  const std::vector<const Stmt*> loops = perfectLoops(root);
  const std::vector<Stmt>* body = loops.empty() ? &root : &loops.back()->body;
  const Uses u = usesOf(*body);
  std::vector<bool> parallel(loops.size(), true);
  walk(*body, [&](const Stmt& st) {
    std::vector<Expr> indices;
    if (st.kind == Stmt::Store && !row_local.count(st.id)) indices.push_back(st.index);
    std::function<void(const Expr&)> loads = [&](const Expr& e) {
      if (e->op == Op::Load && u.stored.count(e->id) && !row_local.count(e->id)) indices.push_back(e->args[0]);
      for (const Expr& a : e->args) loads(a);
    };
    if (st.value) loads(st.value);
    if (st.index) loads(st.index);
    for (const Expr& i : indices)
      for (size_t l = 0; l < loops.size(); ++l) parallel[l] = parallel[l] && involvesAll(i, {loops[l]->id});
  });
  Nest n;
  n.inner = body;
  std::vector<const Stmt*> serial;
  for (size_t l = 0; l < loops.size(); ++l) {
    if (parallel[l]) {
      n.vars.push_back(loops[l]->id);
      n.extents.push_back(loops[l]->extent);
    } else {
      serial.push_back(loops[l]);
    }
  }
  if (serial.empty()) return n;
  n.owned = *body;
  for (size_t l = serial.size(); l-- > 0;) {
    Stmt loop{Stmt::For, serial[l]->id, serial[l]->extent};
    loop.body = std::move(n.owned);
    n.owned = {std::move(loop)};
  }
  return n;
}

int64_t innerWork(const std::vector<Stmt>& body) {
  int64_t w = 0;
  for (const Stmt& s : body)
    if (s.kind == Stmt::For) w = std::max(w, s.extent * std::max<int64_t>(1, innerWork(s.body)));
  return w;
}

std::optional<Accumulation> accumulationOf(const Stmt& loop) {
  if (loop.kind != Stmt::For) return std::nullopt;
  Accumulation a;
  const Stmt* l = &loop;
  a.loops.push_back(l);
  while (l->body.size() == 1 && l->body.front().kind == Stmt::For) {
    l = &l->body.front();
    a.loops.push_back(l);
  }
  const std::vector<Stmt>& body = l->body;
  if (body.empty() || (body.back().kind != Stmt::Store && body.back().kind != Stmt::Assign)) return std::nullopt;
  for (size_t i = 0; i + 1 < body.size(); ++i) {
    if (body[i].kind != Stmt::Let) return std::nullopt;
    a.lets.push_back(&body[i]);
  }
  a.store = &body.back();
  const bool assign = a.store->kind == Stmt::Assign;
  const Expr& sv = a.store->value;
  if (sv->args.size() != 2 || !(sv->op == Op::Add || sv->op == Op::Max || sv->op == Op::Min)) return std::nullopt;
  auto reads = [&](const Expr& e) {  // whether e reads the location
    if (!assign) return loadsBuffer(e, a.store->id);
    std::set<int64_t> vars;
    exprUses(e, &vars, nullptr);
    return vars.count(a.store->id) > 0;
  };
  for (int k : {0, 1}) {
    const Expr& t = sv->args[k];
    const bool is_target = assign
                               ? t->op == Op::Var && t->id == a.store->id
                               : t->op == Op::Load && t->id == a.store->id && kir::sameExpr(t->args[0], a.store->index);
    if (is_target && !reads(sv->args[1 - k])) {
      a.target = t;
      a.value = sv->args[1 - k];
    }
  }
  if (!a.target) return std::nullopt;
  for (const Stmt* let : a.lets)
    if (reads(let->value)) return std::nullopt;
  if (assign) {
    a.op = sv->op;
    a.type = sv->type;
    return a;
  }
  std::set<int64_t> index_vars;
  exprUses(a.store->index, &index_vars, nullptr);
  for (const Stmt* x : a.loops)
    if (index_vars.count(x->id)) return std::nullopt;
  for (const Stmt* x : a.lets)
    if (index_vars.count(x->id)) return std::nullopt;
  a.op = sv->op;
  a.type = sv->type;
  return a;
}

VectorPlan planVectors(const kir::Program& p, const Nest& nest) {
  VectorPlan plan;
  if (nest.vars.empty()) return plan;
  const int64_t v = nest.vars.back(), extent = nest.extents.back();
  std::map<int64_t, Expr> lets;
  std::vector<const kir::Node*> loads;
  int64_t widest = 1;
  for (const Stmt& s : nest.body()) {
    if (s.kind == Stmt::Let) {
      lets[s.id] = s.value;
    } else if (s.kind != Stmt::Store) {
      return plan;  // loops or accumulators: not a pointwise body
    }
    collectLoads(s.value, loads);
    if (s.index) collectLoads(s.index, loads);
    if (s.kind != Stmt::Store) continue;
    auto c = coefficient(s.index, v, lets);
    if (!c || *c != 1) return plan;
    plan.stores.push_back(&s);
    widest = std::max(widest, dtypeSize(p.buffers.at(s.id).dtype));
  }
  for (const kir::Node* l : loads) {
    auto c = coefficient(l->args.at(0), v, lets);
    if (!c || *c != 1) continue;  // broadcast or gathered: a plain load per element
    plan.loads.push_back(l);
    widest = std::max(widest, dtypeSize(p.buffers.at(l->id).dtype));
  }
  if (plan.stores.empty()) return plan;
  int width = static_cast<int>(16 / widest);
  while (width > 1 && extent % width != 0) width /= 2;
  plan.width = width;
  return plan;
}

const char* vectorType(int64_t bytes) {
  switch (bytes) {
    case 16: return "uint4";
    case 8: return "uint2";
    case 4: return "unsigned int";
    case 2: return "unsigned short";
    default: return "unsigned char";
  }
}

}  // namespace meshfuse::cuda
