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

#include "codegen/cuda/cuda_attention.h"
#include "codegen/cuda/kernel_plan.h"
#include "codegen/cuda/kernel_writer.h"
#include "codegen/cuda/runtime_kernels.h"
#include "meshfuse/error.h"

namespace meshfuse::cuda {

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
                                     const std::vector<Stmt>& kernel_root,
                                     const std::map<int64_t, int>& kernels_using) {
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

// The kernels of every Loops step (kernelRoots), and how many kernels of the whole program touch
// each buffer (private temporaries: exactly one), GEMM and attention calls counting as users of
// their operands.
struct ProgramKernels {
  std::vector<std::vector<std::vector<Stmt>>> roots;  // per step
  std::map<int64_t, int> kernels_using;               // per buffer
};
ProgramKernels programKernels(const kir::Program& p) {
  ProgramKernels k;
  k.roots.resize(p.steps.size());
  for (size_t b = 0; b < p.buffers.size(); ++b) k.kernels_using[static_cast<int64_t>(b)] = 0;
  for (size_t i = 0; i < p.steps.size(); ++i) {
    const kir::Step& step = p.steps[i];
    if (step.kind == kir::Step::GemmCall) {
      for (int64_t b : {step.gemm.a.buffer, step.gemm.b.buffer, step.gemm.c.buffer}) k.kernels_using[b] += 1;
      continue;
    }
    if (step.kind == kir::Step::AttentionCall) {
      const kir::Attention& a = step.attention;
      for (int64_t b : {a.q, a.k, a.v, a.o, a.lse, a.g, a.lse_in, a.delta, a.dv_out, a.o_rounded, a.dv_rounded})
        if (b >= 0) k.kernels_using[b] += 1;
      continue;
    }
    k.roots[i] = kernelRoots(step.loops.body);
    for (const std::vector<Stmt>& r : k.roots[i])
      for (int64_t b : usesOf(r).buffers) k.kernels_using[b] += 1;
  }
  return k;
}

// The mapping of a nest (cuda_emitter.h): a thread per outer iteration for pointwise bodies and
// little inner work over many iterations, else a block per iteration; serial loops around the
// body (an accumulation over outer dims) are never a block per iteration (its threads would wait
// on one serial loop): columns when they are one accumulation nest, else a thread per iteration.
Mode chooseMode(const Nest& nest, const std::set<int64_t>& priv, int sm_count) {
  const int64_t total = nest.total(), work = innerWork(nest.body());
  if (!nest.owned.empty()) {
    std::optional<Accumulation> a = nest.owned.size() == 1 ? accumulationOf(nest.owned.front()) : std::nullopt;
    return priv.empty() && a && a->store->kind == Stmt::Store ? Mode::Columns : Mode::Thread;
  }
  return work == 0 || (work <= 32 && total >= int64_t{sm_count} * 4 * kThreads) ? Mode::Thread : Mode::Block;
}

// A one-block kernel whose first loop is a long accumulation (a full reduction): that loop runs
// first on a grid, whose partial results the kernel combines (GridSplit). Empty `split` when the
// kernel does not qualify.
struct SplitPlan {
  GridSplit split;
  std::optional<Accumulation> acc;
  std::vector<Stmt> prefix;  // the statements before the loop that it may read
};
SplitPlan planGridSplit(const Nest& nest, int sm_count) {
  SplitPlan s;
  const Stmt* first = nullptr;
  for (const Stmt& st : nest.body()) {
    if (st.kind == Stmt::For) {
      first = &st;
      break;
    }
    if (st.kind != Stmt::Store) s.prefix.push_back(st);
  }
  s.acc = first ? accumulationOf(*first) : std::nullopt;
  if (!s.acc) return s;
  if (s.acc->store->kind == Stmt::Assign && std::none_of(s.prefix.begin(), s.prefix.end(), [&](const Stmt& st) {
        return st.kind == Stmt::Assign && st.id == s.acc->store->id;
      })) {
    s.acc.reset();  // an accumulator the loop does not continue
    return s;
  }
  // The grid cannot see what the kernel stores before the loop.
  const std::set<int64_t> stored = usesOf(nest.body()).stored;
  std::set<int64_t> read;
  exprUses(s.acc->value, nullptr, &read);
  for (const Stmt* let : s.acc->lets) exprUses(let->value, nullptr, &read);
  for (int64_t b : read)
    if (stored.count(b) > 0) return s;
  constexpr int64_t kPerThread = 8;  // iterations per thread before another block pays off
  if (s.acc->trips() < 2 * kThreads * kPerThread) return s;
  s.split.loop = first;
  s.split.blocks =
      std::min<int64_t>((s.acc->trips() + kThreads * kPerThread - 1) / (kThreads * kPerThread), int64_t{sm_count} * 4);
  return s;
}

// Parallel workers of a kernel (threads in thread mode, blocks otherwise): enough for the
// iterations, a few per SM at most, fewer when each needs a large private copy of temporaries.
int64_t workersFor(const kir::Program& p, Mode mode, int64_t total, int64_t groups, const std::set<int64_t>& priv,
                   int sm_count) {
  int64_t workers = mode == Mode::Thread
                        ? std::min<int64_t>((groups + kThreads - 1) / kThreads, int64_t{sm_count} * 32) * kThreads
                    : mode == Mode::Columns ? std::min<int64_t>((total + 31) / 32, int64_t{sm_count} * 16)
                                            : std::min<int64_t>(total, int64_t{sm_count} * 16);
  int64_t private_bytes = 0;
  for (int64_t b : priv) private_bytes += p.buffers[b].numel() * dtypeSize(p.buffers[b].dtype);
  if (private_bytes > 0) workers = std::max<int64_t>(1, std::min(workers, kPrivateBytesCap / private_bytes));
  if (mode == Mode::Thread) workers = std::max<int64_t>(kThreads, workers / kThreads * kThreads);
  return std::max<int64_t>(workers, 1);
}

// Emits the kernels of one Loops step kernel root (k-th of step i) into `kernels`, their
// launches into `launches`.
void emitRoot(const kir::Program& p, const std::string& prefix, const std::string& bufs_type, int sm_count,
              const ProgramKernels& pk, size_t i, size_t k, EmittedProgram& out, std::vector<KernelLaunch>& launches,
              std::string& kernels) {
  const std::vector<Stmt>& root = pk.roots[i][k];
  std::vector<int64_t> loop_vars;
  for (const Stmt* l : perfectLoops(root)) loop_vars.push_back(l->id);
  const std::set<int64_t> priv = privateTemporaries(p, loop_vars, root, pk.kernels_using);
  const Nest nest = outerNest(root, priv);
  const int64_t total = nest.total();
  const Mode mode = chooseMode(nest, priv, sm_count);
  const VectorPlan vectors = mode == Mode::Thread && priv.empty() ? planVectors(p, nest) : VectorPlan{};
  SplitPlan sp = mode == Mode::Block && nest.vars.empty() ? planGridSplit(nest, sm_count) : SplitPlan{};
  if (sp.split.loop != nullptr) {
    sp.split.partials = static_cast<int64_t>(p.buffers.size() + out.extra_bytes.size());
    out.extra_bytes.push_back(sp.split.blocks * (sp.acc->type == Type::F32 ? 4 : 8));
    KernelLaunch pl{fmt::format("{}_s{}_k{}p", prefix, i, k), sp.split.blocks, kThreads};
    kernels += fmt::format("// step {} ({}), kernel {}: its full reduction's {} iterations on {} blocks\n", i,
                           p.steps[i].loops.name, k, sp.acc->trips(), sp.split.blocks);
    kernels +=
        KernelWriter(p, bufs_type, nest, mode, priv, VectorPlan{}, sp.split).writePartials(pl.name, *sp.acc, sp.prefix);
    launches.push_back(pl);
  }
  KernelLaunch l;
  l.name = fmt::format("{}_s{}_k{}", prefix, i, k);
  const int64_t workers = workersFor(p, mode, total, total / vectors.width, priv, sm_count);
  l.blocks = mode == Mode::Thread ? workers / kThreads : workers;
  for (int64_t b : priv) out.copies[b] = mode == Mode::Thread ? l.blocks * kThreads : l.blocks;
  const char* mode_name = mode == Mode::Thread ? "thread" : mode == Mode::Block ? "block" : "columns";
  kernels +=
      fmt::format("// step {} ({}), kernel {}: {} mode over {} outer iteration(s){}{}\n", i, p.steps[i].loops.name, k,
                  mode_name, total, vectors.width > 1 ? fmt::format(", {} per thread (vectorized)", vectors.width) : "",
                  sp.split.loop ? ", combining the partial results" : "");
  kernels += KernelWriter(p, bufs_type, nest, mode, priv, vectors, sp.split).write(l.name);
  launches.push_back(l);
}

}  // namespace

EmittedProgram emitCuda(const kir::Program& p, const std::string& prefix, int sm_count, int arch) {
  EmittedProgram out;
  out.copies.assign(p.buffers.size(), 1);
  const std::string bufs_type = fmt::format("MfBufs_{}", prefix);
  std::string kernels;
  const ProgramKernels pk = programKernels(p);
  for (size_t i = 0; i < p.steps.size(); ++i) {
    out.steps.emplace_back();
    if (p.steps[i].kind == kir::Step::AttentionCall) {  // its own kernel (cuda_attention.h)
      KernelLaunch l;
      l.name = fmt::format("{}_s{}_attention", prefix, i);
      kernels += emitAttentionKernel(p.steps[i].attention, p.buffers, bufs_type, l, arch);
      out.steps.back().push_back(l);
      continue;
    }
    for (size_t k = 0; k < pk.roots[i].size(); ++k)
      emitRoot(p, prefix, bufs_type, sm_count, pk, i, k, out, out.steps.back(), kernels);
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
