/* A test-only MPI profiling (PMPI) library, loaded into the ranks of a test with
 *   mpirun -x LD_PRELOAD=libmeshfuse_kill_in_collective.so -x MESHFUSE_TEST_KILL_RANK=k ...
 * On rank k, the first non-blocking collective it issues (allreduce, allgather, reduce-scatter,
 * all-to-all, broadcast, ...) is issued to MPI and then the process sends itself SIGKILL, before
 * it waits: the peers are left inside a collective that rank k joined and will never finish.
 * Nothing in meshfuse knows about it (the library interposes MPI's own symbols, as profilers do),
 * so the test sees what a rank killed by the OOM killer or a scheduler looks like.
 *
 * MESHFUSE_TEST_KILL_IN=MPI_Iallreduce counts only collectives of that kind; MESHFUSE_TEST_KILL_AT=n
 * (default 1) kills at the n-th (counted) collective instead of the first. */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int collectives_issued = 0;

static void maybe_die(const char* what) {
  const char* target = getenv("MESHFUSE_TEST_KILL_RANK");
  if (target == NULL) return;
  int rank = -1;
  PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != atoi(target)) return;
  const char* kind = getenv("MESHFUSE_TEST_KILL_IN");
  if (kind != NULL && strcmp(kind, what) != 0) return;
  const char* at = getenv("MESHFUSE_TEST_KILL_AT");
  if (++collectives_issued != (at != NULL ? atoi(at) : 1)) return;
  fprintf(stderr, "kill_in_collective: rank %d issued %s and now sends itself SIGKILL (pid %d)\n", rank, what,
          (int)getpid());
  fflush(stderr);
  raise(SIGKILL);
}

#define ISSUE_THEN_MAYBE_DIE(name, call) \
  int rc = call;                         \
  maybe_die(name);                       \
  return rc

int MPI_Iallreduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c, MPI_Request* q) {
  ISSUE_THEN_MAYBE_DIE("MPI_Iallreduce", PMPI_Iallreduce(s, r, n, t, op, c, q));
}
int MPI_Iallgather(const void* s, int sn, MPI_Datatype st, void* r, int rn, MPI_Datatype rt, MPI_Comm c,
                   MPI_Request* q) {
  ISSUE_THEN_MAYBE_DIE("MPI_Iallgather", PMPI_Iallgather(s, sn, st, r, rn, rt, c, q));
}
int MPI_Ireduce_scatter_block(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c, MPI_Request* q) {
  ISSUE_THEN_MAYBE_DIE("MPI_Ireduce_scatter_block", PMPI_Ireduce_scatter_block(s, r, n, t, op, c, q));
}
int MPI_Ialltoall(const void* s, int sn, MPI_Datatype st, void* r, int rn, MPI_Datatype rt, MPI_Comm c,
                  MPI_Request* q) {
  ISSUE_THEN_MAYBE_DIE("MPI_Ialltoall", PMPI_Ialltoall(s, sn, st, r, rn, rt, c, q));
}
int MPI_Ibcast(void* b, int n, MPI_Datatype t, int root, MPI_Comm c, MPI_Request* q) {
  ISSUE_THEN_MAYBE_DIE("MPI_Ibcast", PMPI_Ibcast(b, n, t, root, c, q));
}
int MPI_Ireduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, int root, MPI_Comm c, MPI_Request* q) {
  ISSUE_THEN_MAYBE_DIE("MPI_Ireduce", PMPI_Ireduce(s, r, n, t, op, root, c, q));
}
