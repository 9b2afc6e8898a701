// The `nccl` communicator (cuda.h: makeNcclCommunicator).
//
// One NCCL communicator per team, created by the team's members only (the first member makes the
// unique id and broadcasts it over the bootstrap communicator to the team), so an MPMD rank never
// joins another team's setup. Creation blocks until every member joined, so the evaluator has
// every team of its program created up front, in sorted order (prepareTeams): creating them in
// the order of first use can deadlock with three or more ranks. Collectives are enqueued on the
// current CUDA stream (outside tasks: the context's communicator stream, which the allocator's
// fences cover); each returns a Work holding an event recorded after it.
//
// Point to point: a host program's exchanges (sendRecv: a ring step, a stage boundary) run on
// the communicator of the program's team, the receive and the send in one ncclGroupStart/End
// group: as two calls on one stream, every rank of a ring would wait in its receive for a send
// queued behind its peer's receive. A lone send() or recv() uses the pair's communicator.
//
// No hangs: a watchdog thread polls every outstanding collective's event and every
// communicator's asynchronous error. A collective that has not completed within the timeout
// (MESHFUSE_COMM_TIMEOUT), an NCCL error, a CUDA error on this rank's GPU (a kernel fault,
// reported as such at once, not as a peer's timeout), or a communicator creation that does not
// return in time aborts every NCCL communicator (ncclCommAbort, which also frees kernels stuck
// waiting for a peer) and then the job through the bootstrap communicator (MPI_Abort under
// mpirun).
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <list>
#include <map>
#include <mutex>
#include <thread>

#include "meshfuse/error.h"
#include "runtime/cuda.h"
#include "runtime/environment.h"
#include "runtime/communicator_checks.h"
#include "runtime/cuda/cuda_context.h"
#include "runtime/cuda/cuda_error.h"
#include "runtime/cuda/cuda_libraries.h"
#include "runtime/cuda/nccl_support.h"

