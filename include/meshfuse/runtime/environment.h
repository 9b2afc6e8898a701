// The ONE place meshfuse reads environment variables (STYLE.md #12). Everything else takes
// these values as explicit options.
//
//   MESHFUSE_COMM_TIMEOUT   seconds a collective may wait for its peers before this rank
//                           aborts the job (default 300; 0 disables the watchdog)
//   MESHFUSE_CACHE_DIR      on-disk cache of compiled kernels (default ~/.cache/meshfuse)
//   OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK: set by mpirun/srun; tell that MPI launched us
#pragma once

#include <string>

namespace meshfuse {

struct RuntimeEnvironment {
  bool launched_by_mpi = false;
  double comm_timeout_s = 300;
  std::string cache_dir;
};

// Reads the variables above (every call reads them afresh; cheap).
RuntimeEnvironment readRuntimeEnvironment();

}  // namespace meshfuse
