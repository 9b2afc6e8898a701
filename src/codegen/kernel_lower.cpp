// Kernel segments -> one loop nest (and kir::lowerSegment, the entry point for every segment).
//
// requires: a Kernel segment (no GEMM, no communication) and the local shape of every value.
// guarantees: one LoopNest that computes every segment output exactly once per element, reading
//   inputs and writing outputs only; values internal to the segment live in registers
//   (accumulators, lets) or in temporaries the runtime provides.
//
// Schedule. The values that must be stored (the stages) are the reductions, concatenations and
// segment outputs; everything else is inlined into the stage that reads it (recomputed, never
// stored). Stages share the k outermost loops of the largest stage (the anchor): inside one
// outer iteration they run one after another, each over its own inner loops. k is the largest
// depth at which that is legal: every stage iterates the anchor's first k dims, no reduction
// reduces one of them, and every stored value is read back only where it was written (same
// outer indices). So a row-wise chain becomes one pass per row with its statistics in
// registers:
//
//   %m = max(%x, dims=[1]) ... %y = div(%e, %s)        for i0 in [0, rows) {
//   (softmax of [rows, n] over dim 1)          =>        acc1 = -inf; for i2 { acc1 = max(acc1, x) }
//                                                        acc3 = 0;    for i4 { acc3 = acc3 + exp(x - acc1) }
//                                                        for i5 { y[i0, i5] = exp(x - acc1) / acc3 } }
//
// k = 0 (no shared loops, full-size temporaries) is always legal and is the fallback.
#include "codegen/kernel_lower.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "codegen/kernel_graph.h"
#include "meshfuse/ir/fusion.h"
#include "lower/segment.h"

namespace meshfuse::kir {
namespace {

struct Storage {
  enum Kind { None, Buffer, Let, Accumulator } kind = None;
  int64_t id = -1;          // buffer or scalar
  bool inner_only = false;  // a temporary holding one outer iteration (dims >= k)
};

struct Illegal {};  // the outer depth being tried cannot schedule this graph

class LoopBuilder {
 public:
  LoopBuilder(const ElementGraph& g, Program& p, int64_t k, std::vector<int64_t> anchor)
      : g_(g), p_(p), k_(k), anchor_(std::move(anchor)) {}

  std::vector<Stmt> build(const std::vector<ENode*>& stages) {
    std::vector<Stmt> root;
    bodies_ = {&root};
    memos_.resize(1);
    for (int64_t d = 0; d < k_; ++d) outer_.push_back(openLoop(anchor_[d]));
    for (ENode* s : stages) assignStorage(s);
    for (ENode* s : stages) {
      if (s->kind == ENode::Reduce) {
        emitReduce(s);
      } else if (s->kind == ENode::Scatter) {
        emitScatter(s);
      } else if (s->kind == ENode::Cat) {
        emitCat(s);
      } else {
        emitElementwise(s);
      }
      stored_.push_back(s);
    }
    for (int64_t d = 0; d < k_; ++d) closeLoop();
    return root;
  }

 private:
  // ---- loops and scopes ------------------------------------------------------------------------
  Expr openLoop(int64_t extent) {
    int64_t v = p_.addScalar(Scalar::Loop, Type::I64);
    Stmt s{Stmt::For, v, extent};
    cur().push_back(std::move(s));
    bodies_.push_back(&cur().back().body);
    memos_.emplace_back();
    return var(v, Type::I64);
  }
  void closeLoop() {
    bodies_.pop_back();
    memos_.pop_back();
  }
  std::vector<Stmt>& cur() { return *bodies_.back(); }

  // Loops over dims [k, rank) of `shape`; returns the full index (outer variables first).
  std::vector<Expr> openInner(const std::vector<int64_t>& shape) {
    std::vector<Expr> idx(outer_.begin(), outer_.end());
    for (size_t d = static_cast<size_t>(k_); d < shape.size(); ++d) idx.push_back(openLoop(shape[d]));
    return idx;
  }
  void closeInner(const std::vector<int64_t>& shape) {
    for (size_t d = static_cast<size_t>(k_); d < shape.size(); ++d) closeLoop();
  }

  void requireOuter(const std::vector<int64_t>& domain) const {
    if (static_cast<int64_t>(domain.size()) < k_) throw Illegal{};
    for (int64_t d = 0; d < k_; ++d)
      if (domain[d] != anchor_[d]) throw Illegal{};
  }

