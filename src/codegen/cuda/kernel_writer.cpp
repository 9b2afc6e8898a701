// The CUDA kernel writer (contract in kernel_writer.h).
#include "codegen/cuda/kernel_writer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "meshfuse/error.h"

namespace meshfuse::cuda {

std::string KernelWriter::write(const std::string& name) {
  const Uses u = usesOf(nest_.body());
  out_ =
      fmt::format("extern \"C\" __global__ void __launch_bounds__({}) {}({} mf_bufs) {{\n", kThreads, name, bufs_type_);
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
  if (!nest_.vars.empty())
    line(width > 1 ? fmt::format("long long mf_rest = mf_o * {};", width) : "long long mf_rest = mf_o;");
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
std::string KernelWriter::writePartials(const std::string& name, const Accumulation& a,
                                        const std::vector<Stmt>& prefix) {
  out_ =
      fmt::format("extern \"C\" __global__ void __launch_bounds__({}) {}({} mf_bufs) {{\n", kThreads, name, bufs_type_);
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
  const std::string q =
      accumulate(a, "blockIdx.x * (long long)blockDim.x + threadIdx.x", "(long long)gridDim.x * blockDim.x");
  line(fmt::format("{0} = mf_block_reduce({0}, {1}());", q, reduceOp(a.op)));
  line(fmt::format("if (threadIdx.x == 0) mf_partials[blockIdx.x] = {};", q));
  memo_.pop_back();
  return out_ + "}\n\n";
}

void KernelWriter::declare(const Uses& u) {
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

void KernelWriter::declarePartials() {
  const Accumulation a = *accumulationOf(*split_.loop);
  line(fmt::format("{0}* __restrict__ mf_partials = static_cast<{0}*>(mf_bufs.p[{1}]);", ctype(a.type),
                   split_.partials));
}

// Binds the variables of `loops` (outermost first) from the row-major flat index `flat`.
void KernelWriter::unflatten(const std::string& flat, const std::vector<const Stmt*>& loops) {
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
std::string KernelWriter::accumulate(const Accumulation& a, const std::string& first, const std::string& step) {
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
void KernelWriter::combineInto(const Accumulation& a, const std::string& q, bool guard) {
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
void KernelWriter::accumulateLoop(const Accumulation& a) {
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
void KernelWriter::combinePartials(const Accumulation& a) {
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
void KernelWriter::columns() {
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

// ---- statements, serially ---------------------------------------------------------------
void KernelWriter::stmt(const Stmt& s, bool guard_stores) {
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

void KernelWriter::stmts(const std::vector<Stmt>& body, bool guard_stores) {
  for (const Stmt& s : body) stmt(s, guard_stores);
}

// ---- vectorized pointwise body ------------------------------------------------------------
// The group's lane-0 indices decide: all unit-stride accesses aligned to their width -> one
// wide load per input and one wide store per output, the body unrolled over the lanes in
// registers; else the lanes one by one with plain accesses (slices, odd offsets).
void KernelWriter::vectorBody() {
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
    checks.push_back(
        fmt::format("reinterpret_cast<unsigned long long>(b{} + {}) % {} == 0", a.buffer, idx.back(), bytes));
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
      line(fmt::format("const {}* {} = reinterpret_cast<const {}*>(&{}_v);", storageType(dt), a.name, storageType(dt),
                       a.name));
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
    line(fmt::format("*reinterpret_cast<{}*>(b{} + {}) = *reinterpret_cast<const {}*>({});", vt, accesses[k].buffer,
                     idx[k], vt, accesses[k].name));
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
void KernelWriter::blockBody(const std::vector<Stmt>& body) {
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
bool KernelWriter::parallelPlan(const Stmt& loop, const std::set<int64_t>& initialized, const std::vector<Stmt>& rest,
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
bool KernelWriter::interchangePlan(const Stmt& loop, std::vector<const Stmt*>* parallel) {
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

void KernelWriter::interchangedLoop(const Stmt& loop, const std::vector<const Stmt*>& parallel) {
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

int64_t KernelWriter::countVar(const Expr& e, int64_t id) {
  int64_t n = isVar(e, id) ? 1 : 0;
  for (const Expr& a : e->args) n += countVar(a, id);
  return n;
}

std::string KernelWriter::identity(Op op, Type t) const {
  if (op == Op::Add) return literal(0, t);
  if (t == Type::I64) return op == Op::Max ? "MF_LLONG_MIN" : "MF_LLONG_MAX";
  return literal(op == Op::Max ? -INFINITY : INFINITY, t);
}

void KernelWriter::parallelLoop(const Stmt& loop, const std::vector<Reduction>& reductions) {
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

}  // namespace meshfuse::cuda
