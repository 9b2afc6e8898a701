// The `mpi` communicator: every collective over OpenMPI's non-blocking API, on one cached
// sub-communicator per team (created with MPI_Comm_create_group, which only the team's members
// call, so an MPMD rank never has to take part in another team's setup).
//
// No hangs: Work::wait() polls MPI_Test and, when a collective has not completed within the
// watchdog timeout (MESHFUSE_COMM_TIMEOUT), aborts the whole job with a message naming the
// collective and its team. A rank that fails calls abort(), which is MPI_Abort: mpirun then
// terminates every other rank at once instead of leaving them waiting in a collective.
//
// Thread safety: stream worker threads call MPI (a communication issues on one thread and is
// waited for on another), so MPI must provide at least MPI_THREAD_SERIALIZED. meshfuse asks for
// MPI_THREAD_MULTIPLE when it initializes MPI (initializeMpi()); with SERIALIZED every MPI call
// is serialized by a mutex. A process that initialized MPI itself with less (plain MPI_Init
// gives MPI_THREAD_SINGLE with OpenMPI) is refused with an error saying how to fix it.
#define OMPI_SKIP_MPICXX 1  // the C API only: no libmpi_cxx
#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>

#include "meshfuse/error.h"
#include "meshfuse/communicator.h"
#include "runtime/environment.h"
#include "runtime/communicator_checks.h"

namespace meshfuse {
namespace {

// ---- bf16 / f16 reductions: MPI has no such types; reduce their bit patterns through f32 ----
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float), bool Max>
void reduce16(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    float x = ToFloat(a[i]), y = ToFloat(b[i]);
    b[i] = FromFloat(Max ? (x > y ? x : y) : x + y);
  }
}

struct MpiType {
  MPI_Datatype type;
  MPI_Op sum, max;
};

const char* threadLevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "(unknown)";
}

// Initializes MPI once per process (unless someone else, e.g. mpi4py or a test's main, did) and
// finalizes it at exit only if it initialized it.
class MpiProcess {
 public:
  static MpiProcess& get() {
    static MpiProcess p;
    return p;
  }
  bool threadMultiple() const { return provided_ >= MPI_THREAD_MULTIPLE; }
  MpiType type(DataType dt) const {
    switch (dt) {
      case DataType::Float: return {MPI_FLOAT, MPI_SUM, MPI_MAX};
      case DataType::BFloat16: return {MPI_UINT16_T, bf16_sum_, bf16_max_};
      case DataType::Half: return {MPI_UINT16_T, f16_sum_, f16_max_};
      case DataType::Int64: return {MPI_INT64_T, MPI_SUM, MPI_MAX};
      case DataType::Bool: return {MPI_C_BOOL, MPI_LOR, MPI_LOR};
    }
    MF_CHECK(false, "unknown dtype");
  }

 private:
  MpiProcess() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) {
      MPI_Query_thread(&provided_);
    } else {
      MF_USER_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided_) == MPI_SUCCESS,
                    ErrorKind::Runtime, "MPI_Init_thread failed");
      std::atexit([] {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Finalize();
      });
    }
    MF_USER_CHECK(provided_ >= MPI_THREAD_SERIALIZED, ErrorKind::Runtime,
                  "MPI provides thread support {} but meshfuse's MPI communicator needs at least "
                  "MPI_THREAD_SERIALIZED (its stream threads call MPI){}: initialize MPI with "
                  "MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) or meshfuse::initializeMpi() instead "
                  "of MPI_Init, or let meshfuse initialize it",
                  threadLevelName(provided_), initialized ? ", and MPI was initialized before meshfuse" : "");
    // Errors come back as return codes, so they become exceptions with a message, not a crash.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Op_create(&reduce16<bf16BitsToFloat, floatToBf16Bits, false>, 1, &bf16_sum_);
    MPI_Op_create(&reduce16<bf16BitsToFloat, floatToBf16Bits, true>, 1, &bf16_max_);
    MPI_Op_create(&reduce16<halfBitsToFloat, floatToHalfBits, false>, 1, &f16_sum_);
    MPI_Op_create(&reduce16<halfBitsToFloat, floatToHalfBits, true>, 1, &f16_max_);
  }
  int provided_ = MPI_THREAD_SINGLE;
  MPI_Op bf16_sum_{}, bf16_max_{}, f16_sum_{}, f16_max_{};
};

