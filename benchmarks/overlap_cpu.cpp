// Communication/compute overlap on CPU ranks: the sequence-parallel MLP (allgather + GEMM,
// GEMM + reduce-scatter) undecomposed vs collective- and ring-based overlap, in the same run.
// Reports each variant's time as a ratio to the undecomposed program and, from a traced run,
// the fraction of communication time hidden behind compute.
//   mpirun -np 2 build/benchmarks/overlap_cpu [--tokens T] [--hidden H] [--iters N]
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "meshfuse/executor.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/runtime/host_ir_evaluator.h"
#include "models.h"

using namespace meshfuse;

namespace {

struct Variant {
  std::string name, algorithm;
  int64_t chunks;
};

double medianSeconds(Communicator& comm, MultiDeviceExecutor& exec, const std::vector<ShardedTensor>& in, int iters) {
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    comm.barrier();
    auto start = std::chrono::steady_clock::now();
    exec.run(in);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), worst = 0;
    MPI_Allreduce(&s, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    t.push_back(worst);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
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
    std::vector<Variant> variants = {{"undecomposed", "none", 0},     {"collective, 2 chunks", "collective", 2},
                                     {"collective, 4 chunks", "collective", 4}, {"ring, n chunks", "ring", n},
                                     {"ring, 2n chunks", "ring", 2 * n}};
    if (me == 0) {
      std::printf("# sequence-parallel MLP, t = %lld, h = %lld, f32, %lld ranks, one compute thread per rank\n",
                  static_cast<long long>(tokens), static_cast<long long>(hidden), static_cast<long long>(n));
      std::printf("| variant | median ms | time / undecomposed | communication hidden (rank 0) |\n|---|---|---|---|\n");
    }
    double base = 0;
    for (const Variant& v : variants) {
      ExecutorOptions o;
      o.pipeline.overlap.algorithm = v.algorithm;
      o.pipeline.overlap.chunks = v.chunks;
      MultiDeviceExecutor exec(cloneFusion(def), *comm, nullptr, o);
      exec.run(in);  // compile and warm up
      double t = medianSeconds(*comm, exec, in, iters);
      if (v.algorithm == "none") base = t;
      o.trace = true;
      MultiDeviceExecutor traced(cloneFusion(def), *comm, nullptr, o);
      traced.run(in);
      traced.run(in);
      OverlapSummary s = summarizeOverlap(traced.lastTrace());
      if (me == 0)
        std::printf("| %s | %.2f | %.3f | %.0f%% of %.2f ms |\n", v.name.c_str(), 1e3 * t, t / base,
                    100 * s.hiddenFraction(), s.communication_us / 1e3);
    }
  }
  MPI_Finalize();
  return 0;
}
