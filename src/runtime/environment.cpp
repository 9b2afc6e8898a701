// Reads the environment (see environment.h for the variables).
#include "runtime/environment.h"

#include <cstdlib>
#include <string>

#include "meshfuse/error.h"

namespace meshfuse {

RuntimeEnvironment readRuntimeEnvironment() {
  RuntimeEnvironment env;
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    env.launched_by_mpi |= std::getenv(v) != nullptr;
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"}) {
    const char* value = std::getenv(v);
    if (value == nullptr || env.local_rank >= 0) continue;
    char* end = nullptr;
    long r = std::strtol(value, &end, 10);
    if (end != value && *end == '\0' && r >= 0) env.local_rank = r;
  }
  if (const char* t = std::getenv("MESHFUSE_COMM_TIMEOUT")) {
    char* end = nullptr;
    env.comm_timeout_s = std::strtod(t, &end);
    MF_USER_CHECK(end != t && *end == '\0' && env.comm_timeout_s >= 0, ErrorKind::Value,
                  "MESHFUSE_COMM_TIMEOUT={}: expected a number of seconds >= 0", t);
  }
  if (const char* m = std::getenv("MESHFUSE_PERF_MAP")) {
    const std::string v = m;
    MF_USER_CHECK(v == "0" || v == "1", ErrorKind::Value, "MESHFUSE_PERF_MAP={}: expected 0 or 1", v);
    env.perf_map = v == "1";
  }
  if (const char* d = std::getenv("MESHFUSE_CACHE_DIR")) {
    env.cache_dir = d;
  } else if (const char* home = std::getenv("HOME")) {
    env.cache_dir = std::string(home) + "/.cache/meshfuse";
  } else {
    env.cache_dir = "/tmp/meshfuse-cache";
  }
  return env;
}

}  // namespace meshfuse
