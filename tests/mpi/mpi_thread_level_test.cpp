// The `mpi` communicator refuses an MPI initialized with too little thread support: plain
// MPI_Init (OpenMPI grants MPI_THREAD_SINGLE) while stream worker threads would call MPI. This
// program initializes MPI that way on purpose and expects the error (no GoogleTest: the test
// binaries' main initializes MPI properly, which is the very thing this checks).
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <cstdio>
#include <string>

#include "meshfuse/error.h"
#include "meshfuse/communicator.h"

int main(int argc, char** argv) {
  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
  int status = 1;
  if (provided >= MPI_THREAD_SERIALIZED) {
    std::printf("SKIP: this MPI grants %d for MPI_THREAD_SINGLE; nothing to refuse\n", provided);
    status = 0;
  } else {
    try {
      meshfuse::makeMpiCommunicator();
      std::printf("FAIL: the communicator accepted MPI_THREAD_SINGLE\n");
    } catch (const meshfuse::UserError& e) {
      const std::string want =
          "MPI provides thread support MPI_THREAD_SINGLE but meshfuse's MPI communicator needs at least "
          "MPI_THREAD_SERIALIZED (its stream threads call MPI), and MPI was initialized before meshfuse: "
          "initialize MPI with MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided)";
      const bool ok = e.kind() == meshfuse::ErrorKind::Runtime && e.message().find(want) != std::string::npos;
      std::printf("%s: %s\n", ok ? "OK" : "FAIL (wrong message)", e.message().c_str());
      status = ok ? 0 : 1;
    }
  }
  MPI_Finalize();
  return status;
}
