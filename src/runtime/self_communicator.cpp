// The `self` communicator: world size 1. Every team is {0}, so each collective is a copy (or
// nothing, in place); point-to-point with oneself has no partner and is an error.
#include <cstring>

#include "meshfuse/error.h"
#include "meshfuse/communicator.h"
#include "runtime/communicator_checks.h"

namespace meshfuse {
namespace {

class DoneWork final : public Work {
 public:
  void wait() override {}
};

class SelfCommunicator final : public Communicator {
 public:
  std::string name() const override { return "self"; }
  int64_t rank() const override { return 0; }
  int64_t size() const override { return 1; }

  std::unique_ptr<Work> allgatherv(const void* send, void* recv, const Counts& counts, DataType dt,
                                   const Team& team) override {
    return copy("allgather", send, recv, counts, dt, team);
  }
  std::unique_ptr<Work> reduceScatterv(const void* send, void* recv, const Counts& counts, DataType dt, ReduceOp,
                                       const Team& team) override {
    return copy("reduce_scatter", send, recv, counts, dt, team);
  }
  std::unique_ptr<Work> allreduce(const void* send, void* recv, int64_t count, DataType dt, ReduceOp,
                                  const Team& team) override {
    return copy("allreduce", send, recv, {count}, dt, team);
  }
  std::unique_ptr<Work> allToAllv(const void* send, const Counts& send_counts, void* recv, const Counts& recv_counts,
                                  DataType dt, const Team& team) override {
    checkCounts("all_to_all", recv_counts, team);
    MF_USER_CHECK(send_counts == recv_counts, ErrorKind::Runtime,
                  "all_to_all: rank 0 sends [{}] elements to itself but receives [{}]", fmt::join(send_counts, ", "),
                  fmt::join(recv_counts, ", "));
    return copy("all_to_all", send, recv, send_counts, dt, team);
  }
  std::unique_ptr<Work> broadcast(void*, int64_t, DataType, int64_t root, const Team& team) override {
    checkTeamAndRoot("broadcast", team, root, 0, 1);
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<Work> reduce(const void* send, void* recv, int64_t count, DataType dt, ReduceOp, int64_t root,
                               const Team& team) override {
    checkTeamAndRoot("reduce", team, root, 0, 1);
    return copy("reduce", send, recv, {count}, dt, team);
  }
  std::unique_ptr<Work> gatherv(const void* send, void* recv, const Counts& counts, DataType dt, int64_t root,
                                const Team& team) override {
    checkTeamAndRoot("gather", team, root, 0, 1);
    return copy("gather", send, recv, counts, dt, team);
  }
  std::unique_ptr<Work> scatterv(const void* send, void* recv, const Counts& counts, DataType dt, int64_t root,
                                 const Team& team) override {
    checkTeamAndRoot("scatter", team, root, 0, 1);
    return copy("scatter", send, recv, counts, dt, team);
  }
  std::unique_ptr<Work> send(const void*, int64_t, DataType, int64_t peer, int64_t) override {
    userError(ErrorKind::Runtime, "send to rank {}: the self communicator has world size 1 (launch with mpirun)", peer);
  }
  std::unique_ptr<Work> recv(void*, int64_t, DataType, int64_t peer, int64_t) override {
    userError(ErrorKind::Runtime, "recv from rank {}: the self communicator has world size 1 (launch with mpirun)", peer);
  }
  void barrier() override {}
  [[noreturn]] void abort(const std::string& reason) override { throw UserError(ErrorKind::Runtime, reason); }

 private:
  // The one block of a team of one: a copy (nothing in place).
  std::unique_ptr<Work> copy(const char* what, const void* send, void* recv, const Counts& counts, DataType dt,
                             const Team& team) {
    checkTeamAndRoot(what, team, -1, 0, 1);
    checkCounts(what, counts, team);
    const int64_t count = counts[0];
    if (send != recv && count > 0) std::memcpy(recv, send, static_cast<size_t>(count * dtypeSize(dt)));
    return std::make_unique<DoneWork>();
  }
};

}  // namespace

std::unique_ptr<Communicator> makeSelfCommunicator() { return std::make_unique<SelfCommunicator>(); }

}  // namespace meshfuse