// Aborts the job when a blocking MPI call that cannot be polled (creating a team's
// communicator, which every member must join) has not returned within the timeout. Waits on
// non-blocking operations poll and check the clock themselves (MpiWork::wait).
class Watchdog {
 public:
  Watchdog(double timeout_s, std::function<void(const std::string&)> on_expiry)
      : timeout_s_(timeout_s), on_expiry_(std::move(on_expiry)) {
    if (timeout_s_ > 0) thread_ = std::thread([this] { loop(); });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  // Runs `blocking` under the watchdog.
  template <typename F>
  auto guard(const std::string& what, F&& blocking) {
    if (timeout_s_ <= 0) return blocking();
    {
      std::lock_guard<std::mutex> lk(mu_);
      armed_ = true;
      what_ = what;
      deadline_ = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                         std::chrono::duration<double>(timeout_s_));
    }
    cv_.notify_all();
    auto disarm = [this] {
      std::lock_guard<std::mutex> lk(mu_);
      armed_ = false;
    };
    try {
      auto result = blocking();
      disarm();
      return result;
    } catch (...) {
      disarm();
      throw;
    }
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
      if (armed_ && std::chrono::steady_clock::now() > deadline_) {
        std::string what = what_;
        lk.unlock();
        on_expiry_(
            fmt::format("{} did not complete within {} s (MESHFUSE_COMM_TIMEOUT): a peer rank failed, hangs, "
                        "or runs a different program",
                        what, timeout_s_));
        lk.lock();
      }
      cv_.wait_for(lk, std::chrono::milliseconds(100));
    }
  }

  double timeout_s_;
  std::function<void(const std::string&)> on_expiry_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, armed_ = false;
  std::string what_;
  std::chrono::steady_clock::time_point deadline_;
  std::thread thread_;
};

