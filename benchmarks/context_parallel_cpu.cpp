// Context parallelism on CPU ranks (issue 17): attention over [1, heads, seq, head_dim] f32 with
// q, k and v split along the sequence and the output wanted split the same way (the next layer's
// sequence parallelism), run three ways in the same run --
//   ring      k and v rotate by send/recv, n - 1 steps per head group, merged by log-sum-exp
//             (--cp=ring; the default head groups: half a block in flight)
//   ring, whole blocks   the same rotating whole blocks (--ring_groups=1: one ring of all heads)
//   ulysses   all-to-all to a split of the heads and back (--cp=ulysses)
//   gather    k and v all-gathered, each rank attends its query rows (--cp=gather)
// -- against the whole attention on one rank (rank 0 alone, a single-rank executor). With
// --backward 1 the program is attention's backward instead (autodiff's backward fusion of the
// same attention: dq, dk and dv from the saved q, k, v, output and the output's gradient, all
// split along the sequence): ring attention's backward (7 (n - 1) send/recv), Ulysses, gathered.
//
// Rounds interleave the variants (each round starts from a different one) so that a slow phase
// of the machine hits them alike; times are the slowest rank's, the tables give medians over the
// rounds. "hidden" is the fraction of the communication time that overlapped compute in traced
// runs after a warm-up (the median over `rounds` runs: rank 0's, and the mean over ranks); "rotation hidden" counts the
// ring's k/v rotation alone, without causal balance's half exchanges before and after the ring,
// which nothing can hide (the same as "hidden" for the other variants, which have none).
//   mpirun -np 4 build/benchmarks/context_parallel_cpu [--seqs 4096,8192,16384] [--heads 8]
//                  [--head-dim 64] [--rounds 3] [--causal 1] [--backward 0]
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "meshfuse/autodiff.h"
#include "meshfuse/executor.h"
#include "meshfuse/ir/placement.h"
#include "meshfuse/ops.h"
#include "meshfuse/trace.h"
#include "runtime/backend.h"  // (complete type for the executor's nullptr backend argument)

using namespace meshfuse;

namespace {

struct Args {
  std::vector<int64_t> seqs = {4096, 8192, 16384};
  int64_t heads = 8, head_dim = 64;
  int rounds = 3;
  bool causal = true;
  bool backward = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--seqs") {
      a.seqs.clear();
      std::stringstream ss(v);
      for (std::string s; std::getline(ss, s, ',');) a.seqs.push_back(std::stoll(s));
    } else if (k == "--heads") {
      a.heads = std::stoll(v);
    } else if (k == "--head-dim") {
      a.head_dim = std::stoll(v);
    } else if (k == "--rounds") {
      a.rounds = std::stoi(v);
    } else if (k == "--causal") {
      a.causal = v != "0";
    } else if (k == "--backward") {
      a.backward = v != "0";
    } else {
      std::fprintf(stderr, "unknown option %s (options: --seqs --heads --head-dim --rounds --causal --backward)\n",
                   k.c_str());
      std::exit(2);
    }
  }
  return a;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