namespace meshfuse::cuda {

std::string ncclVersionString() {
  int v = 0;
  if (dyn::ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // 2.19+ encode major*10000 + minor*100 + patch.
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

namespace {

void checkNccl(ncclResult_t r, const char* call) {
  MF_USER_CHECK(r == ncclSuccess, ErrorKind::Runtime, "NCCL error in {}: {} ({})", call, dyn::ncclGetErrorString(r),
                dyn::ncclGetLastError(nullptr));
}
#define MF_NCCL_CHECK(call) checkNccl((call), #call)

using Clock = std::chrono::steady_clock;

struct NcclTypeOp {
  ncclDataType_t type;
  ncclRedOp_t sum, max;
};

NcclTypeOp ncclTypeOf(DataType dt) {
  switch (dt) {
    case DataType::Float: return {ncclFloat32, ncclSum, ncclMax};
    case DataType::BFloat16: return {ncclBfloat16, ncclSum, ncclMax};
    case DataType::Half: return {ncclFloat16, ncclSum, ncclMax};
    case DataType::Int64: return {ncclInt64, ncclSum, ncclMax};
    case DataType::Bool: return {ncclUint8, ncclMax, ncclMax};  // "sum" of bools is logical or
  }
  MF_CHECK(false, "unknown dtype");
}


class NcclCommunicator;

class NcclWork final : public Work {
 public:
  NcclWork(cudaEvent_t event, std::shared_ptr<void> owner) : event_(event), owner_(std::move(owner)) {}
  // Inside a task: the waiting stream waits for the collective (no host block). Outside: the
  // host blocks; the watchdog aborts the job if the collective never completes.
  void wait() override {
    if (cudaStream_t s = currentStream()) {
      MF_CUDA_CHECK(cudaStreamWaitEvent(s, event_, 0));
      return;
    }
    MF_CUDA_CHECK(cudaEventSynchronize(event_));
  }

 private:
  cudaEvent_t event_;
  std::shared_ptr<void> owner_;  // keeps the event alive (destroyed by the watchdog's last reference)
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::unique_ptr<Communicator> bootstrap, double timeout_s)
      : bootstrap_(std::move(bootstrap)), timeout_s_(timeout_s) {
    MF_CHECK(bootstrap_ != nullptr, "an NCCL communicator needs a bootstrap communicator");
    device_ = requireDevice(-1);
    ctx_ = CudaContext::create(device_);
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    if (aborted_) return;
    (void)cudaSetDevice(device_);
    for (auto& [team, comm] : comms_) {
      (void)dyn::ncclCommFinalize(comm);  // flushes this rank's outstanding operations
      (void)dyn::ncclCommDestroy(comm);
    }
  }

  std::string name() const override { return "nccl"; }
  int64_t rank() const override { return bootstrap_->rank(); }
  int64_t size() const override { return bootstrap_->size(); }

  // Unequal blocks are padded to the largest (NCCL's allgather takes one count): each rank's
  // block goes into a padded scratch block, and the gathered blocks are copied out of theirs.
  std::unique_ptr<Work> allgatherv(const void* send, void* recv, const Counts& counts, DataType dt,
                                   const Team& team) override {
    ncclComm_t c = commOf("allgather", team, -1);
    checkCounts("allgather", counts, team);
    const int64_t me = indexIn(team, rank());
    if (equalCounts(counts)) {
      return run("allgather", team, [&](cudaStream_t s) {
        MF_NCCL_CHECK(dyn::ncclAllGather(send, recv, n(counts[me]), ncclTypeOf(dt).type, c, s));
      });
    }
    const int64_t largest = *std::max_element(counts.begin(), counts.end()), t = static_cast<int64_t>(team.size());
    const size_t elem = static_cast<size_t>(dtypeSize(dt));
    Tensor block = scratch(dt, largest), gathered = scratch(dt, largest * t);  // alive until run() returns
    const std::vector<int64_t> displs = displacements(counts);
    return run("allgather (padded)", team, [&](cudaStream_t s) {
      MF_CUDA_CHECK(cudaMemsetAsync(block.data(), 0, n(largest) * elem, s));
      copyOwn(block.data(), send, n(counts[me]) * elem, s);
      MF_NCCL_CHECK(dyn::ncclAllGather(block.data(), gathered.data(), n(largest), ncclTypeOf(dt).type, c, s));
      for (int64_t j = 0; j < t; ++j)
        copyOwn(at(recv, n(displs[j]) * elem), at(gathered.data(), n(j * largest) * elem), n(counts[j]) * elem, s);
    });
  }
  // Unequal blocks are padded to the largest: the blocks to reduce go into padded scratch blocks
  // (zeros in the padding), and this rank's sum is copied out of its block.
  std::unique_ptr<Work> reduceScatterv(const void* send, void* recv, const Counts& counts, DataType dt, ReduceOp op,
                                       const Team& team) override {
    ncclComm_t c = commOf("reduce_scatter", team, -1);
    checkCounts("reduce_scatter", counts, team);
    const int64_t me = indexIn(team, rank());
    if (equalCounts(counts)) {
      return run("reduce_scatter", team, [&](cudaStream_t s) {
        MF_NCCL_CHECK(dyn::ncclReduceScatter(send, recv, n(counts[me]), ncclTypeOf(dt).type, redOp(dt, op), c, s));
      });
    }
    const int64_t largest = *std::max_element(counts.begin(), counts.end()), t = static_cast<int64_t>(team.size());
    const size_t elem = static_cast<size_t>(dtypeSize(dt));
    Tensor blocks = scratch(dt, largest * t), mine = scratch(dt, largest);  // alive until run() returns
    const std::vector<int64_t> displs = displacements(counts);
    return run("reduce_scatter (padded)", team, [&](cudaStream_t s) {
      MF_CUDA_CHECK(cudaMemsetAsync(blocks.data(), 0, n(largest * t) * elem, s));
      for (int64_t j = 0; j < t; ++j)
        copyOwn(at(blocks.data(), n(j * largest) * elem), at(send, n(displs[j]) * elem), n(counts[j]) * elem, s);
      MF_NCCL_CHECK(
          dyn::ncclReduceScatter(blocks.data(), mine.data(), n(largest), ncclTypeOf(dt).type, redOp(dt, op), c, s));
      copyOwn(recv, mine.data(), n(counts[me]) * elem, s);
    });
  }
  bool paddedBlocks() const override { return true; }
  std::unique_ptr<Work> allreduce(const void* send, void* recv, int64_t count, DataType dt, ReduceOp op,
                                  const Team& team) override {
    ncclComm_t c = commOf("allreduce", team, -1);
    return run("allreduce", team, [&](cudaStream_t s) {
      MF_NCCL_CHECK(dyn::ncclAllReduce(send, recv, n(count), ncclTypeOf(dt).type, redOp(dt, op), c, s));
    });
  }
  // Point to point with every peer: each pair exchanges its own counts (no padding).
  std::unique_ptr<Work> allToAllv(const void* send, const Counts& send_counts, void* recv, const Counts& recv_counts,
                                  DataType dt, const Team& team) override {
    ncclComm_t c = commOf("all_to_all", team, -1);
    checkCounts("all_to_all", send_counts, team);
    checkCounts("all_to_all", recv_counts, team);
    const int64_t me = indexIn(team, rank());
    const size_t elem = static_cast<size_t>(dtypeSize(dt));
    const std::vector<int64_t> sd = displacements(send_counts), rd = displacements(recv_counts);
    return run("all_to_all", team, [&](cudaStream_t s) {
      MF_NCCL_CHECK(dyn::ncclGroupStart());
      for (int64_t j = 0; j < static_cast<int64_t>(team.size()); ++j) {
        if (j == me) continue;
        if (send_counts[j] > 0)
          MF_NCCL_CHECK(dyn::ncclSend(at(send, n(sd[j]) * elem), n(send_counts[j]), ncclTypeOf(dt).type,
                                      static_cast<int>(j), c, s));
        if (recv_counts[j] > 0)
          MF_NCCL_CHECK(dyn::ncclRecv(at(recv, n(rd[j]) * elem), n(recv_counts[j]), ncclTypeOf(dt).type,
                                      static_cast<int>(j), c, s));
      }
      MF_NCCL_CHECK(dyn::ncclGroupEnd());
      copyOwn(at(recv, n(rd[me]) * elem), at(send, n(sd[me]) * elem), n(send_counts[me]) * elem, s);
    });
  }
  std::unique_ptr<Work> broadcast(void* buf, int64_t count, DataType dt, int64_t root, const Team& team) override {
    ncclComm_t c = commOf("broadcast", team, root);
    return run("broadcast", team, [&](cudaStream_t s) {
      MF_NCCL_CHECK(dyn::ncclBroadcast(buf, buf, n(count), ncclTypeOf(dt).type, indexIn(team, root), c, s));
    });
  }
  std::unique_ptr<Work> reduce(const void* send, void* recv, int64_t count, DataType dt, ReduceOp op, int64_t root,
                               const Team& team) override {
    ncclComm_t c = commOf("reduce", team, root);
    return run("reduce", team, [&](cudaStream_t s) {
      MF_NCCL_CHECK(dyn::ncclReduce(send, recv, n(count), ncclTypeOf(dt).type, redOp(dt, op), indexIn(team, root), c, s));
    });
  }
  std::unique_ptr<Work> gatherv(const void* send, void* recv, const Counts& counts, DataType dt, int64_t root,
                                const Team& team) override {
    ncclComm_t c = commOf("gather", team, root);
    checkCounts("gather", counts, team);
    const int64_t me = indexIn(team, rank()), r = indexIn(team, root);
    const size_t elem = static_cast<size_t>(dtypeSize(dt));
    const std::vector<int64_t> displs = displacements(counts);
    return run("gather", team, [&](cudaStream_t s) {
      MF_NCCL_CHECK(dyn::ncclGroupStart());
      if (me == r) {
        for (int64_t j = 0; j < static_cast<int64_t>(team.size()); ++j)
          if (j != me && counts[j] > 0)
            MF_NCCL_CHECK(dyn::ncclRecv(at(recv, n(displs[j]) * elem), n(counts[j]), ncclTypeOf(dt).type,
                                        static_cast<int>(j), c, s));
      } else if (counts[me] > 0) {
        MF_NCCL_CHECK(dyn::ncclSend(send, n(counts[me]), ncclTypeOf(dt).type, static_cast<int>(r), c, s));
      }
      MF_NCCL_CHECK(dyn::ncclGroupEnd());
      if (me == r) copyOwn(at(recv, n(displs[me]) * elem), send, n(counts[me]) * elem, s);
    });
  }
  std::unique_ptr<Work> scatterv(const void* send, void* recv, const Counts& counts, DataType dt, int64_t root,
                                 const Team& team) override {
    ncclComm_t c = commOf("scatter", team, root);
    checkCounts("scatter", counts, team);
    const int64_t me = indexIn(team, rank()), r = indexIn(team, root);
    const size_t elem = static_cast<size_t>(dtypeSize(dt));
    const std::vector<int64_t> displs = displacements(counts);
    return run("scatter", team, [&](cudaStream_t s) {
      MF_NCCL_CHECK(dyn::ncclGroupStart());
      if (me == r) {
        for (int64_t j = 0; j < static_cast<int64_t>(team.size()); ++j)
          if (j != me && counts[j] > 0)
            MF_NCCL_CHECK(dyn::ncclSend(at(send, n(displs[j]) * elem), n(counts[j]), ncclTypeOf(dt).type,
                                        static_cast<int>(j), c, s));
      } else if (counts[me] > 0) {
        MF_NCCL_CHECK(dyn::ncclRecv(recv, n(counts[me]), ncclTypeOf(dt).type, static_cast<int>(r), c, s));
      }
      MF_NCCL_CHECK(dyn::ncclGroupEnd());
      if (me == r) copyOwn(recv, at(send, n(displs[me]) * elem), n(counts[me]) * elem, s);
    });
  }
  // NCCL has no tags: messages between a pair match in issue order, which the evaluator keeps
  // identical on both sides (each rank issues its communications in program order).
  std::unique_ptr<Work> send(const void* buf, int64_t count, DataType dt, int64_t peer, int64_t) override {
    Team pair = pairOf("send", peer);
    ncclComm_t c = commOf("send", pair, -1);
    return run("send", pair, [&](cudaStream_t s) {
      MF_NCCL_CHECK(dyn::ncclSend(buf, n(count), ncclTypeOf(dt).type, indexIn(pair, peer), c, s));
    });
  }
  std::unique_ptr<Work> recv(void* buf, int64_t count, DataType dt, int64_t peer, int64_t) override {
    Team pair = pairOf("recv", peer);
    ncclComm_t c = commOf("recv", pair, -1);
    return run("recv", pair, [&](cudaStream_t s) {
      MF_NCCL_CHECK(dyn::ncclRecv(buf, n(count), ncclTypeOf(dt).type, indexIn(pair, peer), c, s));
    });
  }
  // The receive and the send in one group on the team's communicator (see the file comment).
  std::unique_ptr<Work> sendRecv(const void* send_buf, int64_t send_count, int64_t to, void* recv_buf,
                                 int64_t recv_count, int64_t from, DataType dt, int64_t, const Team& team) override {
    MF_CHECK(to >= 0 || from >= 0, "sendRecv with neither a peer to send to nor one to receive from");
    for (int64_t peer : {to, from})
      MF_CHECK(peer < 0 || (peer != rank() && std::find(team.begin(), team.end(), peer) != team.end()),
               "sendRecv: peer {} is not another rank of the team [{}] (this is rank {})", peer, fmt::join(team, ", "),
               rank());
    ncclComm_t c = commOf("send_recv", team, -1);
    return run("send_recv", team, [&](cudaStream_t s) {
      MF_NCCL_CHECK(dyn::ncclGroupStart());
      if (from >= 0) MF_NCCL_CHECK(dyn::ncclRecv(recv_buf, n(recv_count), ncclTypeOf(dt).type, indexIn(team, from), c, s));
      if (to >= 0) MF_NCCL_CHECK(dyn::ncclSend(send_buf, n(send_count), ncclTypeOf(dt).type, indexIn(team, to), c, s));
      MF_NCCL_CHECK(dyn::ncclGroupEnd());
    });
  }
  // Every team's communicator, in the callers' (sorted) order: see communicator.h.
  void prepareTeams(const std::vector<Team>& teams) override {
    for (const Team& team : teams) commOf("prepare", team, -1);
  }
  void barrier() override { bootstrap_->barrier(); }

  [[noreturn]] void abort(const std::string& reason) override {
    abortComms();
    bootstrap_->abort(reason);
    std::_Exit(1);  // the bootstrap's abort() does not return either; this is for the compiler
  }

 private:
  static size_t n(int64_t count) {
    MF_CHECK(count >= 0, "negative element count {}", count);
    return static_cast<size_t>(count);
  }
  static void* at(const void* base, size_t offset) {
    return static_cast<char*>(const_cast<void*>(base)) + offset;
  }
  static int indexIn(const Team& team, int64_t r) {
    return static_cast<int>(std::find(team.begin(), team.end(), r) - team.begin());
  }
  static ncclRedOp_t redOp(DataType dt, ReduceOp op) {
    return op == ReduceOp::Max ? ncclTypeOf(dt).max : ncclTypeOf(dt).sum;
  }
  // Device scratch memory for padded blocks, from the context's cache (freed blocks are fenced
  // after the work submitted before: keep it alive until run() returned).
  Tensor scratch(DataType dt, int64_t elements) { return CudaContext::allocateTensor(ctx_, dt, {elements}); }
  static void copyOwn(void* dst, const void* src, size_t bytes, cudaStream_t s) {
    if (bytes > 0 && dst != src) MF_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
  }
  Team pairOf(const char* what, int64_t peer) const {
    MF_USER_CHECK(peer >= 0 && peer < size() && peer != rank(), ErrorKind::Runtime,
                  "{}: peer rank {} is not another rank of this world of {} ranks (this is rank {})", what, peer,
                  size(), rank());
    return {std::min(rank(), peer), std::max(rank(), peer)};
  }

  // Enqueues on the task's stream, else (outside tasks) the context's communicator stream; the
  // Submission makes later frees fence after it.
  template <typename Enqueue>
  std::unique_ptr<Work> run(const char* what, const Team& team, Enqueue&& enqueue) {
    MF_CUDA_CHECK(cudaSetDevice(device_));
    Submission q(*ctx_, CudaContext::kCommunicatorStream);
    cudaStream_t s = q.stream();
    enqueue(s);
    cudaEvent_t e = nullptr;
    MF_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    std::shared_ptr<void> owner(e, [](void* p) { (void)cudaEventDestroy(static_cast<cudaEvent_t>(p)); });
    MF_CUDA_CHECK(cudaEventRecord(e, s));
    if (timeout_s_ > 0) {
      std::lock_guard<std::mutex> lk(mu_);
      watched_.push_back({e, deadline(), fmt::format("{} on team [{}]", what, fmt::join(team, ", "))});
      watched_owners_.push_back(owner);
    }
    return std::make_unique<NcclWork>(e, std::move(owner));
  }

  Clock::time_point deadline() const {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
  }

  // The NCCL communicator of `team`, created on first use by the team's members.
  ncclComm_t commOf(const char* what, const Team& team, int64_t root) {
    checkTeamAndRoot(what, team, root, rank(), size());
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = comms_.find(team);
      if (it != comms_.end()) return it->second;
    }
    MF_CUDA_CHECK(cudaSetDevice(device_));
    ncclUniqueId id{};
    static_assert(sizeof(ncclUniqueId) % sizeof(int64_t) == 0, "the unique id travels as int64 words");
    if (team.front() == rank()) MF_NCCL_CHECK(dyn::ncclGetUniqueId(&id));
    if (team.size() > 1)
      bootstrap_->broadcast(&id, sizeof(id) / sizeof(int64_t), DataType::Int64, team.front(), team)->wait();
    const std::string creating = fmt::format("creating the NCCL communicator of team [{}] for {}",
                                             fmt::join(team, ", "), what);
    std::list<WatchedOperation>::iterator guard;
    {
      std::lock_guard<std::mutex> lk(mu_);
      watched_.push_back({nullptr, deadline(), creating});
      guard = std::prev(watched_.end());
    }
    ncclComm_t comm = nullptr;
    ncclResult_t r = dyn::ncclCommInitRank(&comm, static_cast<int>(team.size()), id, indexIn(team, rank()));
    std::lock_guard<std::mutex> lk(mu_);
    watched_.erase(guard);
    checkNccl(r, creating.c_str());
    comms_.emplace(team, comm);
    return comm;
  }

  void watch() {
    (void)cudaSetDevice(device_);
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
      cv_.wait_for(lk, std::chrono::milliseconds(50));
      std::string failure = pollWatched(watched_, Clock::now(), timeout_s_, cudaEventQuery);
      // The events the list no longer names can go (their Work may still hold them).
      std::erase_if(watched_owners_, [&](const std::shared_ptr<void>& o) {
        return std::none_of(watched_.begin(), watched_.end(),
                            [&](const WatchedOperation& w) { return w.event == static_cast<cudaEvent_t>(o.get()); });
      });
      for (auto& [team, comm] : comms_) {
        ncclResult_t async = ncclSuccess;
        if (failure.empty() && dyn::ncclCommGetAsyncError(comm, &async) == ncclSuccess && async != ncclSuccess &&
            async != ncclInProgress)
          failure = fmt::format("NCCL reported an asynchronous error on team [{}]: {}", fmt::join(team, ", "),
                                dyn::ncclGetErrorString(async));
      }
      if (failure.empty()) continue;
      lk.unlock();
      fail(failure);
    }
  }

  // From the watchdog thread: nothing can be thrown to the host program from here.
  [[noreturn]] void fail(const std::string& reason) {
    std::cerr << fmt::format("meshfuse: rank {} of {} (nccl): {}\n", rank(), size(), reason) << std::flush;
    try {
      abort(reason);
    } catch (const std::exception& e) {  // the `self` bootstrap throws instead of exiting
      std::cerr << "meshfuse: " << e.what() << "\n" << std::flush;
    }
    std::_Exit(1);
  }

  void abortComms() {
    std::lock_guard<std::mutex> lk(mu_);
    if (aborted_) return;
    aborted_ = true;
    for (auto& [team, comm] : comms_) (void)dyn::ncclCommAbort(comm);
  }

  std::unique_ptr<Communicator> bootstrap_;
  double timeout_s_;
  int device_ = 0;
  std::shared_ptr<CudaContext> ctx_;  // the process's context of device_: streams fenced with the allocator's
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, aborted_ = false;
  std::map<Team, ncclComm_t> comms_;
  std::list<WatchedOperation> watched_;
  std::vector<std::shared_ptr<void>> watched_owners_;
  std::thread watchdog_;
};

}  // namespace