class MpiWork;

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(double timeout_s)
      : process_(MpiProcess::get()),
        timeout_s_(timeout_s),
        watchdog_(timeout_s, [this](const std::string& why) { abort(why); }) {
    int r = 0, n = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    rank_ = r;
    size_ = n;
    // A private copy of the world for the whole-world team, so that our collectives never
    // interleave with the application's own on MPI_COMM_WORLD (mpi4py, a trainer).
    MPI_Comm world = MPI_COMM_NULL;
    watchdog_.guard("creating meshfuse's world communicator (MPI_Comm_dup)",
                    [&] { return MPI_Comm_dup(MPI_COMM_WORLD, &world); });
    MPI_Comm_set_errhandler(world, MPI_ERRORS_RETURN);
    createProgressBoard(world);
    everyone_.resize(size_);
    for (int64_t i = 0; i < size_; ++i) everyone_[i] = i;
    comms_.emplace(everyone_, world);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (board_win_ != MPI_WIN_NULL) {
      MPI_Win_unlock_all(board_win_);
      MPI_Win_free(&board_win_);
    }
    for (auto& [team, comm] : comms_) MPI_Comm_free(&comm);
  }

  std::string name() const override { return "mpi"; }
  int64_t rank() const override { return rank_; }
  int64_t size() const override { return size_; }

  std::unique_ptr<Work> allgatherv(const void* send, void* recv, const Counts& counts, DataType dt,
                                   const Team& team) override {
    MPI_Comm c = commOf("allgather", team, -1);
    checkCounts("allgather", counts, team);
    const int me = indexIn(team, rank_);
    if (equalCounts(counts)) {
      return issue("allgather", team, [&](MPI_Request* r) {
        return MPI_Iallgather(send, toInt(counts[me]), type(dt), recv, toInt(counts[me]), type(dt), c, r);
      });
    }
    auto v = std::make_shared<VCounts>(counts);
    return issue(
        "allgatherv", team,
        [&](MPI_Request* r) {
          return MPI_Iallgatherv(send, v->counts[me], type(dt), recv, v->counts.data(), v->displs.data(), type(dt), c,
                                 r);
        },
        v);
  }
  std::unique_ptr<Work> reduceScatterv(const void* send, void* recv, const Counts& counts, DataType dt, ReduceOp op,
                                       const Team& team) override {
    MPI_Comm c = commOf("reduce_scatter", team, -1);
    checkCounts("reduce_scatter", counts, team);
    if (equalCounts(counts)) {
      return issue("reduce_scatter", team, [&](MPI_Request* r) {
        return MPI_Ireduce_scatter_block(send, recv, toInt(counts[0]), type(dt), mpiOp(dt, op), c, r);
      });
    }
    auto v = std::make_shared<VCounts>(counts);
    return issue(
        "reduce_scatterv", team,
        [&](MPI_Request* r) {
          return MPI_Ireduce_scatter(send, recv, v->counts.data(), type(dt), mpiOp(dt, op), c, r);
        },
        v);
  }
  std::unique_ptr<Work> allreduce(const void* send, void* recv, int64_t count, DataType dt, ReduceOp op,
                                  const Team& team) override {
    MPI_Comm c = commOf("allreduce", team, -1);
    return issue("allreduce", team, [&](MPI_Request* r) {
      return MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, toInt(count), type(dt), mpiOp(dt, op), c, r);
    });
  }
  std::unique_ptr<Work> allToAllv(const void* send, const Counts& send_counts, void* recv, const Counts& recv_counts,
                                  DataType dt, const Team& team) override {
    MPI_Comm c = commOf("all_to_all", team, -1);
    checkCounts("all_to_all", send_counts, team);
    checkCounts("all_to_all", recv_counts, team);
    // Always the v-form: unlike an allgather's or reduce-scatter's, these counts are this rank's
    // own, so one rank of an uneven exchange may see uniform counts (all zero, say) while its
    // peers do not, and MPI_Ialltoall against peers' MPI_Ialltoallv is a mismatched collective.
    auto sv = std::make_shared<VCounts>(send_counts);
    auto rv = std::make_shared<VCounts>(recv_counts);
    return issue(
        "all_to_allv", team,
        [&](MPI_Request* r) {
          return MPI_Ialltoallv(send, sv->counts.data(), sv->displs.data(), type(dt), recv, rv->counts.data(),
                                rv->displs.data(), type(dt), c, r);
        },
        std::make_shared<std::pair<std::shared_ptr<VCounts>, std::shared_ptr<VCounts>>>(sv, rv));
  }
  std::unique_ptr<Work> broadcast(void* buf, int64_t count, DataType dt, int64_t root, const Team& team) override {
    MPI_Comm c = commOf("broadcast", team, root);
    int root_index = indexIn(team, root);
    return issue("broadcast", team,
                 [&](MPI_Request* r) { return MPI_Ibcast(buf, toInt(count), type(dt), root_index, c, r); });
  }
  std::unique_ptr<Work> reduce(const void* send, void* recv, int64_t count, DataType dt, ReduceOp op, int64_t root,
                               const Team& team) override {
    MPI_Comm c = commOf("reduce", team, root);
    int root_index = indexIn(team, root);
    bool in_place = send == recv && root == rank_;
    return issue("reduce", team, [&](MPI_Request* r) {
      return MPI_Ireduce(in_place ? MPI_IN_PLACE : send, recv, toInt(count), type(dt), mpiOp(dt, op), root_index, c, r);
    });
  }
  std::unique_ptr<Work> gatherv(const void* send, void* recv, const Counts& counts, DataType dt, int64_t root,
                                const Team& team) override {
    MPI_Comm c = commOf("gather", team, root);
    checkCounts("gather", counts, team);
    int root_index = indexIn(team, root);
    const int me = indexIn(team, rank_);
    if (equalCounts(counts)) {
      return issue("gather", team, [&](MPI_Request* r) {
        return MPI_Igather(send, toInt(counts[me]), type(dt), recv, toInt(counts[me]), type(dt), root_index, c, r);
      });
    }
    auto v = std::make_shared<VCounts>(counts);
    return issue(
        "gatherv", team,
        [&](MPI_Request* r) {
          return MPI_Igatherv(send, v->counts[me], type(dt), recv, v->counts.data(), v->displs.data(), type(dt),
                              root_index, c, r);
        },
        v);
  }
  std::unique_ptr<Work> scatterv(const void* send, void* recv, const Counts& counts, DataType dt, int64_t root,
                                 const Team& team) override {
    MPI_Comm c = commOf("scatter", team, root);
    checkCounts("scatter", counts, team);
    int root_index = indexIn(team, root);
    const int me = indexIn(team, rank_);
    if (equalCounts(counts)) {
      return issue("scatter", team, [&](MPI_Request* r) {
        return MPI_Iscatter(send, toInt(counts[me]), type(dt), recv, toInt(counts[me]), type(dt), root_index, c, r);
      });
    }
    auto v = std::make_shared<VCounts>(counts);
    return issue(
        "scatterv", team,
        [&](MPI_Request* r) {
          return MPI_Iscatterv(send, v->counts.data(), v->displs.data(), type(dt), recv, v->counts[me], type(dt),
                               root_index, c, r);
        },
        v);
  }
  std::unique_ptr<Work> send(const void* buf, int64_t count, DataType dt, int64_t peer, int64_t tag) override {
    checkPeer("send", peer);
    Team pair = {rank_, peer};
    MPI_Comm world = commOf("send", everyone(), -1);  // meshfuse's copy of the world: tags stay ours
    return issue("send", pair, [&](MPI_Request* r) {
      return MPI_Isend(buf, toInt(count), type(dt), static_cast<int>(peer), static_cast<int>(tag), world, r);
    });
  }
  std::unique_ptr<Work> recv(void* buf, int64_t count, DataType dt, int64_t peer, int64_t tag) override {
    checkPeer("recv", peer);
    Team pair = {peer, rank_};
    MPI_Comm world = commOf("recv", everyone(), -1);
    return issue("recv", pair, [&](MPI_Request* r) {
      return MPI_Irecv(buf, toInt(count), type(dt), static_cast<int>(peer), static_cast<int>(tag), world, r);
    });
  }
  void barrier() override {
    MPI_Comm c = commOf("barrier", everyone(), -1);
    issue("barrier", {}, [&](MPI_Request* r) { return MPI_Ibarrier(c, r); })->wait();
  }

  [[noreturn]] void abort(const std::string& reason) override { abortWith(reason, 0); }

  // A watchdog timeout: the peers blocked in the same collective time out at about the same
  // moment, so the job is aborted after a short grace period in which each can print its own
  // report (where it is blocked, who has not arrived) before MPI_Abort takes them down.
  [[noreturn]] void abortAfterTimeout(const std::string& what) {
    std::string where = WaitContext::describeCurrent();
    abortWith(fmt::format("{} did not complete within {} s (MESHFUSE_COMM_TIMEOUT): {}", what, timeout_s_,
                          where.empty() ? "a peer rank failed, hangs, or runs a different program" : where),
              std::min(2.0, timeout_s_));
  }

  void publishProgress(int64_t run, int64_t issued) override {
    if (board_ == nullptr) return;
    // Plain stores into this rank's window memory, read by peers' MPI_Get (osc/sm on one node
    // sees them at once; elsewhere the report is best effort, which is all a diagnosis needs).
    __atomic_store_n(&board_[0], run, __ATOMIC_RELAXED);
    __atomic_store_n(&board_[1], issued, __ATOMIC_RELEASE);
  }

  std::map<int64_t, std::pair<int64_t, int64_t>> peerProgress() override {
    if (board_win_ == MPI_WIN_NULL) return {};
    // On a thread of its own with a deadline: a dead peer's memory may never answer over a
    // network transport, and the caller is on its way to aborting the job.
    struct Read {
      std::vector<int64_t> values;
      std::promise<void> done;
    };
    auto read = std::make_shared<Read>();
    read->values.assign(2 * size_, -1);
    std::future<void> done = read->done.get_future();
    std::thread([this, read] {
      auto lk = lock();
      for (int64_t p = 0; p < size_; ++p)
        MPI_Get(&read->values[2 * p], 2, MPI_INT64_T, static_cast<int>(p), 0, 2, MPI_INT64_T, board_win_);
      MPI_Win_flush_all(board_win_);
      read->done.set_value();
    }).detach();
    if (done.wait_for(std::chrono::seconds(2)) != std::future_status::ready) return {};
    std::map<int64_t, std::pair<int64_t, int64_t>> out;
    for (int64_t p = 0; p < size_; ++p) out[p] = {read->values[2 * p], read->values[2 * p + 1]};
    return out;
  }

  // Used by MpiWork.
  std::unique_lock<std::mutex> lock() {
    return process_.threadMultiple() ? std::unique_lock<std::mutex>() : std::unique_lock<std::mutex>(mu_);
  }
  double timeoutSeconds() const { return timeout_s_; }

 private:
  // Counts and displacements as MPI's v-collectives take them (int), kept alive until the
  // operation completes: a non-blocking v-collective reads them while it runs.
  struct VCounts {
    std::vector<int> counts, displs;
    explicit VCounts(const Counts& c) {
      int64_t offset = 0;
      for (int64_t n : c) {
        counts.push_back(toInt(n));
        displs.push_back(toInt(offset));
        offset += n;
      }
      toInt(offset);  // the whole buffer is indexed by int displacements
    }
  };

  // Starts an operation; `keep` (the arrays it reads) lives as long as its Work.
  template <typename Start>
  std::unique_ptr<Work> issue(const char* what, const Team& team, Start&& start, std::shared_ptr<void> keep = nullptr);

  MPI_Datatype type(DataType dt) const { return process_.type(dt).type; }
  MPI_Op mpiOp(DataType dt, ReduceOp op) const {
    MpiType t = process_.type(dt);
    return op == ReduceOp::Max ? t.max : t.sum;
  }
  static int toInt(int64_t count) {
    MF_USER_CHECK(count >= 0 && count <= INT32_MAX, ErrorKind::Unsupported,
                  "a single MPI message of {} elements exceeds MPI's 2^31 - 1 element limit", count);
    return static_cast<int>(count);
  }
  const Team& everyone() const { return everyone_; }
  static int indexIn(const Team& team, int64_t rank) {
    return static_cast<int>(std::find(team.begin(), team.end(), rank) - team.begin());
  }
  void checkPeer(const char* what, int64_t peer) const {
    MF_USER_CHECK(peer >= 0 && peer < size_ && peer != rank_, ErrorKind::Runtime,
                  "{}: peer rank {} is not another rank of this world of {} ranks (this is rank {})", what, peer, size_,
                  rank_);
  }

  // The sub-communicator of `team`; created on first use by the team's members only.
  MPI_Comm commOf(const char* what, const Team& team, int64_t root) {
    checkTeamAndRoot(what, team, root, rank_, size_);
    // The map has its own lock: with MPI_THREAD_MULTIPLE, lock() serializes nothing, and stream
    // threads and the Python thread may look up teams at once.
    std::lock_guard<std::mutex> map_lock(comms_mu_);
    auto it = comms_.find(team);
    if (it != comms_.end()) return it->second;
    auto lk = lock();
    // Children of meshfuse's own copy of the world, so that they never race with another
    // communicator's (or the application's) group creations on MPI_COMM_WORLD.
    MPI_Comm parent = comms_.at(everyone_);
    MPI_Group parent_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
    MPI_Comm_group(parent, &parent_group);
    std::vector<int> ranks(team.begin(), team.end());
    MPI_Group_incl(parent_group, static_cast<int>(ranks.size()), ranks.data(), &group);
    MPI_Comm comm = MPI_COMM_NULL;
    int rc = watchdog_.guard(fmt::format("creating the communicator of team [{}] for {}", fmt::join(team, ", "), what),
                             [&] { return MPI_Comm_create_group(parent, group, /*tag=*/0, &comm); });
    MPI_Group_free(&group);
    MPI_Group_free(&parent_group);
    MF_USER_CHECK(rc == MPI_SUCCESS && comm != MPI_COMM_NULL, ErrorKind::Runtime,
                  "{}: creating the communicator of team [{}] failed (MPI error {})", what, fmt::join(team, ", "), rc);
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    comms_.emplace(team, comm);
    return comm;
  }

  [[noreturn]] void abortWith(const std::string& reason, double grace_s) {
    std::cerr << fmt::format(
                     "meshfuse: rank {} of {} fails: {}\nmeshfuse: aborting every rank (MPI_Abort) so that no "
                     "peer waits forever\n",
                     rank_, size_, reason)
              << std::flush;
    if (grace_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(grace_s));
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);  // MPI_Abort does not return; this is for the compiler
  }

  // One window over meshfuse's world: two int64 per rank (run, communications issued), locked
  // for the communicator's lifetime so that reads need no peer's cooperation. Without one-sided
  // support (some transports) there is no board and the hang report says so.
  void createProgressBoard(MPI_Comm world) {
    void* base = nullptr;
    int rc = watchdog_.guard("creating the progress board (MPI_Win_allocate)", [&] {
      return MPI_Win_allocate(2 * sizeof(int64_t), sizeof(int64_t), MPI_INFO_NULL, world, &base, &board_win_);
    });
    if (rc != MPI_SUCCESS || board_win_ == MPI_WIN_NULL) {
      board_win_ = MPI_WIN_NULL;
      return;
    }
    MPI_Win_set_errhandler(board_win_, MPI_ERRORS_RETURN);
    board_ = static_cast<int64_t*>(base);
    board_[0] = board_[1] = 0;
    MPI_Win_lock_all(MPI_MODE_NOCHECK, board_win_);
  }

  MpiProcess& process_;
  double timeout_s_;
  MPI_Win board_win_ = MPI_WIN_NULL;
  int64_t* board_ = nullptr;
  Watchdog watchdog_;
  int64_t rank_ = 0, size_ = 1;
  std::mutex mu_;        // serializes MPI calls below MPI_THREAD_MULTIPLE (lock())
  std::mutex comms_mu_;  // guards comms_
  std::map<Team, MPI_Comm> comms_;
  Team everyone_;  // 0 .. size - 1
};

