// The host-staged communicator (see host_staged_communicator.h).
#include "runtime/cuda/host_staged_communicator.h"

#include <cstdlib>
#include <vector>

#include "meshfuse/error.h"
#include "runtime/cuda.h"
#include "runtime/communicator_checks.h"

namespace meshfuse::cuda {
namespace {

// The host twins of one call's buffers, and the copy back when the call completed.
struct Staging {
  std::vector<std::shared_ptr<void>> keep;  // host twins, alive until the copy back is queued
  void* device_out = nullptr;               // where received data goes back to
  const void* host_out = nullptr;
  size_t out_bytes = 0;
};

class StagedWork final : public Work {
 public:
  StagedWork(std::unique_ptr<Work> inner, std::shared_ptr<Staging> staging, std::shared_ptr<StagingMemory> memory)
      : staging_(std::move(staging)), memory_(std::move(memory)), inner_(std::move(inner)) {}
  // Dropped without wait() (a failed run): the inner operation may still read or write the host
  // twins (an MPI request outlives its handle), so they go back to the pool only after it ended.
  ~StagedWork() override {
    if (!staging_) return;
    try {
      inner_->wait();  // bounded: the inner communicator's watchdog aborts a hung operation
    } catch (...) {
      // It failed: nothing uses the twins any more.
    }
    inner_.reset();
  }
  void wait() override {
    if (!staging_) return;  // waited already
    inner_->wait();
    if (staging_->device_out != nullptr && staging_->out_bytes > 0)
      memory_->toDevice(staging_->device_out, staging_->host_out, staging_->out_bytes);
    staging_.reset();  // the twins go back to the pool, guarded by the copy's completion
  }

 private:
  // Declared before inner_: members are destroyed in reverse order, so the inner operation is
  // gone before its buffers are.
  std::shared_ptr<Staging> staging_;
  std::shared_ptr<StagingMemory> memory_;
  std::unique_ptr<Work> inner_;
};

class HostStagedCommunicator final : public Communicator {
 public:
  HostStagedCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<StagingMemory> memory)
      : inner_(std::move(inner)), memory_(std::move(memory)) {
    MF_CHECK(inner_ && memory_, "a host-staged communicator needs an inner communicator and staging memory");
  }

  std::string name() const override { return inner_->name() + "+host-staging"; }
  int64_t rank() const override { return inner_->rank(); }
  int64_t size() const override { return inner_->size(); }

  std::unique_ptr<Work> allgatherv(const void* send, void* recv, const Counts& counts, DataType dt,
                                   const Team& team) override {
    const int64_t me = member("allgather", team, -1, counts);
    return staged(send, counts[me], recv, totalCount(counts), dt, [&](const void* s, void* r) {
      return inner_->allgatherv(s, r, counts, dt, team);
    });
  }
  std::unique_ptr<Work> reduceScatterv(const void* send, void* recv, const Counts& counts, DataType dt, ReduceOp op,
                                       const Team& team) override {
    const int64_t me = member("reduce_scatter", team, -1, counts);
    return staged(send, totalCount(counts), recv, counts[me], dt, [&](const void* s, void* r) {
      return inner_->reduceScatterv(s, r, counts, dt, op, team);
    });
  }
  std::unique_ptr<Work> allreduce(const void* send, void* recv, int64_t count, DataType dt, ReduceOp op,
                                  const Team& team) override {
    checkTeamAndRoot("allreduce", team, -1, rank(), size());
    return staged(send, count, recv, count, dt, [&](const void* s, void* r) {
      return inner_->allreduce(s, r, count, dt, op, team);
    });
  }
  std::unique_ptr<Work> allToAllv(const void* send, const Counts& send_counts, void* recv, const Counts& recv_counts,
                                  DataType dt, const Team& team) override {
    member("all_to_all", team, -1, send_counts);
    checkCounts("all_to_all", recv_counts, team);
    return staged(send, totalCount(send_counts), recv, totalCount(recv_counts), dt, [&](const void* s, void* r) {
      return inner_->allToAllv(s, send_counts, r, recv_counts, dt, team);
    });
  }
  std::unique_ptr<Work> broadcast(void* buf, int64_t count, DataType dt, int64_t root, const Team& team) override {
    checkTeamAndRoot("broadcast", team, root, rank(), size());
    const bool is_root = root == rank();
    // The root's buffer is read, everyone else's written: one twin, staged one way.
    return staged(is_root ? buf : nullptr, is_root ? count : 0, is_root ? nullptr : buf, is_root ? 0 : count, dt,
                  [&](const void* s, void* r) {
                    return inner_->broadcast(is_root ? const_cast<void*>(s) : r, count, dt, root, team);
                  });
  }
  std::unique_ptr<Work> reduce(const void* send, void* recv, int64_t count, DataType dt, ReduceOp op, int64_t root,
                               const Team& team) override {
    checkTeamAndRoot("reduce", team, root, rank(), size());
    const bool is_root = root == rank();
    return staged(send, count, is_root ? recv : nullptr, is_root ? count : 0, dt, [&](const void* s, void* r) {
      return inner_->reduce(s, is_root ? r : nullptr, count, dt, op, root, team);
    });
  }
  std::unique_ptr<Work> gatherv(const void* send, void* recv, const Counts& counts, DataType dt, int64_t root,
                                const Team& team) override {
    const int64_t me = member("gather", team, root, counts);
    const bool is_root = root == rank();
    return staged(send, counts[me], is_root ? recv : nullptr, is_root ? totalCount(counts) : 0, dt,
                  [&](const void* s, void* r) { return inner_->gatherv(s, is_root ? r : nullptr, counts, dt, root, team); });
  }
  std::unique_ptr<Work> scatterv(const void* send, void* recv, const Counts& counts, DataType dt, int64_t root,
                                 const Team& team) override {
    const int64_t me = member("scatter", team, root, counts);
    const bool is_root = root == rank();
    return staged(is_root ? send : nullptr, is_root ? totalCount(counts) : 0, recv, counts[me], dt,
                  [&](const void* s, void* r) { return inner_->scatterv(is_root ? s : nullptr, r, counts, dt, root, team); });
  }
  // Staging changes no count: the inner communicator pads where it must.
  bool paddedBlocks() const override { return inner_->paddedBlocks(); }
  std::unique_ptr<Work> send(const void* buf, int64_t count, DataType dt, int64_t peer, int64_t tag) override {
    return staged(buf, count, nullptr, 0, dt,
                  [&](const void* s, void*) { return inner_->send(s, count, dt, peer, tag); });
  }
  std::unique_ptr<Work> recv(void* buf, int64_t count, DataType dt, int64_t peer, int64_t tag) override {
    return staged(nullptr, 0, buf, count, dt,
                  [&](const void*, void* r) { return inner_->recv(r, count, dt, peer, tag); });
  }
  std::unique_ptr<Work> sendRecv(const void* send, int64_t send_count, int64_t to, void* recv, int64_t recv_count,
                                 int64_t from, DataType dt, int64_t tag, const Team& team) override {
    return staged(to >= 0 ? send : nullptr, to >= 0 ? send_count : 0, from >= 0 ? recv : nullptr,
                  from >= 0 ? recv_count : 0, dt, [&](const void* s, void* r) {
                    return inner_->sendRecv(s, send_count, to, r, recv_count, from, dt, tag, team);
                  });
  }
  void prepareTeams(const std::vector<Team>& teams) override { inner_->prepareTeams(teams); }
  void barrier() override { inner_->barrier(); }
  [[noreturn]] void abort(const std::string& reason) override {
    inner_->abort(reason);
    std::_Exit(1);  // inner's abort() does not return either; this is for the compiler
  }

