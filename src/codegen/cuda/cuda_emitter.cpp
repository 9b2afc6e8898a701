// Kernel IR -> CUDA C (see cuda_emitter.h for the parallelization).
#include "codegen/cuda/cuda_emitter.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "meshfuse/error.h"
#include "codegen/cuda/cuda_attention.h"
#include "codegen/cuda/runtime_kernels.h"

namespace meshfuse::cuda {
namespace {

using kir::Expr;
using kir::Op;
using kir::Stmt;
using kir::Type;

constexpr int kThreads = 256;
constexpr int64_t kPrivateBytesCap = int64_t{64} << 20;  // private temporaries, all workers together

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

// Exact literals: hexadecimal floats, named infinities and NaN.
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

// Scalars and buffers an expression tree reads.
void exprUses(const Expr& e, std::set<int64_t>* scalars, std::set<int64_t>* buffers) {
  if (e->op == Op::Var && scalars) scalars->insert(e->id);
  if (e->op == Op::Load && buffers) buffers->insert(e->id);
  for (const Expr& a : e->args) exprUses(a, scalars, buffers);
}

// Calls f on every statement of `body`, depth first.
void walk(const std::vector<Stmt>& body, const std::function<void(const Stmt&)>& f) {
  for (const Stmt& s : body) {
    f(s);
    if (s.kind == Stmt::For) walk(s.body, f);
  }
}

// Scalars and buffers a statement list reads or writes (its own loop variables included).
struct Uses {
  std::set<int64_t> scalars, buffers, stored, assigned;
};
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

// Scalars a statement list defines (loop variables, lets, accumulators it assigns).
std::set<int64_t> definedIn(const std::vector<Stmt>& body) {
  std::set<int64_t> d;
  walk(body, [&](const Stmt& s) {
    if (s.kind != Stmt::Store) d.insert(s.id);
  });
  return d;
}

// The outer perfect nest of a statement list (loops whose body is exactly one loop), split into
// the loops whose iterations are independent and those that must stay serial.
//
// A loop is parallel when every store in the nest writes an index that involves its variable,
// and every load of a buffer the nest stores involves it too (so an iteration reads back only
// what it wrote). The lowering's fused rows satisfy this; an accumulation over an outer loop
// does not (`for r { for i { t[i] = t[i] + x[r, i] } }`: r is missing from the store) and runs
// serially inside each parallel iteration -- an interchange that is valid because each parallel
// iteration touches only its own locations.
struct Nest {
  std::vector<int64_t> vars, extents;  // the parallel loops, outermost first
  const std::vector<Stmt>* inner = nullptr;  // the innermost loop's body (in the program)
  std::vector<Stmt> owned;                   // it wrapped in the serial loops, when there are any
  const std::vector<Stmt>& body() const { return owned.empty() ? *inner : owned; }
  int64_t total() const {
    int64_t t = 1;
    for (int64_t e : extents) t *= e;
    return t;
  }
};

// Loop variables an index depends on by position: those outside the loads it reads. An index
// that reads data (embedding_backward's scatter `y[rows[t] * H + h]`) may repeat for different
// values of the variables that reach it only through a load, so only positional ones tell that
// two iterations write different locations.
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

// The loops of the outer perfect nest, outermost first.
std::vector<const Stmt*> perfectLoops(const std::vector<Stmt>& root) {
  std::vector<const Stmt*> loops;
  const std::vector<Stmt>* body = &root;
  while (body->size() == 1 && body->front().kind == Stmt::For) {
    loops.push_back(&body->front());
    body = &body->front().body;
  }
  return loops;
}

// `row_local`: temporaries each parallel worker gets a copy of; they carry no dependence.
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

// Iterations of the loops inside a body (an estimate of a row's work).
int64_t innerWork(const std::vector<Stmt>& body) {
  int64_t w = 0;
  for (const Stmt& s : body)
    if (s.kind == Stmt::For) w = std::max(w, s.extent * std::max<int64_t>(1, innerWork(s.body)));
  return w;
}

// Thread: one thread per outer iteration. Block: one block per outer iteration. Columns: a nest
// whose outer loops are an accumulation over inner serial loops (a reduction over a dim that is
// not innermost: `for r { for i { y[i] = y[i] + x[r, i] } }`): a block takes 32 consecutive
// outer iterations (one per lane: coalesced), its 8 warps split the serial loops, and a
// shared-memory pass combines their partial results.
enum class Mode { Thread, Block, Columns };

bool sameExpr(const Expr& a, const Expr& b) {
  if (a == b) return true;
  if (a->op != b->op || a->type != b->type || a->value != b->value || a->id != b->id || a->round_to != b->round_to ||
      a->args.size() != b->args.size())
    return false;
  for (size_t i = 0; i < a->args.size(); ++i)
    if (!sameExpr(a->args[i], b->args[i])) return false;
  return true;
}

bool loadsBuffer(const Expr& e, int64_t buffer) {
  if (e->op == Op::Load && e->id == buffer) return true;
  return std::any_of(e->args.begin(), e->args.end(), [&](const Expr& a) { return loadsBuffer(a, buffer); });
}

// An accumulation nest: perfect loops whose body is lets and one update of a location the loops
// do not move: a store `b[I] = op(b[I], v)` with I independent of the loops, or an accumulator
// `acc = op(acc, v)` (op add/max/min). Its iterations combine into that location in any order:
// threads (and blocks) may split them, each keeping a partial.
struct Accumulation {
  std::vector<const Stmt*> loops;  // outermost first
  std::vector<const Stmt*> lets;   // the innermost body's lets, in order
  const Stmt* store = nullptr;     // the update (a Store or an Assign)
  Expr target;                     // the update's read of its location (b[I] or acc)
  Expr value;                      // v
  Op op = Op::Add;
  Type type = Type::F32;           // of the combined values
  int64_t trips() const {
    int64_t t = 1;
    for (const Stmt* l : loops) t *= l->extent;
    return t;
  }
};

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
    const bool is_target = assign ? t->op == Op::Var && t->id == a.store->id
                                  : t->op == Op::Load && t->id == a.store->id && sameExpr(t->args[0], a.store->index);
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

// A full reduction split over the whole GPU: the accumulation `loop` of a one-block kernel runs
// first as a grid of `blocks` blocks that each write a partial result to extra buffer `partials`;
// the kernel then combines the partials where the loop was.
struct GridSplit {
  const Stmt* loop = nullptr;
  int64_t partials = -1;
  int64_t blocks = 0;
};

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

struct VectorPlan {
  int width = 1;                          // elements per thread; 1: not vectorized
  std::vector<const kir::Node*> loads;    // loads with unit stride, in first-use order
  std::vector<const Stmt*> stores;        // every store (all have unit stride)
};

void collectLoads(const Expr& e, std::vector<const kir::Node*>& out) {
  if (e->op == Op::Load && std::find(out.begin(), out.end(), e.get()) == out.end()) out.push_back(e.get());
  for (const Expr& a : e->args) collectLoads(a, out);
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

// The unsigned type of a `bytes`-wide access.
const char* vectorType(int64_t bytes) {
  switch (bytes) {
    case 16: return "uint4";
    case 8: return "uint2";
    case 4: return "unsigned int";
    case 2: return "unsigned short";
    default: return "unsigned char";
  }
}


// A reduction the emitter recognized: accumulator `acc = op(acc, x)` over a parallel loop.
struct Reduction {
  int64_t acc;
  Op op;
};

class KernelWriter {
 public:
  KernelWriter(const kir::Program& p, const std::string& bufs_type, const Nest& nest, Mode mode,
               const std::set<int64_t>& private_buffers, const VectorPlan& vectors, GridSplit split = {})
      : p_(p), bufs_type_(bufs_type), nest_(nest), mode_(mode), private_(private_buffers), vectors_(vectors),
        split_(split) {}

  std::string write(const std::string& name) {
    const Uses u = usesOf(nest_.body());
    out_ = fmt::format("extern \"C\" __global__ void __launch_bounds__({}) {}({} mf_bufs) {{\n", kThreads, name,
                       bufs_type_);
    indent_ = 1;
    declare(u);
    if (split_.loop != nullptr) declarePartials();
    if (mode_ == Mode::Columns) {
      columns();
      return out_ + "}\n\n";
    }
    if (mode_ == Mode::Thread) {
      line("const long long mf_w = blockIdx.x * (long long)blockDim.x + threadIdx.x;");
      line("const long long mf_W = (long long)gridDim.x * blockDim.x;");
    } else {
      line("const long long mf_w = blockIdx.x, mf_W = gridDim.x;");
    }
    const int width = vectors_.width;
    line(fmt::format("for (long long mf_o = mf_w; mf_o < {}LL; mf_o += mf_W) {{", nest_.total() / width));
    ++indent_;
    memo_.emplace_back();
    if (!nest_.vars.empty()) line(width > 1 ? fmt::format("long long mf_rest = mf_o * {};", width) : "long long mf_rest = mf_o;");
    for (size_t d = nest_.vars.size(); d-- > 0;) {
      line(fmt::format("const long long s{} = mf_rest % {}LL;", nest_.vars[d], nest_.extents[d]));
      if (d > 0) line(fmt::format("mf_rest /= {}LL;", nest_.extents[d]));
    }
    if (width > 1) {
      vectorBody();
    } else if (mode_ == Mode::Thread) {
      stmts(nest_.body(), false);
    } else {
      blockBody(nest_.body());
      line("__syncthreads();  // the next row reuses shared memory and private temporaries");
    }
    memo_.pop_back();
    --indent_;
    line("}");
    return out_ + "}\n\n";
  }

  // The first kernel of a GridSplit: every block reduces its share of the accumulation's
  // iterations and writes its partial result; `prefix` are the statements before the loop (lets
  // and accumulators: uniform values the loop may read).
  std::string writePartials(const std::string& name, const Accumulation& a, const std::vector<Stmt>& prefix) {
    out_ = fmt::format("extern \"C\" __global__ void __launch_bounds__({}) {}({} mf_bufs) {{\n", kThreads, name,
                       bufs_type_);
    indent_ = 1;
    std::vector<Stmt> used = prefix;
    used.push_back(*a.loops.front());
    Uses u = usesOf(used);
    if (a.store->kind == Stmt::Store) {  // the target is written by the combining kernel only
      u.buffers.erase(a.store->id);
      u.stored.erase(a.store->id);
    }
    declare(u);
    declarePartials();
    memo_.emplace_back();
    stmts(prefix, /*guard_stores=*/false);
    const std::string q = accumulate(a, "blockIdx.x * (long long)blockDim.x + threadIdx.x",
                                     "(long long)gridDim.x * blockDim.x");
    line(fmt::format("{0} = mf_block_reduce({0}, {1}());", q, reduceOp(a.op)));
    line(fmt::format("if (threadIdx.x == 0) mf_partials[blockIdx.x] = {};", q));
    memo_.pop_back();
    return out_ + "}\n\n";
  }

 private:
  void line(const std::string& s) { out_ += std::string(2 * indent_, ' ') + s + "\n"; }

  void declare(const Uses& u) {
    for (int64_t b : u.buffers) {
      const DataType dt = p_.buffers.at(b).dtype;
      // Only what the kernel writes needs __restrict__'s promise to the compiler about others'
      // writes; the runtime checks that no output overlaps another buffer
      // (checkSegmentBuffersDisjoint), which is what makes the promise hold.
      // (An in-place output and its input share a buffer: neither promises anything.)
      line(fmt::format("{}{}* {}b{} = static_cast<{}*>(mf_bufs.p[{}]);", u.stored.count(b) ? "" : "const ",
                       storageType(dt), p_.buffers.at(b).may_alias ? "" : "__restrict__ ", b, storageType(dt), b));
    }
    for (int64_t s : u.scalars)
      if (p_.scalars.at(s).kind == kir::Scalar::Accumulator) line(fmt::format("{} s{};", ctype(p_.scalars[s].type), s));
    for (int64_t s : u.assigned)
      if (!u.scalars.count(s)) line(fmt::format("{} s{};", ctype(p_.scalars.at(s).type), s));
  }

  void declarePartials() {
    const Accumulation a = *accumulationOf(*split_.loop);
    line(fmt::format("{0}* __restrict__ mf_partials = static_cast<{0}*>(mf_bufs.p[{1}]);", ctype(a.type),
                     split_.partials));
  }

  // Binds the variables of `loops` (outermost first) from the row-major flat index `flat`.
  void unflatten(const std::string& flat, const std::vector<const Stmt*>& loops) {
    if (loops.size() == 1) {
      line(fmt::format("const long long s{} = {};", loops[0]->id, flat));
      return;
    }
    line(fmt::format("long long mf_r = {};", flat));
    for (size_t d = loops.size(); d-- > 0;) {
      line(fmt::format("const long long s{} = mf_r % {}LL;", loops[d]->id, loops[d]->extent));
      if (d > 0) line(fmt::format("mf_r /= {}LL;", loops[d]->extent));
    }
  }

  // Declares a partial `mf_q<n>` and loops over the accumulation's iterations (flattened, so that
  // consecutive threads read consecutive elements) from `first` by `step`, combining each value
  // into it. Returns the partial's name.
  std::string accumulate(const Accumulation& a, const std::string& first, const std::string& step) {
    const std::string q = fmt::format("mf_q{}", next_value_++);
    line(fmt::format("{} {} = {};", ctype(a.type), q, identity(a.op, a.type)));
    line(fmt::format("for (long long mf_f = {}; mf_f < {}LL; mf_f += {}) {{", first, a.trips(), step));
    ++indent_;
    memo_.emplace_back();
    unflatten("mf_f", a.loops);
    for (const Stmt* l : a.lets) stmt(*l, false);
    line(fmt::format("{0} = {1}()({0}, {2});", q, reduceOp(a.op), expr(a.value)));
    memo_.pop_back();
    --indent_;
    line("}");
    return q;
  }

  // b[I] = op(b[I], q), by thread 0 (or by every thread when `guard` is false); an accumulator
  // acc = op(acc, q) by every thread (q is the block's total in every thread).
  void combineInto(const Accumulation& a, const std::string& q, bool guard) {
    if (a.store->kind == Stmt::Assign) {
      line(fmt::format("s{0} = {1}()(s{0}, {2});", a.store->id, reduceOp(a.op), q));
      return;
    }
    const int64_t fake = -1 - next_value_++;  // a scalar id the program does not use, named q
    rename_[fake] = q;
    Stmt st{Stmt::Store, a.store->id, 0, kir::binary(a.op, a.target, kir::var(fake, a.type)), a.store->index};
    stmt(st, guard);
    rename_.erase(fake);
  }

  // An accumulation loop of a block-mode body: the block's threads split its iterations.
  void accumulateLoop(const Accumulation& a) {
    line("{");
    ++indent_;
    memo_.emplace_back();
    const std::string q = accumulate(a, "threadIdx.x", "blockDim.x");
    line(fmt::format("{0} = mf_block_reduce({0}, {1}());", q, reduceOp(a.op)));
    combineInto(a, q, /*guard=*/true);
    memo_.pop_back();
    --indent_;
    line("}");
  }

  // The combining half of a GridSplit: the partials replace the loop.
  void combinePartials(const Accumulation& a) {
    line("{");
    ++indent_;
    const std::string q = fmt::format("mf_q{}", next_value_++);
    line(fmt::format("{} {} = {};", ctype(a.type), q, identity(a.op, a.type)));
    line(fmt::format("for (int mf_g = threadIdx.x; mf_g < {}; mf_g += blockDim.x) {} = {}()({}, mf_partials[mf_g]);",
                     split_.blocks, q, reduceOp(a.op), q));
    line(fmt::format("{0} = mf_block_reduce({0}, {1}());", q, reduceOp(a.op)));
    memo_.emplace_back();
    combineInto(a, q, /*guard=*/true);
    memo_.pop_back();
    --indent_;
    line("}");
  }

  // Columns mode (see Mode): the nest's parallel loops over lanes (32 per tile), its serial loops
  // -- one accumulation nest -- over the block's warps.
  void columns() {
    const Accumulation a = *accumulationOf(nest_.owned.front());
    const int64_t tiles = (nest_.total() + 31) / 32;
    line(fmt::format("__shared__ {} mf_col[32][33];  // [warp][lane], padded: no bank conflicts", ctype(a.type)));
    line("const int mf_lane = threadIdx.x & 31, mf_row = threadIdx.x >> 5, mf_rows = blockDim.x >> 5;");
    line(fmt::format("for (long long mf_t = blockIdx.x; mf_t < {}LL; mf_t += gridDim.x) {{", tiles));
    ++indent_;
    memo_.emplace_back();
    line("const long long mf_o = mf_t * 32 + mf_lane;");
    line(fmt::format("const bool mf_in = mf_o < {}LL;", nest_.total()));
    line("long long mf_rest = mf_in ? mf_o : 0;");
    for (size_t d = nest_.vars.size(); d-- > 0;) {
      line(fmt::format("const long long s{} = mf_rest % {}LL;", nest_.vars[d], nest_.extents[d]));
      if (d > 0) line(fmt::format("mf_rest /= {}LL;", nest_.extents[d]));
    }
    const std::string q = accumulate(a, "mf_in ? (long long)mf_row : MF_LLONG_MAX", "mf_rows");
    line(fmt::format("mf_col[mf_row][mf_lane] = {};", q));
    line("__syncthreads();");
    line("if (mf_row == 0 && mf_in) {");
    ++indent_;
    line(fmt::format("for (int mf_k = 1; mf_k < mf_rows; ++mf_k) {0} = {1}()({0}, mf_col[mf_k][mf_lane]);", q,
                     reduceOp(a.op)));
    memo_.emplace_back();
    combineInto(a, q, /*guard=*/false);
    memo_.pop_back();
    --indent_;
    line("}");
    line("__syncthreads();  // mf_col is reused by the next tile");
    memo_.pop_back();
    --indent_;
    line("}");
  }

  // ---- expressions ------------------------------------------------------------------------
  std::string expr(const Expr& e) {
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

  std::string index(int64_t buffer, const Expr& idx) {
    std::string i = expr(idx);
    if (!private_.count(buffer)) return i;
    // A private temporary: thread mode interleaves workers (coalesced), block mode gives each
    // block a contiguous copy.
    if (mode_ == Mode::Thread) return fmt::format("({}) * mf_W + mf_w", i);
    return fmt::format("mf_w * {}LL + ({})", p_.buffers.at(buffer).numel(), i);
  }

  std::string load(const Expr& e) {
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

  static std::string convert(const std::string& v, Type from, Type to) {
    if (from == to) return v;
    if (to == Type::Bool) return fmt::format("({} != 0)", v);
    // float -> i64 truncates, saturates and maps NaN to 0, as the CPU's fptosi.sat: spelled out,
    // so that the host emulation (where the plain cast is undefined out of range) agrees.
    if (to == Type::I64 && isFloat(from)) return fmt::format("mf_f2ll({})", v);
    return fmt::format("static_cast<{}>({})", ctype(to), v);
  }

  std::string compute(const Expr& e) {
    if (e->op == Op::Round) {
      std::string x = expr(e->args[0]);
      return e->round_to == DataType::Half ? fmt::format("mf_f16_to_f32(mf_f32_to_f16({}))", x)
                                           : fmt::format("mf_round_bf16({})", x);
    }
    if (e->op == Op::Cast) return convert(expr(e->args[0]), e->args[0]->type, e->type);
    if (e->op == Op::Select)
      return fmt::format("({} ? {} : {})", expr(e->args[0]), expr(e->args[1]), expr(e->args[2]));
    if (e->args.size() == 1) return unary(e->op, expr(e->args[0]), e->args[0]->type);
    return binary(e->op, expr(e->args[0]), expr(e->args[1]), e->args[0]->type);
  }

  static std::string unary(Op op, const std::string& x, Type t) {
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

  static std::string binary(Op op, const std::string& a, const std::string& b, Type t) {
    const bool f32 = t == Type::F32;
    switch (op) {
      case Op::Add: return fmt::format("({} + {})", a, b);
      case Op::Sub: return fmt::format("({} - {})", a, b);
      case Op::Mul: return fmt::format("({} * {})", a, b);
      case Op::Div: return fmt::format("({} / {})", a, b);  // integers: of indices (non-negative)
      case Op::Rem: return isFloat(t) ? fmt::format("fmod{}({}, {})", f32 ? "f" : "", a, b) : fmt::format("({} % {})", a, b);
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

  // ---- statements, serially ---------------------------------------------------------------
  void stmt(const Stmt& s, bool guard_stores) {
    switch (s.kind) {
      case Stmt::For:
        line(fmt::format("for (long long s{0} = 0; s{0} < {1}LL; ++s{0}) {{", s.id, s.extent));
        ++indent_;
        memo_.emplace_back();
        stmts(s.body, guard_stores);
        memo_.pop_back();
        --indent_;
        line("}");
        return;
      case Stmt::Let:
        line(fmt::format("const {} s{} = {};", ctype(p_.scalars.at(s.id).type), s.id, expr(s.value)));
        return;
      case Stmt::Assign: {
        std::string v = expr(s.value);
        auto r = rename_.find(s.id);
        line(fmt::format("{} = {};", r != rename_.end() ? r->second : fmt::format("s{}", s.id), v));
        return;
      }
      case Stmt::Store: {
        const DataType dt = p_.buffers.at(s.id).dtype;
        std::string v = convert(expr(s.value), s.value->type, kir::valueTypeOf(dt));
        if (dt == DataType::BFloat16) v = fmt::format("mf_f32_to_bf16({})", v);
        if (dt == DataType::Half) v = fmt::format("mf_f32_to_f16({})", v);
        if (dt == DataType::Bool) v = fmt::format("static_cast<unsigned char>({})", v);
        if (auto lane = lane_ >= 0 ? vector_stores_.find(&s) : vector_stores_.end(); lane != vector_stores_.end()) {
          line(fmt::format("{}[{}] = {};", lane->second, lane_, v));
          return;
        }
        std::string st = fmt::format("b{}[{}] = {};", s.id, index(s.id, s.index), v);
        line(guard_stores ? "if (threadIdx.x == 0) " + st : st);
        return;
      }
    }
  }
  void stmts(const std::vector<Stmt>& body, bool guard_stores) {
    for (const Stmt& s : body) stmt(s, guard_stores);
  }

  // ---- vectorized pointwise body ------------------------------------------------------------
  // The group's lane-0 indices decide: all unit-stride accesses aligned to their width -> one
  // wide load per input and one wide store per output, the body unrolled over the lanes in
  // registers; else the lanes one by one with plain accesses (slices, odd offsets).
  void vectorBody() {
    const int width = vectors_.width;
    const int64_t inner = nest_.vars.back();
    line(fmt::format("const long long mf_lane0 = s{};", inner));
    struct Access {
      int64_t buffer;
      const Expr* index;
      std::string name;
    };
    std::vector<Access> accesses;
    for (size_t k = 0; k < vectors_.loads.size(); ++k)
      accesses.push_back({vectors_.loads[k]->id, &vectors_.loads[k]->args.at(0), fmt::format("mf_a{}", k)});
    for (size_t k = 0; k < vectors_.stores.size(); ++k)
      accesses.push_back({vectors_.stores[k]->id, &vectors_.stores[k]->index, fmt::format("mf_s{}", k)});
    // Lane-0 indices in a scope of their own: their subexpressions must not be reused by lanes.
    memo_.emplace_back();
    std::vector<std::string> idx, checks;
    for (const Access& a : accesses) {
      idx.push_back(expr(*a.index));
      const int64_t bytes = width * dtypeSize(p_.buffers.at(a.buffer).dtype);
      checks.push_back(fmt::format("reinterpret_cast<unsigned long long>(b{} + {}) % {} == 0", a.buffer, idx.back(), bytes));
    }
    memo_.pop_back();
    line(fmt::format("if ({}) {{", fmt::join(checks, " && ")));
    ++indent_;
    for (size_t k = 0; k < accesses.size(); ++k) {
      const Access& a = accesses[k];
      const DataType dt = p_.buffers.at(a.buffer).dtype;
      const char* vt = vectorType(width * dtypeSize(dt));
      if (k < vectors_.loads.size()) {
        line(fmt::format("const {} {}_v = *reinterpret_cast<const {}*>(b{} + {});", vt, a.name, vt, a.buffer, idx[k]));
        line(fmt::format("const {}* {} = reinterpret_cast<const {}*>(&{}_v);", storageType(dt), a.name, storageType(dt), a.name));
        vector_loads_[vectors_.loads[k]] = a.name;
      } else {
        line(fmt::format("{} {}[{}];", storageType(dt), a.name, width));
        vector_stores_[vectors_.stores[k - vectors_.loads.size()]] = a.name;
      }
    }
    for (int j = 0; j < width; ++j) {
      line("{");
      ++indent_;
      memo_.emplace_back();
      lane_ = j;
      line(fmt::format("const long long s{} = mf_lane0 + {};", inner, j));
      stmts(nest_.body(), false);
      lane_ = -1;
      memo_.pop_back();
      --indent_;
      line("}");
    }
    for (size_t k = vectors_.loads.size(); k < accesses.size(); ++k) {
      const char* vt = vectorType(width * dtypeSize(p_.buffers.at(accesses[k].buffer).dtype));
      line(fmt::format("*reinterpret_cast<{}*>(b{} + {}) = *reinterpret_cast<const {}*>({});", vt,
                       accesses[k].buffer, idx[k], vt, accesses[k].name));
    }
    vector_loads_.clear();
    vector_stores_.clear();
    --indent_;
    line("} else {");
    ++indent_;
    line(fmt::format("for (int mf_j = 0; mf_j < {}; ++mf_j) {{", width));
    ++indent_;
    memo_.emplace_back();
    line(fmt::format("const long long s{} = mf_lane0 + mf_j;", inner));
    stmts(nest_.body(), false);
    memo_.pop_back();
    --indent_;
    line("}");
    --indent_;
    line("}");
  }

  // ---- block mode -------------------------------------------------------------------------
  // One row's body, run by a whole block. Statements outside loops compute uniform values in
  // every thread; loops are spread over the threads when `parallelPlan` proves it safe.
  void blockBody(const std::vector<Stmt>& body) {
    std::set<int64_t> initialized;  // accumulators assigned so far in this body
    for (size_t i = 0; i < body.size(); ++i) {
      const Stmt& s = body[i];
      if (s.kind != Stmt::For) {
        stmt(s, /*guard_stores=*/true);
        if (s.kind == Stmt::Assign) initialized.insert(s.id);
        if (s.kind == Stmt::Store) line("__syncthreads();  // thread 0's store is read by the row's later stages");
        continue;
      }
      std::vector<Reduction> reductions;
      const std::vector<Stmt> rest(body.begin() + static_cast<std::ptrdiff_t>(i) + 1, body.end());
      const bool parallel = parallelPlan(s, initialized, rest, &reductions);
      const Uses u = usesOf({s});
      std::optional<Accumulation> acc;
      std::vector<const Stmt*> inner_parallel;
      if (&s == split_.loop) {
        combinePartials(*accumulationOf(s));
      } else if ((acc = accumulationOf(s)) && (acc->store->kind == Stmt::Store || parallel)) {
        accumulateLoop(*acc);  // (an accumulator must also pass parallelPlan: initialized, not read elsewhere)
      } else if (parallel) {
        parallelLoop(s, reductions);
      } else if (interchangePlan(s, &inner_parallel)) {
        interchangedLoop(s, inner_parallel);
      } else {
        stmt(s, /*guard_stores=*/true);
      }
      for (int64_t a : u.assigned) initialized.insert(a);
      if (!u.stored.empty()) line("__syncthreads();");
    }
  }

  // Whether the iterations of `loop` may run on different threads: every store's index varies
  // with the loop; accumulators it assigns are either its own (first assigned inside, not read
  // after it) or reductions `acc = op(acc, x)` (op add/max/min, acc read nowhere else in the loop).
  bool parallelPlan(const Stmt& loop, const std::set<int64_t>& initialized, const std::vector<Stmt>& rest,
                    std::vector<Reduction>* reductions) {
    bool ok = true;
    walk({loop}, [&](const Stmt& s) {
      if (s.kind == Stmt::Store) {
        std::set<int64_t> vars;
        positionalVars(s.index, &vars);
        if (!vars.count(loop.id)) ok = false;
      }
    });
    if (!ok) return false;
    const Uses inside = usesOf({loop});
    const Uses after = usesOf(rest);
    for (int64_t acc : inside.assigned) {
      if (!initialized.count(acc)) {  // the loop's own: must not carry a value out
        if (after.scalars.count(acc) || after.assigned.count(acc)) return false;
        continue;
      }
      std::optional<Op> op;
      int64_t reads = 0, assigns = 0;
      walk({loop}, [&](const Stmt& s) {
        if (s.value) reads += countVar(s.value, acc);
        if (s.index) reads += countVar(s.index, acc);
        if (s.kind != Stmt::Assign || s.id != acc) return;
        ++assigns;
        const Expr& v = s.value;
        const bool shape = v->args.size() == 2 && (v->op == Op::Add || v->op == Op::Max || v->op == Op::Min) &&
                           ((isVar(v->args[0], acc) && countVar(v->args[1], acc) == 0) ||
                            (isVar(v->args[1], acc) && countVar(v->args[0], acc) == 0));
        if (!shape || (op && *op != v->op)) ok = false;
        op = v->op;
      });
      if (!ok || reads != assigns) return false;  // acc read only as its own operand
      reductions->push_back({acc, *op});
    }
    return true;
  }

  // A perfect nest `for r { for i { ... } }` whose stores all index by some of its loops (`i`,
  // returned in `parallel`) and by none of the others (`r`), with no accumulators: each thread
  // takes values of the indexing loops and runs the others serially inside (an interchange: an
  // accumulation over a middle dim, `y[i] = y[i] + x[r, i]`, then keeps its partial sums in the
  // thread's own locations).
  bool interchangePlan(const Stmt& loop, std::vector<const Stmt*>* parallel) {
    std::vector<const Stmt*> loops = {&loop};
    while (loops.back()->body.size() == 1 && loops.back()->body.front().kind == Stmt::For)
      loops.push_back(&loops.back()->body.front());
    const Uses u = usesOf({loop});
    if (!u.assigned.empty() || u.stored.empty()) return false;
    std::vector<Expr> indices;  // stores, and loads of what the nest stores
    walk({loop}, [&](const Stmt& st) {
      if (st.kind == Stmt::Store) indices.push_back(st.index);
      std::function<void(const Expr&)> loads = [&](const Expr& e) {
        if (e->op == Op::Load && u.stored.count(e->id)) indices.push_back(e->args[0]);
        for (const Expr& a : e->args) loads(a);
      };
      if (st.value) loads(st.value);
      if (st.index) loads(st.index);
    });
    for (const Stmt* l : loops) {
      int64_t with = 0;
      for (const Expr& i : indices) with += involvesAll(i, {l->id});
      if (with == static_cast<int64_t>(indices.size())) {
        parallel->push_back(l);
      } else if (with != 0) {
        return false;
      }
    }
    return !parallel->empty() && parallel->size() < loops.size();
  }

  void interchangedLoop(const Stmt& loop, const std::vector<const Stmt*>& parallel) {
    int64_t total = 1;
    for (const Stmt* l : parallel) total *= l->extent;
    line(fmt::format("for (long long mf_i = threadIdx.x; mf_i < {}LL; mf_i += blockDim.x) {{", total));
    ++indent_;
    memo_.emplace_back();
    unflatten("mf_i", parallel);
    // The nest with the parallel loops removed (their variables are bound above).
    std::function<void(const Stmt&)> emit = [&](const Stmt& l) {
      const bool par = std::find(parallel.begin(), parallel.end(), &l) != parallel.end();
      if (!par) {
        line(fmt::format("for (long long s{0} = 0; s{0} < {1}LL; ++s{0}) {{", l.id, l.extent));
        ++indent_;
        memo_.emplace_back();
      }
      if (l.body.size() == 1 && l.body.front().kind == Stmt::For) {
        emit(l.body.front());
      } else {
        stmts(l.body, /*guard_stores=*/false);
      }
      if (!par) {
        memo_.pop_back();
        --indent_;
        line("}");
      }
    };
    emit(loop);
    memo_.pop_back();
    --indent_;
    line("}");
  }

  static bool isVar(const Expr& e, int64_t id) { return e->op == Op::Var && e->id == id; }
  static int64_t countVar(const Expr& e, int64_t id) {
    int64_t n = isVar(e, id) ? 1 : 0;
    for (const Expr& a : e->args) n += countVar(a, id);
    return n;
  }

  static const char* reduceOp(Op op) { return op == Op::Add ? "MfAdd" : op == Op::Max ? "MfMax" : "MfMin"; }
  std::string identity(Op op, Type t) const {
    if (op == Op::Add) return literal(0, t);
    if (t == Type::I64) return op == Op::Max ? "MF_LLONG_MIN" : "MF_LLONG_MAX";
    return literal(op == Op::Max ? -INFINITY : INFINITY, t);
  }

  void parallelLoop(const Stmt& loop, const std::vector<Reduction>& reductions) {
    for (const Reduction& r : reductions) {
      const Type t = p_.scalars.at(r.acc).type;
      line(fmt::format("{} mf_p{} = {};", ctype(t), r.acc, identity(r.op, t)));
      rename_[r.acc] = fmt::format("mf_p{}", r.acc);
    }
    line(fmt::format("for (long long s{0} = threadIdx.x; s{0} < {1}LL; s{0} += blockDim.x) {{", loop.id, loop.extent));
    ++indent_;
    memo_.emplace_back();
    stmts(loop.body, /*guard_stores=*/false);
    memo_.pop_back();
    --indent_;
    line("}");
    for (const Reduction& r : reductions) {
      rename_.erase(r.acc);
      const std::string total = fmt::format("mf_block_reduce(mf_p{}, {}())", r.acc, reduceOp(r.op));
      line(fmt::format("s{0} = {1}()(s{0}, {2});", r.acc, reduceOp(r.op), total));
    }
  }

  const kir::Program& p_;
  std::string bufs_type_;
  const Nest& nest_;
  Mode mode_;
  const std::set<int64_t>& private_;
  const VectorPlan& vectors_;
  GridSplit split_;
  int lane_ = -1;  // inside a vectorized group: the lane being emitted
  std::map<const kir::Node*, std::string> vector_loads_;  // load -> its lanes' array
  std::map<const Stmt*, std::string> vector_stores_;      // store -> its lanes' array
  std::string out_;
  int indent_ = 0;
  std::vector<std::map<const kir::Node*, std::string>> memo_;
  std::map<int64_t, std::string> rename_;
  int64_t next_value_ = 0;
};

}  // namespace

// The helpers every program's kernels use, after the prelude.
const char* kKernelHelpers = R"CUDA(
#ifndef MF_KERNEL_HELPERS
#define MF_KERNEL_HELPERS
#define MF_INF_F __int_as_float(0x7f800000)
#define MF_NAN_F __int_as_float(0x7fc00000)
#define MF_INF_D __longlong_as_double(0x7ff0000000000000LL)
#define MF_NAN_D __longlong_as_double(0x7ff8000000000000LL)
#define MF_LLONG_MAX 9223372036854775807LL
#define MF_LLONG_MIN (-MF_LLONG_MAX - 1LL)
__device__ __forceinline__ float mf_round_bf16(float x) { return x != x ? x : mf_bf16_to_f32(mf_f32_to_bf16(x)); }
__device__ __forceinline__ long long mf_f2ll(double x) {  // truncating, saturating, NaN -> 0
  return x != x ? 0LL : x >= 9.2233720368547758e18 ? MF_LLONG_MAX : x < -9.2233720368547758e18 ? MF_LLONG_MIN : (long long)x;
}
struct MfAdd { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; } };
struct MfMax { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a < b ? b : a; } };
struct MfMin { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return b < a ? b : a; } };
// Every thread of the block gets op over every thread's v (blockDim.x a multiple of 32).
template <typename T, typename Op>
__device__ __forceinline__ T mf_block_reduce(T v, Op op) {
  __shared__ T mf_warp_values[32];
  for (int m = 16; m > 0; m >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, m));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  __syncthreads();  // an earlier reduction's readers are done with mf_warp_values
  if (lane == 0) mf_warp_values[warp] = v;
  __syncthreads();
  v = mf_warp_values[0];
  for (int w = 1; w < warps; ++w) v = op(v, mf_warp_values[w]);
  return v;
}
#endif  // MF_KERNEL_HELPERS
)CUDA";

namespace {

// Temporaries of a kernel that hold one iteration of its outer loops: used by no other kernel
// of the program and indexed without any of `outer_vars`.
std::set<int64_t> privateTemporaries(const kir::Program& p, const std::vector<int64_t>& outer_vars,
                                     const std::vector<Stmt>& kernel_root, const std::map<int64_t, int>& kernels_using) {
  std::set<int64_t> out;
  if (outer_vars.empty()) return out;
  const Uses u = usesOf(kernel_root);
  for (int64_t b : u.buffers) {
    if (p.buffers.at(b).role != kir::Buffer::Temp || kernels_using.at(b) != 1) continue;
    bool outer = false;
    walk(kernel_root, [&](const Stmt& s) {
      std::vector<Expr> indices;
      if (s.kind == Stmt::Store && s.id == b) indices.push_back(s.index);
      std::function<void(const Expr&)> loads = [&](const Expr& e) {
        if (e->op == Op::Load && e->id == b) indices.push_back(e->args[0]);
        for (const Expr& a : e->args) loads(a);
      };
      if (s.value) loads(s.value);
      if (s.index) loads(s.index);
      for (const Expr& i : indices) {
        std::set<int64_t> vars;
        exprUses(i, &vars, nullptr);
        for (int64_t v : outer_vars) outer |= vars.count(v) > 0;
      }
    });
    if (!outer) out.insert(b);
  }
  return out;
}

// The kernels of one Loops step: several independent nests at the root launch one by one.
std::vector<std::vector<Stmt>> kernelRoots(const std::vector<Stmt>& root) {
  bool independent = root.size() > 1;
  for (const Stmt& s : root) {
    if (s.kind != Stmt::For) independent = false;
    if (!independent) break;
    const Uses u = usesOf({s});
    const std::set<int64_t> own = definedIn({s});
    for (int64_t v : u.scalars) independent &= own.count(v) > 0;
  }
  if (!independent) return {root};
  std::vector<std::vector<Stmt>> out;
  for (const Stmt& s : root) out.push_back({s});
  return out;
}

}  // namespace

EmittedProgram emitCuda(const kir::Program& p, const std::string& prefix, int sm_count) {
  EmittedProgram out;
  out.copies.assign(p.buffers.size(), 1);
  const std::string bufs_type = fmt::format("MfBufs_{}", prefix);
  std::string kernels;
  // How many kernels of the whole program touch each buffer (private temporaries: exactly one),
  // GEMM calls counting as users of their operands.
  std::vector<std::vector<std::vector<Stmt>>> roots(p.steps.size());
  std::map<int64_t, int> kernels_using;
  for (size_t b = 0; b < p.buffers.size(); ++b) kernels_using[static_cast<int64_t>(b)] = 0;
  for (size_t i = 0; i < p.steps.size(); ++i) {
    const kir::Step& step = p.steps[i];
    if (step.kind == kir::Step::GemmCall) {
      for (int64_t b : {step.gemm.a.buffer, step.gemm.b.buffer, step.gemm.c.buffer}) kernels_using[b] += 1;
      continue;
    }
    if (step.kind == kir::Step::AttentionCall) {
      const kir::Attention& a = step.attention;
      for (int64_t b : {a.q, a.k, a.v, a.o, a.lse})
        if (b >= 0) kernels_using[b] += 1;
      continue;
    }
    roots[i] = kernelRoots(step.loops.body);
    for (const std::vector<Stmt>& r : roots[i])
      for (int64_t b : usesOf(r).buffers) kernels_using[b] += 1;
  }
  for (size_t i = 0; i < p.steps.size(); ++i) {
    out.steps.emplace_back();
    if (p.steps[i].kind == kir::Step::AttentionCall) {  // its own kernel (cuda_attention.h)
      KernelLaunch l;
      l.name = fmt::format("{}_s{}_attention", prefix, i);
      kernels += emitAttentionKernel(p.steps[i].attention, bufs_type, l);
      out.steps.back().push_back(l);
      continue;
    }
    for (size_t k = 0; k < roots[i].size(); ++k) {
      const std::vector<Stmt>& root = roots[i][k];
      std::vector<int64_t> loop_vars;
      for (const Stmt* l : perfectLoops(root)) loop_vars.push_back(l->id);
      const std::set<int64_t> priv = privateTemporaries(p, loop_vars, root, kernels_using);
      const Nest nest = outerNest(root, priv);
      const int64_t total = nest.total(), work = innerWork(nest.body());
      Mode mode = work == 0 || (work <= 32 && total >= int64_t{sm_count} * 4 * kThreads) ? Mode::Thread : Mode::Block;
      if (!nest.owned.empty()) {
        // Serial loops around the body: an accumulation over outer dims. Never one block per outer
        // iteration (its threads would wait on one serial loop): columns when the serial loops
        // are one accumulation nest, else a thread per outer iteration.
        std::optional<Accumulation> a = nest.owned.size() == 1 ? accumulationOf(nest.owned.front()) : std::nullopt;
        mode = priv.empty() && a && a->store->kind == Stmt::Store ? Mode::Columns : Mode::Thread;
      }
      const VectorPlan vectors = mode == Mode::Thread && priv.empty() ? planVectors(p, nest) : VectorPlan{};
      const int64_t groups = total / vectors.width;
      // A one-block kernel whose first loop is a long accumulation (a full reduction): that loop
      // runs first on a grid, whose partial results the kernel combines (GridSplit).
      GridSplit split;
      std::optional<Accumulation> split_acc;
      std::vector<Stmt> split_prefix;  // the statements before the loop that it may read
      if (mode == Mode::Block && nest.vars.empty()) {
        const Stmt* first = nullptr;
        for (const Stmt& st : nest.body()) {
          if (st.kind == Stmt::For) {
            first = &st;
            break;
          }
          if (st.kind != Stmt::Store) split_prefix.push_back(st);
        }
        split_acc = first ? accumulationOf(*first) : std::nullopt;
        if (split_acc && split_acc->store->kind == Stmt::Assign &&
            std::none_of(split_prefix.begin(), split_prefix.end(), [&](const Stmt& st) {
              return st.kind == Stmt::Assign && st.id == split_acc->store->id;
            }))
          split_acc.reset();  // an accumulator the loop does not continue
        bool reads_stored = false;  // the grid cannot see what the kernel stores before the loop
        if (split_acc) {
          const std::set<int64_t> stored = usesOf(nest.body()).stored;
          std::set<int64_t> read;
          exprUses(split_acc->value, nullptr, &read);
          for (const Stmt* let : split_acc->lets) exprUses(let->value, nullptr, &read);
          for (int64_t b : read) reads_stored |= stored.count(b) > 0;
        }
        constexpr int64_t kPerThread = 8;  // iterations per thread before another block pays off
        if (split_acc && !reads_stored && split_acc->trips() >= 2 * kThreads * kPerThread) {
          split.loop = first;
          split.blocks = std::min<int64_t>((split_acc->trips() + kThreads * kPerThread - 1) / (kThreads * kPerThread),
                                           int64_t{sm_count} * 4);
          split.partials = static_cast<int64_t>(p.buffers.size() + out.extra_bytes.size());
          out.extra_bytes.push_back(split.blocks * (split_acc->type == Type::F32 ? 4 : 8));
          KernelLaunch pl{fmt::format("{}_s{}_k{}p", prefix, i, k), split.blocks, kThreads};
          kernels += fmt::format("// step {} ({}), kernel {}: its full reduction's {} iterations on {} blocks\n", i,
                                 p.steps[i].loops.name, k, split_acc->trips(), split.blocks);
          kernels +=
              KernelWriter(p, bufs_type, nest, mode, priv, VectorPlan{}, split).writePartials(pl.name, *split_acc, split_prefix);
          out.steps.back().push_back(pl);
        }
      }
      KernelLaunch l;
      l.name = fmt::format("{}_s{}_k{}", prefix, i, k);
      int64_t workers = mode == Mode::Thread    ? std::min<int64_t>((groups + kThreads - 1) / kThreads, int64_t{sm_count} * 32) * kThreads
                        : mode == Mode::Columns ? std::min<int64_t>((total + 31) / 32, int64_t{sm_count} * 16)
                                                : std::min<int64_t>(total, int64_t{sm_count} * 16);
      int64_t private_bytes = 0;
      for (int64_t b : priv) private_bytes += p.buffers[b].numel() * dtypeSize(p.buffers[b].dtype);
      if (private_bytes > 0) workers = std::max<int64_t>(1, std::min(workers, kPrivateBytesCap / private_bytes));
      if (mode == Mode::Thread) workers = std::max<int64_t>(kThreads, workers / kThreads * kThreads);
      workers = std::max<int64_t>(workers, 1);
      l.blocks = mode == Mode::Thread ? workers / kThreads : workers;
      for (int64_t b : priv) out.copies[b] = mode == Mode::Thread ? l.blocks * kThreads : l.blocks;
      const char* mode_name = mode == Mode::Thread ? "thread" : mode == Mode::Block ? "block" : "columns";
      kernels += fmt::format("// step {} ({}), kernel {}: {} mode over {} outer iteration(s){}{}\n", i,
                             p.steps[i].loops.name, k, mode_name, total,
                             vectors.width > 1 ? fmt::format(", {} per thread (vectorized)", vectors.width) : "",
                             split.loop ? ", combining the partial results" : "");
      kernels += KernelWriter(p, bufs_type, nest, mode, priv, vectors, split).write(l.name);
      out.steps.back().push_back(l);
    }
  }
  out.source = cudaPrelude() + kKernelHelpers +
               fmt::format("struct {} {{ void* p[{}]; }};\n\n", bufs_type,
                           std::max<size_t>(p.buffers.size() + out.extra_bytes.size(), 1)) +
               kernels;
  return out;
}

}  // namespace meshfuse::cuda

namespace meshfuse {

std::string cudaSource(const kir::Program& program, const std::string& prefix, int sm_count, bool with_prelude) {
  cuda::EmittedProgram e = cuda::emitCuda(program, prefix, sm_count);
  std::string out = fmt::format("// launches on a GPU of {} SMs, in order:\n", sm_count);
  for (size_t i = 0; i < e.steps.size(); ++i) {
    if (program.steps[i].kind == kir::Step::GemmCall) {
      out += fmt::format("//   step {}: f32 GEMM call (cuBLASLt)\n", i);
      continue;
    }
    for (const cuda::KernelLaunch& l : e.steps[i])
      out += fmt::format("//   step {}: {}<<<{}, {}>>>\n", i, l.name, l.blocks, l.threads);
  }
  for (size_t b = 0; b < e.copies.size(); ++b)
    if (e.copies[b] > 1) out += fmt::format("//   buffer b{}: {} private copies\n", b, e.copies[b]);
  const size_t header = cuda::cudaPrelude().size() + std::strlen(cuda::kKernelHelpers);
  MF_CHECK(e.source.size() >= header, "emitted CUDA source shorter than its prelude");
  return out + (with_prelude ? e.source : e.source.substr(header));
}

}  // namespace meshfuse