class MpiWork final : public Work {
 public:
  MpiWork(MpiCommunicator& comm, std::string what, std::shared_ptr<void> keep)
      : comm_(comm), what_(std::move(what)), keep_(std::move(keep)) {}
  MPI_Request* request() { return &req_; }

  void wait() override {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    for (int64_t spins = 0;; ++spins) {
      int done = 0;
      int rc = MPI_SUCCESS;
      {
        auto lk = comm_.lock();
        rc = MPI_Test(&req_, &done, MPI_STATUS_IGNORE);
      }
      MF_USER_CHECK(rc == MPI_SUCCESS, ErrorKind::Runtime, "{} failed on rank {} (MPI error {})", what_, comm_.rank(),
                    rc);
      if (done) return;
      // Check the watchdog now and then; yield so that oversubscribed ranks make progress.
      if (spins % 1024 == 0 && comm_.timeoutSeconds() > 0 &&
          std::chrono::duration<double>(Clock::now() - start).count() > comm_.timeoutSeconds())
        comm_.abortAfterTimeout(what_);
      std::this_thread::yield();
    }
  }

 private:
  MpiCommunicator& comm_;
  std::string what_;
  std::shared_ptr<void> keep_;  // what the operation reads while it runs (v-collectives' counts)
  MPI_Request req_ = MPI_REQUEST_NULL;
};

template <typename Start>
std::unique_ptr<Work> MpiCommunicator::issue(const char* what, const Team& team, Start&& start,
                                             std::shared_ptr<void> keep) {
  auto work =
      std::make_unique<MpiWork>(*this, fmt::format("{} on team [{}]", what, fmt::join(team, ", ")), std::move(keep));
  int rc = MPI_SUCCESS;
  {
    auto lk = lock();
    rc = start(work->request());
  }
  MF_USER_CHECK(rc == MPI_SUCCESS, ErrorKind::Runtime, "{} on team [{}] failed to start on rank {} (MPI error {})",
                what, fmt::join(team, ", "), rank_, rc);
  return work;
}

}  // namespace

void initializeMpi() { MpiProcess::get(); }

std::unique_ptr<Communicator> makeMpiCommunicator() {
  return std::make_unique<MpiCommunicator>(readRuntimeEnvironment().comm_timeout_s);
}

std::unique_ptr<Communicator> makeDefaultCommunicator() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized || readRuntimeEnvironment().launched_by_mpi) return makeMpiCommunicator();
  return makeSelfCommunicator();
}

}  // namespace meshfuse