std::string pollWatched(std::list<WatchedOperation>& ops, Clock::time_point now, double timeout_s,
                        const std::function<cudaError_t(cudaEvent_t)>& query) {
  std::string failure;
  for (auto it = ops.begin(); it != ops.end();) {
    const cudaError_t state = it->event != nullptr ? query(it->event) : cudaErrorNotReady;
    if (state == cudaSuccess) {
      it = ops.erase(it);
      continue;
    }
    if (state != cudaErrorNotReady && failure.empty())
      failure = fmt::format("CUDA error on this rank's GPU while {} was in flight: {} ({}){}: this rank failed, not a "
                            "peer",
                            it->what, cudaGetErrorString(state), cudaGetErrorName(state),
                            state == cudaErrorIllegalAddress || state == cudaErrorLaunchFailure
                                ? " (a kernel faulted; run under compute-sanitizer to find it)"
                                : "");
    if (state == cudaErrorNotReady && now > it->deadline && failure.empty())
      failure = fmt::format("{} did not complete within {} s (MESHFUSE_COMM_TIMEOUT): a peer rank failed, hangs, "
                            "or runs a different program",
                            it->what, timeout_s);
    ++it;
  }
  return failure;
}

}  // namespace meshfuse::cuda

namespace meshfuse {

std::unique_ptr<Communicator> makeNcclCommunicator(std::unique_ptr<Communicator> bootstrap) {
  return std::make_unique<cuda::NcclCommunicator>(std::move(bootstrap), readRuntimeEnvironment().comm_timeout_s);
}

}  // namespace meshfuse