  // ---- storage ----------------------------------------------------------------------------------
  void assignStorage(ENode* n) {
    Storage& s = storage_[n];
    auto out = std::find(g_.outputs.begin(), g_.outputs.end(), n);
    if (out != g_.outputs.end()) {
      s = {Storage::Buffer, firstOutputBuffer() + (out - g_.outputs.begin()), false};
      return;
    }
    if (static_cast<int64_t>(n->shape.size()) < k_) throw Illegal{};  // not inside the shared loops
    if (static_cast<int64_t>(n->shape.size()) == k_) {
      s = {n->kind == ENode::Reduce ? Storage::Accumulator : Storage::Let,
           p_.addScalar(n->kind == ENode::Reduce ? Scalar::Accumulator : Scalar::Let, n->type), false};
      return;
    }
    std::vector<int64_t> inner(n->shape.begin() + k_, n->shape.end());
    s = {Storage::Buffer, p_.addBuffer({Buffer::Temp, n->dtype, inner, ""}), k_ > 0};
  }
  int64_t firstOutputBuffer() const {
    for (size_t i = 0; i < p_.buffers.size(); ++i)
      if (p_.buffers[i].role == Buffer::Output) return static_cast<int64_t>(i);
    MF_CHECK(false, "a kernel without outputs");
  }

  Expr flatIndex(const Storage& s, const ENode* n, const std::vector<Expr>& idx) const {
    if (!s.inner_only) return linearize(idx, n->shape);
    std::vector<Expr> inner(idx.begin() + k_, idx.end());
    return linearize(inner, std::vector<int64_t>(n->shape.begin() + k_, n->shape.end()));
  }

  // A stored value read at `idx`: legal only where this outer iteration wrote it.
  Expr loadStored(const ENode* n, const std::vector<Expr>& idx) {
    const Storage& s = storage_.at(n);
    for (int64_t d = 0; d < k_; ++d) {
      bool same = sameExpr(idx[d], outer_[d]) || (anchor_[d] == 1 && isConst(idx[d], 0));
      if (!same) throw Illegal{};
    }
    if (s.kind == Storage::Let || s.kind == Storage::Accumulator) return var(s.id, n->type);
    const Buffer& b = p_.buffers[s.id];
    return cast(load(s.id, valueTypeOf(b.dtype), flatIndex(s, n, idx)), n->type);
  }

  void store(const ENode* n, const std::vector<Expr>& idx, Expr v) {
    const Storage& s = storage_.at(n);
    v = cast(std::move(v), n->type);
    if (s.kind == Storage::Let) {
      cur().push_back({Stmt::Let, s.id, 0, std::move(v)});
      return;
    }
    MF_CHECK(s.kind == Storage::Buffer, "a store to an accumulator");
    const DataType dt = p_.buffers[s.id].dtype;
    if (v->op == Op::Round && v->round_to == dt) v = v->args[0];  // the store rounds the same way
    Stmt st{Stmt::Store, s.id, 0, cast(std::move(v), valueTypeOf(dt))};
    st.index = flatIndex(s, n, idx);
    cur().push_back(std::move(st));
  }

  // ---- values -----------------------------------------------------------------------------------
  static std::vector<Expr> broadcastIndex(const std::vector<Expr>& idx, const ENode* operand) {
    if (operand->shape.empty()) return {};
    MF_CHECK(operand->shape.size() == idx.size(), "elementwise operand of rank {} at an index of rank {}",
             operand->shape.size(), idx.size());
    std::vector<Expr> out;
    for (size_t d = 0; d < idx.size(); ++d) out.push_back(operand->shape[d] == 1 ? index(0) : idx[d]);
    return out;
  }

  Expr value(const ENode* n, const std::vector<Expr>& idx) {
    if (n->kind == ENode::Input) {
      const Buffer& b = p_.buffers[n->buffer];
      return cast(load(n->buffer, valueTypeOf(b.dtype), linearize(idx, n->shape)), n->type);
    }
    if (std::find(stored_.begin(), stored_.end(), n) != stored_.end()) return loadStored(n, idx);
    for (auto m = memos_.rbegin(); m != memos_.rend(); ++m)
      for (const Memo& e : *m)
        if (e.node == n && std::equal(e.idx.begin(), e.idx.end(), idx.begin(), idx.end(), sameExpr)) return e.value;
    Expr v = compute(n, idx);
    if (n->kind == ENode::Map && n->uses > 1 && v->op != Op::Const && v->op != Op::Var) {
      int64_t id = p_.addScalar(Scalar::Let, v->type);
      cur().push_back({Stmt::Let, id, 0, v});
      v = var(id, v->type);
    }
    memos_.back().push_back({n, idx, v});
    return v;
  }

