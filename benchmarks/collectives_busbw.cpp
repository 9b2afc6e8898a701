// MPI collective bandwidth through meshfuse's Communicator, as nccl-tests reports it, next to
// single-core memcpy bandwidth measured in the same run:
//   algbw = bytes / time
//   busbw = algbw * 2(n-1)/n   (allreduce)
//   busbw = algbw * (n-1)/n    (allgather, reduce_scatter, all_to_all)
// where `bytes` is the size of the full (gathered / reduced) buffer, as in nccl-tests.
//   mpirun -np 4 build/benchmarks/collectives_busbw [--max-bytes N] [--iters N]
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "meshfuse/communicator.h"
#include "meshfuse/tensor.h"

using namespace meshfuse;
using Clock = std::chrono::steady_clock;

namespace {

// Seconds per call of `op` (after a warm-up): the median over `iters` timed calls, each
// bracketed by barriers so every rank measures the same collective.
double timeIt(Communicator& comm, int iters, const std::function<void()>& op) {
  op();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    comm.barrier();
    auto start = Clock::now();
    op();
    double s = std::chrono::duration<double>(Clock::now() - start).count();
    double worst = 0;  // the slowest rank decides
    MPI_Allreduce(&s, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    t.push_back(worst);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::string human(int64_t bytes) {
  if (bytes >= (1 << 20)) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= (1 << 10)) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

}  // namespace

int main(int argc, char** argv) {
  initializeMpi();  // MPI_Init_thread: stream threads call MPI
  int64_t max_bytes = 64ll << 20;
  int iters = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--max-bytes") max_bytes = std::stoll(argv[i + 1]);
    if (std::string(argv[i]) == "--iters") iters = std::stoi(argv[i + 1]);
  }
  {
    std::unique_ptr<Communicator> comm = makeMpiCommunicator();
    const int64_t n = comm->size(), me = comm->rank();
    Team team(n);
    std::iota(team.begin(), team.end(), 0);
    if (me == 0) {
      std::printf("# %lld ranks; bytes = full buffer size; GB/s = 1e9 bytes/s; memcpy on one core, same run\n",
                  static_cast<long long>(n));
      std::printf("| bytes | memcpy GB/s | allreduce busbw | allgather busbw | reduce_scatter busbw | all_to_all busbw |"
                  " best busbw / memcpy |\n|---|---|---|---|---|---|---|\n");
    }
    for (int64_t bytes = 1024; bytes <= max_bytes; bytes *= 4) {
      const int64_t count = bytes / 4, chunk = count / n;  // f32 elements
      Tensor a = Tensor::empty(DataType::Float, {count}), b = Tensor::empty(DataType::Float, {count});
      std::memset(a.data(), 1, a.nbytes());
      std::memset(b.data(), 0, b.nbytes());
      int reps = bytes <= (1 << 20) ? iters * 10 : iters;
      // Single-core memcpy: rank 0 copies while the others wait (ranks may share cores).
      double t_copy = timeIt(*comm, reps, [&] {
        if (me == 0) std::memcpy(b.data(), a.data(), a.nbytes());
      });
      double t_ar = timeIt(*comm, reps, [&] {
        comm->allreduce(a.data(), b.data(), count, DataType::Float, ReduceOp::Sum, team)->wait();
      });
      double t_ag = timeIt(*comm, reps, [&] { comm->allgather(a.data(), b.data(), chunk, DataType::Float, team)->wait(); });
      double t_rs = timeIt(*comm, reps, [&] {
        comm->reduceScatter(a.data(), b.data(), chunk, DataType::Float, ReduceOp::Sum, team)->wait();
      });
      double t_a2a = timeIt(*comm, reps, [&] { comm->allToAll(a.data(), b.data(), chunk, DataType::Float, team)->wait(); });
      const double gb = static_cast<double>(bytes) / 1e9, f = static_cast<double>(n - 1) / n;
      double copy = gb / t_copy, ar = gb / t_ar * 2 * f, ag = gb / t_ag * f, rs = gb / t_rs * f, a2a = gb / t_a2a * f;
      if (me == 0)
        std::printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", human(bytes).c_str(), copy, ar, ag, rs, a2a,
                    std::max({ar, ag, rs, a2a}) / copy);
    }
  }
  MPI_Finalize();
  return 0;
}
