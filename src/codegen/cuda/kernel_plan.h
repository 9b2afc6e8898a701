// What the CUDA emitter knows about a kernel IR loop nest before writing it (cuda_emitter.h
// describes the mappings): uses and definitions, the outer parallel nest, accumulations the
// threads or the grid may split, vectorizable pointwise nests. Shared by the kernel writer
// (kernel_writer.h) and emitCuda's choice of mode and grid. Internal to src/codegen/cuda.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "codegen/kernel_ir.h"

namespace meshfuse::cuda {

// The kernel IR's names, unqualified in the emitter's files.
using kir::Expr;
using kir::Op;
using kir::Stmt;
using kir::Type;

inline constexpr int kThreads = 256;                            // per block
inline constexpr int64_t kPrivateBytesCap = int64_t{64} << 20;  // private temporaries, all workers together

const char* ctype(Type t);

const char* storageType(DataType dt);

bool isFloat(Type t);

// Exact literals: hexadecimal floats, named infinities and NaN.
std::string literal(double v, Type t);

// Scalars and buffers an expression tree reads.
void exprUses(const Expr& e, std::set<int64_t>* scalars, std::set<int64_t>* buffers);

// Calls f on every statement of `body`, depth first.
void walk(const std::vector<Stmt>& body, const std::function<void(const Stmt&)>& f);

// Scalars and buffers a statement list reads or writes (its own loop variables included).
struct Uses {
  std::set<int64_t> scalars, buffers, stored, assigned;
};

Uses usesOf(const std::vector<Stmt>& body);

// Scalars a statement list defines (loop variables, lets, accumulators it assigns).
std::set<int64_t> definedIn(const std::vector<Stmt>& body);

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
  std::vector<int64_t> vars, extents;        // the parallel loops, outermost first
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
void positionalVars(const Expr& e, std::set<int64_t>* vars);

bool involvesAll(const Expr& index, const std::vector<int64_t>& vars);

// The loops of the outer perfect nest, outermost first.
std::vector<const Stmt*> perfectLoops(const std::vector<Stmt>& root);

// `row_local`: temporaries each parallel worker gets a copy of; they carry no dependence.
Nest outerNest(const std::vector<Stmt>& root, const std::set<int64_t>& row_local);

// Iterations of the loops inside a body (an estimate of a row's work).
int64_t innerWork(const std::vector<Stmt>& body);

// Thread: one thread per outer iteration. Block: one block per outer iteration. Columns: a nest
// whose outer loops are an accumulation over inner serial loops (a reduction over a dim that is
// not innermost: `for r { for i { y[i] = y[i] + x[r, i] } }`): a block takes 32 consecutive
// outer iterations (one per lane: coalesced), its 8 warps split the serial loops, and a
// shared-memory pass combines their partial results.
enum class Mode { Thread, Block, Columns };

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
  Type type = Type::F32;  // of the combined values
  int64_t trips() const {
    int64_t t = 1;
    for (const Stmt* l : loops) t *= l->extent;
    return t;
  }
};

std::optional<Accumulation> accumulationOf(const Stmt& loop);

// A full reduction split over the whole GPU: the accumulation `loop` of a one-block kernel runs
// first as a grid of `blocks` blocks that each write a partial result to extra buffer `partials`;
// the kernel then combines the partials where the loop was.
struct GridSplit {
  const Stmt* loop = nullptr;
  int64_t partials = -1;
  int64_t blocks = 0;
};

struct VectorPlan {
  int width = 1;                        // elements per thread; 1: not vectorized
  std::vector<const kir::Node*> loads;  // loads with unit stride, in first-use order
  std::vector<const Stmt*> stores;      // every store (all have unit stride)
};

VectorPlan planVectors(const kir::Program& p, const Nest& nest);

// The unsigned type of a `bytes`-wide access.
const char* vectorType(int64_t bytes);

// A reduction the emitter recognized: accumulator `acc = op(acc, x)` over a parallel loop.
struct Reduction {
  int64_t acc;
  Op op;
};

}  // namespace meshfuse::cuda
