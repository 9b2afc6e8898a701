// Writes one CUDA kernel of a kernel IR loop nest in the mode emitCuda chose for it
// (cuda_emitter.h: thread, block or columns mode; vectorized pointwise bodies; a full
// reduction's grid of partial results). Internal to src/codegen/cuda.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "codegen/cuda/kernel_plan.h"

namespace meshfuse::cuda {

class KernelWriter {
 public:
  KernelWriter(const kir::Program& p, const std::string& bufs_type, const Nest& nest, Mode mode,
               const std::set<int64_t>& private_buffers, const VectorPlan& vectors, GridSplit split = {})
      : p_(p),
        bufs_type_(bufs_type),
        nest_(nest),
        mode_(mode),
        private_(private_buffers),
        vectors_(vectors),
        split_(split) {}

  std::string write(const std::string& name);

  // The first kernel of a GridSplit: every block reduces its share of the accumulation's
  // iterations and writes its partial result; `prefix` are the statements before the loop (lets
  // and accumulators: uniform values the loop may read).
  std::string writePartials(const std::string& name, const Accumulation& a, const std::vector<Stmt>& prefix);

 private:
  void line(const std::string& s) { out_ += std::string(2 * indent_, ' ') + s + "\n"; }

  void declare(const Uses& u);

  void declarePartials();

  // Binds the variables of `loops` (outermost first) from the row-major flat index `flat`.
  void unflatten(const std::string& flat, const std::vector<const Stmt*>& loops);

  // Declares a partial `mf_q<n>` and loops over the accumulation's iterations (flattened, so that
  // consecutive threads read consecutive elements) from `first` by `step`, combining each value
  // into it. Returns the partial's name.
  std::string accumulate(const Accumulation& a, const std::string& first, const std::string& step);

  // b[I] = op(b[I], q), by thread 0 (or by every thread when `guard` is false); an accumulator
  // acc = op(acc, q) by every thread (q is the block's total in every thread).
  void combineInto(const Accumulation& a, const std::string& q, bool guard);

  // An accumulation loop of a block-mode body: the block's threads split its iterations.
  void accumulateLoop(const Accumulation& a);

  // The combining half of a GridSplit: the partials replace the loop.
  void combinePartials(const Accumulation& a);

  // Columns mode (see Mode): the nest's parallel loops over lanes (32 per tile), its serial loops
  // -- one accumulation nest -- over the block's warps.
  void columns();

  // ---- expressions ------------------------------------------------------------------------
  std::string expr(const Expr& e);

  std::string index(int64_t buffer, const Expr& idx);

  std::string load(const Expr& e);

  static std::string convert(const std::string& v, Type from, Type to);

  std::string compute(const Expr& e);

  static std::string unary(Op op, const std::string& x, Type t);

  static std::string binary(Op op, const std::string& a, const std::string& b, Type t);

  // ---- statements, serially ---------------------------------------------------------------
  void stmt(const Stmt& s, bool guard_stores);
  void stmts(const std::vector<Stmt>& body, bool guard_stores);

  // ---- vectorized pointwise body ------------------------------------------------------------
  // The group's lane-0 indices decide: all unit-stride accesses aligned to their width -> one
  // wide load per input and one wide store per output, the body unrolled over the lanes in
  // registers; else the lanes one by one with plain accesses (slices, odd offsets).
  void vectorBody();

  // ---- block mode -------------------------------------------------------------------------
  // One row's body, run by a whole block. Statements outside loops compute uniform values in
  // every thread; loops are spread over the threads when `parallelPlan` proves it safe.
  void blockBody(const std::vector<Stmt>& body);

  // Whether the iterations of `loop` may run on different threads: every store's index varies
  // with the loop; accumulators it assigns are either its own (first assigned inside, not read
  // after it) or reductions `acc = op(acc, x)` (op add/max/min, acc read nowhere else in the loop).
  bool parallelPlan(const Stmt& loop, const std::set<int64_t>& initialized, const std::vector<Stmt>& rest,
                    std::vector<Reduction>* reductions);

  // A perfect nest `for r { for i { ... } }` whose stores all index by some of its loops (`i`,
  // returned in `parallel`) and by none of the others (`r`), with no accumulators: each thread
  // takes values of the indexing loops and runs the others serially inside (an interchange: an
  // accumulation over a middle dim, `y[i] = y[i] + x[r, i]`, then keeps its partial sums in the
  // thread's own locations).
  bool interchangePlan(const Stmt& loop, std::vector<const Stmt*>* parallel);

  void interchangedLoop(const Stmt& loop, const std::vector<const Stmt*>& parallel);

  static bool isVar(const Expr& e, int64_t id) { return e->op == Op::Var && e->id == id; }
  static int64_t countVar(const Expr& e, int64_t id);

  static const char* reduceOp(Op op) { return op == Op::Add ? "MfAdd" : op == Op::Max ? "MfMax" : "MfMin"; }
  std::string identity(Op op, Type t) const;

  void parallelLoop(const Stmt& loop, const std::vector<Reduction>& reductions);

  const kir::Program& p_;
  std::string bufs_type_;
  const Nest& nest_;
  Mode mode_;
  const std::set<int64_t>& private_;
  const VectorPlan& vectors_;
  GridSplit split_;
  int lane_ = -1;                                         // inside a vectorized group: the lane being emitted
  std::map<const kir::Node*, std::string> vector_loads_;  // load -> its lanes' array
  std::map<const Stmt*, std::string> vector_stores_;      // store -> its lanes' array
  std::string out_;
  int indent_ = 0;
  std::vector<std::map<const kir::Node*, std::string>> memo_;
  std::map<int64_t, std::string> rename_;
  int64_t next_value_ = 0;
};

}  // namespace meshfuse::cuda