 private:
  // This rank's index in `team`, once the team, root and counts are checked.
  int64_t member(const char* what, const Team& team, int64_t root, const Counts& counts) {
    const int64_t me = checkTeamAndRoot(what, team, root, rank(), size());
    checkCounts(what, counts, team);
    return me;
  }

  // Stages `send` (read, `send_count` elements) and `recv` (written, `recv_count` elements)
  // and starts `start` on the host twins (or on the buffers themselves where they are host
  // memory). In place (send == recv) both share one twin, initialized from the device.
  template <typename Start>
  std::unique_ptr<Work> staged(const void* send, int64_t send_count, void* recv, int64_t recv_count, DataType dt,
                               Start&& start) {
    const size_t elem = static_cast<size_t>(dtypeSize(dt));
    const size_t send_bytes = static_cast<size_t>(send_count) * elem;
    const size_t recv_bytes = static_cast<size_t>(recv_count) * elem;
    auto staging = std::make_shared<Staging>();
    const void* host_send = send;
    void* host_recv = recv;
    const bool in_place = send != nullptr && send == recv;
    if (recv != nullptr && recv_bytes > 0 && memory_->onDevice(recv)) {
      std::shared_ptr<void> twin = memory_->hostBuffer(recv_bytes);
      staging->keep.push_back(twin);
      host_recv = twin.get();
      staging->device_out = recv;
      staging->host_out = twin.get();
      staging->out_bytes = recv_bytes;
    }
    if (send != nullptr && send_bytes > 0 && memory_->onDevice(send)) {
      if (in_place) {
        memory_->toHost(host_recv, send, send_bytes);
        host_send = host_recv;
      } else {
        std::shared_ptr<void> twin = memory_->hostBuffer(send_bytes);
        staging->keep.push_back(twin);
        memory_->toHost(twin.get(), send, send_bytes);
        host_send = twin.get();
      }
    }
    return std::make_unique<StagedWork>(start(host_send, host_recv), std::move(staging), memory_);
  }

  std::unique_ptr<Communicator> inner_;
  std::shared_ptr<StagingMemory> memory_;
};

}  // namespace

std::unique_ptr<Communicator> makeHostStagedCommunicator(std::unique_ptr<Communicator> inner,
                                                         std::shared_ptr<StagingMemory> memory) {
  return std::make_unique<HostStagedCommunicator>(std::move(inner), std::move(memory));
}

}  // namespace meshfuse::cuda

namespace meshfuse {

std::unique_ptr<Communicator> makeHostStagedCommunicator(std::unique_ptr<Communicator> inner) {
  return cuda::makeHostStagedCommunicator(std::move(inner), cuda::makeCudaStagingMemory());
}

}  // namespace meshfuse
