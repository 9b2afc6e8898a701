// The Communicator interface: every collective the host IR can issue, over a *team* (the
// global ranks of one mesh slice, in mesh order). Decomposition emits abstract communications;
// the runtime picks an implementation: `mpi` (OpenMPI; mpirun/srun, across nodes), `self`
// (world size 1) and, on GPUs, `nccl`.
//
// Buffers are contiguous memory of elements of `dtype`: host memory for `mpi` and `self`, device
// memory for `nccl` (a device communicator never takes host memory: front ends keep a separate
// host communicator for their own messages). Every call returns a Work handle; the call may
// complete asynchronously and the buffers must stay alive and untouched until Work::wait()
// returns. Blocking use is `comm.allreduce(...)->wait()`.
//
// The v-collectives (allgatherv, reduceScatterv, allToAllv, gatherv, scatterv) take the count of
// every team member's block, in team order (`Counts`): uneven shards give blocks of different
// sizes, possibly empty. Every member passes the same counts. The blocks lie packed in team
// order. `mpi` runs MPI's own v-collectives (MPI_Allgatherv, MPI_Reduce_scatter, ...); `nccl`
// pads an allgather's or reduce-scatter's blocks to the largest (NCCL needs equal counts; the
// padding never reaches the caller's buffers; paddedBlocks() says so). The equal-count calls
// (allgather(count), ...) are the v-collectives with every block of `count` elements.
//
// Per-rank pictures (team of 3 ranks a, b, c; each letter a block):
//   allgather:      send a | b | c            -> recv [a b c] on every rank
//   reduce_scatter: send [a0 a1 a2] [b0 ..]   -> recv a0+b0+c0 on rank 0, a1+b1+c1 on rank 1, ...
//   allreduce:      send a | b | c            -> recv a+b+c on every rank
//   all_to_all:     send [x0 x1 x2] on rank i -> recv [chunk i of rank 0, of rank 1, of rank 2]
//   broadcast:      buf on root               -> buf on every rank
//   reduce:         send a | b | c            -> recv a+b+c on root only
//   gather:         send a | b | c            -> recv [a b c] on root only
//   scatter:        send [x0 x1 x2] on root   -> recv x_i on rank i
//   send / recv:    point to point with a peer (global rank) and a tag
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "meshfuse/ir/collective.h"
#include "meshfuse/ir/dtype.h"

namespace meshfuse {

using Counts = std::vector<int64_t>;  // elements of each team member's block, in team order

class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the operation completes. Throws RuntimeError when it failed.
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string name() const = 0;  // "mpi", "self", "nccl"
  virtual int64_t rank() const = 0;      // this process's global rank
  virtual int64_t size() const = 0;      // world size

  // recv: the members' blocks packed in team order (counts[j] elements from member j).
  virtual std::unique_ptr<Work> allgatherv(const void* send, void* recv, const Counts& counts, DataType dtype,
                                           const Team& team) = 0;
  // send: a block for every member, packed in team order; member j receives the sum of block j
  // (counts[j] elements).
  virtual std::unique_ptr<Work> reduceScatterv(const void* send, void* recv, const Counts& counts, DataType dtype,
                                               ReduceOp op, const Team& team) = 0;
  virtual std::unique_ptr<Work> allreduce(const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op,
                                          const Team& team) = 0;
  // send: send_counts[j] elements for member j, packed in team order; recv: recv_counts[j] from
  // member j, packed likewise. (Each member's counts of what it sends and receives differ.)
  virtual std::unique_ptr<Work> allToAllv(const void* send, const Counts& send_counts, void* recv,
                                          const Counts& recv_counts, DataType dtype, const Team& team) = 0;
  virtual std::unique_ptr<Work> broadcast(void* buf, int64_t count, DataType dtype, int64_t root,
                                          const Team& team) = 0;
  virtual std::unique_ptr<Work> reduce(const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op,
                                       int64_t root, const Team& team) = 0;
  // recv (root only): the members' blocks packed in team order.
  virtual std::unique_ptr<Work> gatherv(const void* send, void* recv, const Counts& counts, DataType dtype,
                                        int64_t root, const Team& team) = 0;
  // send (root only): a block for every member, packed in team order.
  virtual std::unique_ptr<Work> scatterv(const void* send, void* recv, const Counts& counts, DataType dtype,
                                         int64_t root, const Team& team) = 0;
  // Whether allgatherv and reduceScatterv of unequal counts run as equal-count collectives of the
  // largest count (NCCL): what the collective report's padded bytes then cost.
  virtual bool paddedBlocks() const { return false; }

