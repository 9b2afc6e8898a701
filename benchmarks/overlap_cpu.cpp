// Communication/compute overlap on CPU ranks: the sequence-parallel MLP (allgather + GEMM,
// GEMM + reduce-scatter) undecomposed vs collective- and ring-based overlap, in the same run.
//
// The variants run interleaved, round-robin (each round runs every variant once, starting from a
// different one), so that a slow phase of a shared machine hits them all alike; each round's time
// of a variant is divided by the same round's undecomposed time, and the table reports medians
// over the rounds. The fraction of communication hidden behind compute comes from traced runs
// after a warm-up (rank 0's timeline, and the mean over ranks).
//   mpirun -np 2 build/benchmarks/overlap_cpu [--tokens T] [--hidden H] [--iters N]
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "meshfuse/executor.h"
#include "meshfuse/ir/parser.h"
#include "runtime/host_ir_evaluator.h"
#include "models.h"

using namespace meshfuse;

namespace {

struct Variant {
  std::string name, algorithm;
  int64_t chunks;
  std::unique_ptr<MultiDeviceExecutor> exec;
  std::vector<double> seconds, ratio;  // per round; ratio: / the round's undecomposed time
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}
double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

// One run of `exec`, timed as the slowest rank's time (the ranks start together).
double timedRun(Communicator& comm, MultiDeviceExecutor& exec, const std::vector<ShardedTensor>& in) {
  comm.barrier();
  auto start = std::chrono::steady_clock::now();
  exec.run(in);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), worst = 0;
  MPI_Allreduce(&s, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  initializeMpi();  // MPI_Init_thread: stream threads call MPI
  int64_t tokens = 2048, hidden = 512;
  int iters = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--tokens") tokens = std::stoll(argv[i + 1]);
    if (a == "--hidden") hidden = std::stoll(argv[i + 1]);
    if (a == "--iters") iters = std::stoi(argv[i + 1]);
  }
  {
    std::unique_ptr<Communicator> comm = makeMpiCommunicator();
    const int64_t n = comm->size(), me = comm->rank();
    std::vector<int64_t> ids(n);
    for (int64_t i = 0; i < n; ++i) ids[i] = i;
    DeviceMesh mesh(ids);
    Fusion def;
    models::buildMlp(def, hidden);
    std::vector<ShardedTensor> in = {
        {Tensor::random(DataType::Float, {tokens / n, hidden}, 1), mesh, {Placement::shard(0)}},
        {Tensor::random(DataType::Float, {4 * hidden / n, hidden}, 2), mesh, {Placement::shard(0)}},
        {Tensor::random(DataType::Float, {hidden, 4 * hidden / n}, 3), mesh, {Placement::shard(1)}}};
    std::vector<Variant> variants(5);
    const std::vector<std::tuple<std::string, std::string, int64_t>> kinds = {{"undecomposed", "none", 0},
                                                                              {"collective, 2 chunks", "collective", 2},
                                                                              {"collective, 4 chunks", "collective", 4},
                                                                              {"ring, n chunks", "ring", n},
                                                                              {"ring, 2n chunks", "ring", 2 * n}};
    for (size_t v = 0; v < kinds.size(); ++v)
      std::tie(variants[v].name, variants[v].algorithm, variants[v].chunks) = kinds[v];
    for (Variant& v : variants) {
      ExecutorOptions o;
      o.pipeline.overlap.algorithm = parseOverlapAlgorithm(v.algorithm);
      o.pipeline.overlap.chunks = v.chunks;
      v.exec = std::make_unique<MultiDeviceExecutor>(def.clone(), *comm, nullptr, o);
      v.exec->run(in);  // compile and warm up
      v.exec->run(in);
    }
    // Round r runs the variants starting from variant r % V.
    const size_t nv = variants.size();
    for (int r = 0; r < iters; ++r) {
      std::vector<double> round(nv);
      for (size_t k = 0; k < nv; ++k) {
        const size_t v = (static_cast<size_t>(r) + k) % nv;
        round[v] = timedRun(*comm, *variants[v].exec, in);
      }
      for (size_t v = 0; v < nv; ++v) {
        variants[v].seconds.push_back(round[v]);
        variants[v].ratio.push_back(round[v] / round[0]);
      }
    }
    if (me == 0) {
      std::printf(
          "# sequence-parallel MLP, t = %lld, h = %lld, f32, %lld ranks, one compute thread per rank; %d rounds, "
          "variants interleaved\n",
          static_cast<long long>(tokens), static_cast<long long>(hidden), static_cast<long long>(n), iters);
      std::printf(
          "| variant | median ms | time / undecomposed: median (25%%-75%%) of rounds | communication hidden, rank 0 | "
          "hidden, mean of ranks |\n|---|---|---|---|---|\n");
    }
    for (Variant& v : variants) {
      // The hidden fraction of a traced run of the same program, after a warm-up.
      ExecutorOptions o;
      o.pipeline.overlap.algorithm = parseOverlapAlgorithm(v.algorithm);
      o.pipeline.overlap.chunks = v.chunks;
      o.trace = true;
      MultiDeviceExecutor traced(def.clone(), *comm, nullptr, o);
      traced.run(in);
      traced.run(in);
      OverlapSummary s = summarizeOverlap(traced.lastTrace());
      double fraction = s.hiddenFraction(), sum = 0;
      MPI_Allreduce(&fraction, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      if (me == 0)
        std::printf("| %s | %.2f | %.3f (%.3f-%.3f) | %.0f%% of %.2f ms | %.0f%% |\n", v.name.c_str(),
                    1e3 * median(v.seconds), median(v.ratio), quantile(v.ratio, 0.25), quantile(v.ratio, 0.75),
                    100 * fraction, s.communication_us / 1e3, 100 * sum / static_cast<double>(n));
    }
  }
  MPI_Finalize();
  return 0;
}