  // The definition of `n` evaluated at `idx` (never a load of n itself).
  Expr compute(const ENode* n, const std::vector<Expr>& idx) {
    switch (n->kind) {
      case ENode::Map: {
        std::vector<Expr> args;
        for (const ENode* o : n->operands) args.push_back(value(o, broadcastIndex(idx, o)));
        return cast(n->indexed_formula ? n->indexed_formula(args, idx) : n->formula(args), n->type);
      }
      case ENode::Index: return value(n->operands[0], n->index_map(idx));
      case ENode::Gather: {
        const ENode* indices = n->operands[1];
        const TableRow row = tableRow(n, indices, idx);
        std::vector<Expr> ti;
        if (n->grouped) ti.push_back(idx[0]);
        ti.push_back(row.safe);
        ti.push_back(idx.back());
        return select(row.ok, cast(value(n->operands[0], ti), n->type), constant(0, n->type));
      }
      case ENode::Input:
      case ENode::Reduce:
      case ENode::Scatter:
      case ENode::Cat: break;
    }
    MF_CHECK(false, "a stored value is read before its stage");
  }

  // ---- stages -----------------------------------------------------------------------------------
  void emitElementwise(ENode* n) {
    requireOuter(n->shape);
    std::vector<Expr> idx = openInner(n->shape);
    store(n, idx, compute(n, idx));
    closeInner(n->shape);
  }

  void emitReduce(ENode* r) {
    const ENode* x = r->operands[0];
    requireOuter(x->shape);
    for (int64_t d : r->dims)
      if (d < k_) throw Illegal{};
    const Storage& s = storage_.at(r);
    const Type t = r->type;
    // i64 partial sums live in an i64 temporary: its init stands in for -inf.
    const double lowest = t == Type::F32 ? -INFINITY : -9.2233720368547758e18;
    Expr init = constant(r->is_max ? lowest : 0.0, t);
    auto combine = [&](Expr acc, Expr v) {
      return r->is_max ? binary(Op::Max, std::move(acc), std::move(v)) : add(std::move(acc), std::move(v));
    };
    auto reducedIndex = [&](const std::vector<Expr>& xi) {
      std::vector<Expr> ri;
      for (int64_t d = 0; d < static_cast<int64_t>(xi.size()); ++d)
        if (!std::binary_search(r->dims.begin(), r->dims.end(), d)) ri.push_back(xi[d]);
      return ri;
    };
    if (s.kind == Storage::Accumulator) {
      cur().push_back({Stmt::Assign, s.id, 0, init});
      std::vector<Expr> xi = openInner(x->shape);
      cur().push_back({Stmt::Assign, s.id, 0, combine(var(s.id, t), cast(value(x, xi), t))});
      closeInner(x->shape);
      return;
    }
    std::vector<Expr> ri = openInner(r->shape);
    store(r, ri, init);
    closeInner(r->shape);
    stored_.push_back(r);  // the accumulation reads the partial results back
    std::vector<Expr> xi = openInner(x->shape);
    Expr v = cast(value(x, xi), t);
    store(r, reducedIndex(xi), combine(loadStored(r, reducedIndex(xi)), v));
    closeInner(x->shape);
    stored_.pop_back();
  }

  // The table row indices[idx...] names (idx: an index of a Gather's result or a Scatter's
  // values, whose leading dims are the indices' dims), whether it is inside the table, and the row
  // to read or write (0 when it is not).
  struct TableRow {
    Expr ok, safe;
  };
  TableRow tableRow(const ENode* n, const ENode* indices, const std::vector<Expr>& idx) {
    std::vector<Expr> ii(idx.begin(), idx.begin() + static_cast<int64_t>(indices->shape.size()));
    Expr row = cast(value(indices, ii), Type::I64);
    Expr ok = select(binary(Op::Ge, row, index(0)), binary(Op::Lt, row, index(n->rows)), constant(0, Type::Bool));
    return {ok, select(ok, row, index(0))};
  }