double worstOverRanks(double s) {
  double worst = 0;
  MPI_Allreduce(&s, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

// a = sdpa(q, k, v) over [1, heads, seq, head_dim]; with a mesh, q, k, v and a are Shard(2) on it.
// --backward: its backward fusion (inputs q, k, v, the saved output and the output's gradient,
// each [1, heads, seq, head_dim], placed like the forward's tensors; outputs dq, dk, dv).
std::unique_ptr<Fusion> attention(const Args& a, int64_t seq, const DeviceMesh* mesh) {
  auto f = std::make_unique<Fusion>();
  std::vector<TensorView*> in;
  for (const char* name : {"q", "k", "v"}) {
    in.push_back(f->defineTensor({1, a.heads, seq, a.head_dim}, DataType::Float, name));
    if (mesh != nullptr && a.backward) applyPlacements(in.back(), *mesh, {Placement::shard(2)});
  }
  TensorView* out = ops::sdpa(in[0], in[1], in[2], a.causal);
  f->rename(out, "a");
  f->addOutput(out);
  if (mesh != nullptr) applyPlacements(out, *mesh, {Placement::shard(2)});
  if (!a.backward) return f;
  return std::move(differentiate(*f, {0}, {0, 1, 2}).backward);
}

struct Variant {
  const char* name;
  ContextParallel cp;
  int64_t ring_groups;  // OverlapOptions::ring_groups
  std::unique_ptr<MultiDeviceExecutor> exec;
  std::vector<double> seconds;
};

}  // namespace

int main(int argc, char** argv) {
  initializeMpi();  // MPI_Init_thread: stream threads call MPI
  const Args args = parse(argc, argv);
  {
    std::unique_ptr<Communicator> comm = makeMpiCommunicator();
    std::unique_ptr<Communicator> self = makeSelfCommunicator();
    const int64_t n = comm->size(), me = comm->rank();
    std::vector<int64_t> ids(n);
    for (int64_t i = 0; i < n; ++i) ids[i] = i;
    const DeviceMesh mesh(ids), alone({0});
    if (me == 0) {
      std::printf(
          "# %s attention%s, batch 1, %lld heads, head size %lld, f32; %lld ranks, one compute thread each; "
          "%d rounds, variants interleaved\n",
          args.causal ? "causal" : "non-causal", args.backward ? "'s backward (dq, dk, dv)" : "",
          static_cast<long long>(args.heads), static_cast<long long>(args.head_dim), static_cast<long long>(n),
          args.rounds);
      std::printf(
          "| seq | variant | median ms | speed-up over 1 rank | communication ms, rank 0 | hidden, rank 0 | "
          "hidden, mean of ranks | rotation hidden, rank 0 | rotation hidden, mean of ranks |\n"
          "|---|---|---|---|---|---|---|---|---|\n");
    }
    for (int64_t seq : args.seqs) {
      const int64_t operands = args.backward ? 5 : 3;  // (backward: q, k, v, the saved output, its gradient)
      std::vector<ShardedTensor> in;
      for (int64_t i = 0; i < operands; ++i)
        in.push_back({Tensor::random(DataType::Float, {1, args.heads, seq / n, args.head_dim}, 10 * seq + i + me),
                      mesh,
                      {Placement::shard(2)}});
      std::vector<Variant> vs;
      vs.push_back({"ring", ContextParallel::Ring, 0, nullptr, {}});
      vs.push_back({"ring, whole blocks", ContextParallel::Ring, 1, nullptr, {}});
      vs.push_back({"ulysses", ContextParallel::Ulysses, 0, nullptr, {}});
      vs.push_back({"gather", ContextParallel::Gather, 0, nullptr, {}});
      for (Variant& v : vs) {
        ExecutorOptions o;
        o.pipeline.propagation.context_parallel = v.cp;
        o.pipeline.overlap.ring_groups = v.ring_groups;
        v.exec = std::make_unique<MultiDeviceExecutor>(attention(args, seq, &mesh), *comm, nullptr, o);
        v.exec->run(in);  // compile and warm up
      }
      // One rank alone: the whole sequence on rank 0.
      std::vector<ShardedTensor> whole;
      for (int64_t i = 0; i < operands; ++i)
        whole.push_back({Tensor::random(DataType::Float, {1, args.heads, seq, args.head_dim}, 7 * seq + i), alone,
                         {Placement::replicate()}});
      std::unique_ptr<MultiDeviceExecutor> single;
      if (me == 0) {
        single = std::make_unique<MultiDeviceExecutor>(attention(args, seq, nullptr), *self);
        single->run(whole);
      }
      std::vector<double> single_s;
      for (int r = 0; r < args.rounds; ++r) {
        for (size_t k = 0; k <= vs.size(); ++k) {
          const size_t v = (static_cast<size_t>(r) + k) % (vs.size() + 1);
          comm->barrier();
          auto start = std::chrono::steady_clock::now();
          if (v < vs.size()) {
            vs[v].exec->run(in);
          } else if (me == 0) {
            single->run(whole);
          }
          const double s = worstOverRanks(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
          (v < vs.size() ? vs[v].seconds : single_s).push_back(s);
        }
      }
      const double one = median(single_s);
      if (me == 0)
        std::printf("| %lld | one rank (whole sequence) | %.1f | 1.00 | | | | | |\n", static_cast<long long>(seq), 1e3 * one);
      for (Variant& v : vs) {
        ExecutorOptions o;
        o.pipeline.propagation.context_parallel = v.cp;
        o.pipeline.overlap.ring_groups = v.ring_groups;
        o.trace = true;
        MultiDeviceExecutor traced(attention(args, seq, &mesh), *comm, nullptr, o);
        traced.run(in);  // warm-up
        // The fractions of one traced run vary with the scheduler: medians over `rounds` runs.
        std::vector<double> all, rotating, comm_ms;
        for (int r = 0; r < args.rounds; ++r) {
          comm->barrier();
          traced.run(in);
          const OverlapSummary s = summarizeOverlap(traced.lastTrace());
          const OverlapSummary rotation =
              summarizeOverlap(traced.lastTrace(), [](const TraceEvent& e) { return !isCausalBalanceExchange(e); });
          all.push_back(s.hiddenFraction());
          rotating.push_back(rotation.hiddenFraction());
          comm_ms.push_back(s.communication_us / 1e3);
        }
        double fractions[2] = {median(all), median(rotating)}, sums[2] = {0, 0};
        MPI_Allreduce(fractions, sums, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        if (me == 0)
          std::printf("| %lld | %s | %.1f | %.2f | %.1f | %.0f%% | %.0f%% | %.0f%% | %.0f%% |\n",
                      static_cast<long long>(seq), v.name, 1e3 * median(v.seconds), one / median(v.seconds),
                      median(comm_ms), 100 * fractions[0], 100 * sums[0] / static_cast<double>(n),
                      100 * fractions[1], 100 * sums[1] / static_cast<double>(n));
      }
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