  // The equal-count collectives: every member's block has `count` elements (`count` per peer
  // for all_to_all).
  std::unique_ptr<Work> allgather(const void* send, void* recv, int64_t count, DataType dtype, const Team& team) {
    return allgatherv(send, recv, Counts(team.size(), count), dtype, team);
  }
  std::unique_ptr<Work> reduceScatter(const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op,
                                      const Team& team) {
    return reduceScatterv(send, recv, Counts(team.size(), count), dtype, op, team);
  }
  std::unique_ptr<Work> allToAll(const void* send, void* recv, int64_t count, DataType dtype, const Team& team) {
    return allToAllv(send, Counts(team.size(), count), recv, Counts(team.size(), count), dtype, team);
  }
  std::unique_ptr<Work> gather(const void* send, void* recv, int64_t count, DataType dtype, int64_t root,
                               const Team& team) {
    return gatherv(send, recv, Counts(team.size(), count), dtype, root, team);
  }
  std::unique_ptr<Work> scatter(const void* send, void* recv, int64_t count, DataType dtype, int64_t root,
                                const Team& team) {
    return scatterv(send, recv, Counts(team.size(), count), dtype, root, team);
  }
  virtual std::unique_ptr<Work> send(const void* buf, int64_t count, DataType dtype, int64_t peer, int64_t tag) = 0;
  virtual std::unique_ptr<Work> recv(void* buf, int64_t count, DataType dtype, int64_t peer, int64_t tag) = 0;
  // One step of an exchange: sends `send_count` elements of `send` to `to` and receives
  // `recv_count` into `recv` from `from` (-1: no send, or no receive), as ONE operation, so that
  // a ring (every rank receiving from its left while sending to its right) cannot deadlock
  // whatever the transport blocks on. `team`: the ranks that exchange with each other in this
  // program (the host program's ranks); a transport that needs a communicator per group of peers
  // (NCCL) uses the team's. The default issues recv() then send(), which suits transports whose
  // send and recv never block the caller (MPI's Irecv + Isend).
  virtual std::unique_ptr<Work> sendRecv(const void* send, int64_t send_count, int64_t to, void* recv,
                                         int64_t recv_count, int64_t from, DataType dtype, int64_t tag,
                                         const Team& team);
  // Sets up whatever per-team state the communicator creates with a blocking handshake among the
  // team's members (NCCL communicators), for every team of `teams`, in the one order every rank
  // uses: sorted (teams compare as vectors of ranks). Creating teams lazily in the order of first
  // use can deadlock with three or more ranks (rank 0 waits in {0,1} for rank 1, which waits in
  // {1,2} for rank 2, which waits in {0,2} for rank 0); in one global order it cannot: the
  // smallest team not created yet has all its members waiting in it. Each rank passes the teams
  // of its host program before that program's first communication (the evaluator does). The
  // default has nothing to set up.
  virtual void prepareTeams(const std::vector<Team>& /*teams*/) {}
  virtual void barrier() = 0;

  // The progress board, for the watchdog's hang report: this rank has issued `issued`
  // communications of its `run`-th program run; peerProgress() reads every rank's last
  // published (run, issued), or returns nothing when the communicator has no board (then the
  // report says the peers' positions are unknown). Reading never waits for a peer's cooperation
  // (a hung or dead peer cannot answer); it gives up after a bounded time.
  virtual void publishProgress(int64_t /*run*/, int64_t /*issued*/) {}
  virtual std::map<int64_t, std::pair<int64_t, int64_t>> peerProgress() { return {}; }

  // Called when this rank fails: makes every other rank fail promptly with a clear message
  // instead of waiting forever (MPI: MPI_Abort on the world communicator). Does not return.
  [[noreturn]] virtual void abort(const std::string& reason) = 0;
};

// What the calling thread is waiting for, in the host program's terms (the evaluator sets it
// around each wait): the watchdog adds it to its report. Scoped, per thread.
class WaitContext {
 public:
  explicit WaitContext(std::function<std::string()> describe);
  ~WaitContext();
  WaitContext(const WaitContext&) = delete;
  WaitContext& operator=(const WaitContext&) = delete;
  // The innermost context's description on this thread ("" when none); never throws.
  static std::string describeCurrent();

 private:
  std::function<std::string()> describe_;
  WaitContext* outer_;
};

// World size 1: every team is {0}; collectives are copies; send/recv to self are errors.
std::unique_ptr<Communicator> makeSelfCommunicator();
// OpenMPI over MPI_COMM_WORLD. Calls MPI_Init_thread if MPI is not initialized yet, and
// registers MPI_Finalize at exit. Throws RuntimeError when MPI is unavailable, or when MPI was
// initialized (by the application) with less than MPI_THREAD_SERIALIZED thread support: stream
// worker threads call MPI.
std::unique_ptr<Communicator> makeMpiCommunicator();
// Initializes MPI as makeMpiCommunicator() needs it (MPI_Init_thread asking for
// MPI_THREAD_MULTIPLE; MPI_Finalize at exit unless the program finalizes first), if it is not
// initialized yet. For programs that call MPI themselves (test mains, benchmarks): call it
// instead of MPI_Init. Throws RuntimeError when MPI provides less than MPI_THREAD_SERIALIZED.
void initializeMpi();
// `mpi` when launched by mpirun/srun (or when MPI is already initialized), else `self`.
std::unique_ptr<Communicator> makeDefaultCommunicator();

}  // namespace meshfuse