  // y = 0, then y[row, h] += x[i..., h] for every element of x: rows are data, so the stage shares
  // no outer loops. A value whose index is outside the table adds 0 to row 0.
  void emitScatter(ENode* n) {
    if (k_ > 0) throw Illegal{};
    const ENode* x = n->operands[0];
    std::vector<Expr> oi = openInner(n->shape);
    store(n, oi, constant(0, Type::F32));
    closeInner(n->shape);
    stored_.push_back(n);  // the accumulation reads the partial sums back
    std::vector<Expr> xi = openInner(x->shape);
    const TableRow row = tableRow(n, n->operands[1], xi);
    std::vector<Expr> at;
    if (n->grouped) at.push_back(xi[0]);
    at.push_back(row.safe);
    at.push_back(xi.back());
    Expr v = select(row.ok, cast(value(x, xi), Type::F32), constant(0, Type::F32));
    store(n, at, add(loadStored(n, at), v));
    closeInner(x->shape);
    stored_.pop_back();
  }

  void emitCat(ENode* n) {
    requireOuter(n->shape);
    if (n->dim < k_) throw Illegal{};
    int64_t base = 0;
    for (const ENode* o : n->operands) {
      std::vector<Expr> idx = openInner(o->shape);
      std::vector<Expr> out = idx;
      out[n->dim] = add(idx[n->dim], index(base));
      store(n, out, value(o, idx));
      closeInner(o->shape);
      base += o->shape[n->dim];
    }
  }

  struct Memo {
    const ENode* node;
    std::vector<Expr> idx;
    Expr value;
  };

  const ElementGraph& g_;
  Program& p_;
  const int64_t k_;
  const std::vector<int64_t> anchor_;
  std::vector<Expr> outer_;
  std::vector<std::vector<Stmt>*> bodies_;
  std::vector<std::vector<Memo>> memos_;
  std::map<const ENode*, Storage> storage_;
  std::vector<const ENode*> stored_;
};

}  // namespace

void lowerKernelSegment(const Segment& seg, const LocalShapeFn& shape_of, Program& program) {
  ElementGraph g = buildElementGraph(seg, shape_of, program);
  std::vector<ENode*> stages;
  for (const auto& n : g.nodes)
    if (n->kind == ENode::Reduce || n->kind == ENode::Cat || n->kind == ENode::Scatter ||
        std::find(g.outputs.begin(), g.outputs.end(), n.get()) != g.outputs.end())
      stages.push_back(n.get());
  // The anchor: the largest iteration domain of a stage (a reduction or scatter iterates its
  // operand).
  std::vector<int64_t> anchor;
  for (const ENode* s : stages) {
    const bool over_operand = s->kind == ENode::Reduce || s->kind == ENode::Scatter;
    const std::vector<int64_t>& domain = over_operand ? s->operands[0]->shape : s->shape;
    if (anchor.empty() || numel(domain) > numel(anchor)) anchor = domain;
  }
  const size_t buffers = program.buffers.size(), scalars = program.scalars.size();
  for (int64_t k = std::max<int64_t>(0, static_cast<int64_t>(anchor.size()) - 1); k >= 0; --k) {
    program.buffers.resize(buffers, Buffer{Buffer::Temp, DataType::Float, {}, ""});
    program.scalars.resize(scalars, Scalar{Scalar::Let, Type::F32});
    try {
      std::vector<Stmt> body = LoopBuilder(g, program, k, anchor).build(stages);
      program.steps.push_back({Step::Loops, {"k0", std::move(body)}, {}});
      return;
    } catch (const Illegal&) {
      continue;  // a shallower shared loop nest
    }
  }
  MF_CHECK(false, "no schedule for a kernel segment (k = 0 is always legal)");
}

Program lowerSegment(const Fusion& fusion, const Segment& seg, const LocalShapeFn& shape_of, const std::string& name) {
  MF_CHECK(seg.kind != Segment::Kind::Communication, "a communication segment has no kernel");
  Program p;
  p.name = name;
  for (const TensorView* in : seg.inputs)
    p.addBuffer({Buffer::Input, in->dtype(), shape_of(in), fusion.displayName(in)});
  for (const TensorView* out : seg.outputs) {
    p.addBuffer({Buffer::Output, out->dtype(), shape_of(out), fusion.displayName(out)});
    auto in = std::find(seg.inputs.begin(), seg.inputs.end(), fusion.aliasedInput(out));
    if (in != seg.inputs.end()) p.buffers[in - seg.inputs.begin()].may_alias = p.buffers.back().may_alias = true;
  }
  if (seg.kind == Segment::Kind::Gemm) {
    lowerGemmSegment(seg, shape_of, p);
  } else {
    lowerKernelSegment(seg, shape_of, p);
  }
  return p;
}

}  // namespace meshfuse::kir
