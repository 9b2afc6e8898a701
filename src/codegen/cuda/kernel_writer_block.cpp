// The CUDA kernel writer's block mode (contract in kernel_writer.h): one row's body run by a whole
// block, its loops spread over the threads (interchanged where that is what makes them parallel)
// and its reductions combined across the block. Apart because the proofs that a loop may be spread
// belong to this mode alone.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <set>

#include "codegen/cuda/kernel_writer.h"

namespace meshfuse::cuda {

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
