// The CUDA kernel writer (contract in kernel_writer.h): a kernel's frame, declarations and
// accumulations, columns mode, statements run serially and the vectorized pointwise body.
// Expressions are written in kernel_writer_expr.cpp, block mode in kernel_writer_block.cpp.
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

}  // namespace meshfuse::cuda
