// The ONE place meshfuse reads environment variables (STYLE.md #12). Everything else takes
// these values as explicit options.
//
//   MESHFUSE_COMM_TIMEOUT   seconds a collective may wait for its peers before this rank
//                           aborts the job (default 300; 0 disables the watchdog)
//   MESHFUSE_CACHE_DIR      on-disk cache of compiled kernels (default ~/.cache/meshfuse)
//   MESHFUSE_PERF_MAP       1: name the CPU backend's JIT-compiled kernels for Linux perf
//                           (/tmp/perf-<pid>.map; docs/kernels.md "Profiling"); default 0
//   OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK: set by mpirun/srun; tell that MPI launched us
//   OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, MPI_LOCALRANKID: this rank's index on its node
//                           (each rank of a multi-GPU node uses GPU local_rank % GPUs)
#pragma once

#include <string>

namespace meshfuse {

struct RuntimeEnvironment {
  bool launched_by_mpi = false;
  int64_t local_rank = -1;  // -1: not known
  double comm_timeout_s = 300;
  std::string cache_dir;
  bool perf_map = false;
};

// Reads the variables above (every call reads them afresh; cheap).
RuntimeEnvironment readRuntimeEnvironment();

}  // namespace meshfuse
