// What a GPU communicator demands of its callers, checked on CPUs under mpirun. NCCL
//  (1) takes device memory only: a host pointer is a crash or garbage on a GPU (on one GPU the
//      host-staged communicator passes host memory through and hides it);
//  (2) blocks the stream in a receive until the peer's matching send runs, so a receive and a
//      send issued as two calls on one stream deadlock a ring;
//  (3) creates a team's communicator with a handshake that blocks until every member joined,
//      so teams created in the order of first use can deadlock three or more ranks.
// NcclLikeCommunicator has these three properties over MPI, with FakeDeviceBackend's memory as
// "device memory" (host memory marked Device::Cuda, registered in an arena). Programs run on it
// must match single-device execution without a single host pointer reaching it, and the CLI's
// `run` (outputs gathered, timelines, exit code) must keep its own messages on its control
// communicator. Under the old evaluator and CLI these tests deadlocked (ended by the MPI
// watchdog) or recorded host pointers.
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <numeric>
#include <set>

#include "cli_common.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/ops.h"
#include "models.h"
#include "mpi_test_main.h"

namespace meshfuse::testing {
namespace {

// The "device memory" of this process: every buffer FakeDeviceBackend handed out and still alive.
class DeviceArena {
 public:
  void add(const void* p, size_t bytes) {
    std::lock_guard<std::mutex> lk(mu_);
    blocks_[static_cast<const char*>(p)] = bytes;
  }
  void remove(const void* p) {
    std::lock_guard<std::mutex> lk(mu_);
    blocks_.erase(static_cast<const char*>(p));
  }
  // Whether [p, p + bytes) lies inside one live block.
  bool contains(const void* p, size_t bytes) const {
    std::lock_guard<std::mutex> lk(mu_);
    auto c = static_cast<const char*>(p);
    auto it = blocks_.upper_bound(c);
    if (it == blocks_.begin()) return false;
    --it;
    return c >= it->first && c + bytes <= it->first + it->second;
  }

 private:
  mutable std::mutex mu_;
  std::map<const char*, size_t> blocks_;
};

// The CPU backend whose tensors are "device" tensors: Device::Cuda, in the arena. Uploads and
// downloads copy, as a GPU backend's do.
class FakeDeviceBackend final : public Backend {
 public:
  explicit FakeDeviceBackend(std::shared_ptr<DeviceArena> arena) : arena_(std::move(arena)) {}
  std::string name() const override { return "fake-device"; }
  Device device() const override { return Device::Cuda; }
  Tensor allocate(DataType dtype, const std::vector<int64_t>& shape) override {
    Tensor host = Tensor::empty(dtype, shape);
    const size_t bytes = std::max<size_t>(host.nbytes(), 1);
    void* p = std::malloc(bytes);
    arena_->add(p, bytes);
    std::shared_ptr<void> owner(p, [arena = arena_](void* q) {
      arena->remove(q);
      std::free(q);
    });
    return Tensor::wrap(p, dtype, shape, owner, Device::Cuda);
  }
  void runSegment(const Segment& seg, const std::vector<const Tensor*>& inputs, const std::vector<Tensor*>& outputs,
                  const ShapeFn& shape_of) override {
    inner_->runSegment(seg, inputs, outputs, shape_of);
  }
  void copy(Tensor& dst, const Tensor& src) override { inner_->copy(dst, src); }
  void accumulate(Tensor& dst, const Tensor& src) override { inner_->accumulate(dst, src); }
  Tensor upload(const Tensor& t) override {
    if (t.device() == Device::Cuda) return t;
    Tensor out = allocate(t.dtype(), t.shape());
    if (t.nbytes() > 0) std::memcpy(out.data(), t.data(), t.nbytes());
    return out;
  }
  Tensor download(const Tensor& t) override {
    if (t.device() != Device::Cuda) return t;
    Tensor out = Tensor::empty(t.dtype(), t.shape());
    if (t.nbytes() > 0) std::memcpy(out.data(), t.data(), t.nbytes());
    return out;
  }
  Streams& streams() override { return inner_->streams(); }

 private:
  std::shared_ptr<DeviceArena> arena_;
  std::unique_ptr<Backend> inner_ = makeCpuBackend();
};

class WorkGroup final : public Work {
 public:
  explicit WorkGroup(std::vector<std::unique_ptr<Work>> parts) : parts_(std::move(parts)) {}
  void wait() override {
    for (auto& p : parts_) p->wait();
  }

 private:
  std::vector<std::unique_ptr<Work>> parts_;
};

class DoneWork final : public Work {
 public:
  void wait() override {}
};

// NCCL's three properties (file comment) over an MPI communicator of its own.
class NcclLikeCommunicator final : public Communicator {
 public:
  // Host pointers it was handed; shared, so that they can be read after the communicator is gone.
  struct Violations {
    std::mutex mu;
    std::vector<std::string> list;
  };
  NcclLikeCommunicator(std::unique_ptr<Communicator> mpi, std::shared_ptr<DeviceArena> arena,
                       std::shared_ptr<Violations> violations = std::make_shared<Violations>())
      : mpi_(std::move(mpi)), arena_(std::move(arena)), violations_(std::move(violations)) {}

  std::vector<std::string> violations() const {
    std::lock_guard<std::mutex> lk(violations_->mu);
    return violations_->list;
  }

  std::string name() const override { return "nccl-like"; }
  int64_t rank() const override { return mpi_->rank(); }
  int64_t size() const override { return mpi_->size(); }

  std::unique_ptr<Work> allgatherv(const void* s, void* r, const Counts& n, DataType dt, const Team& team) override {
    device("allgather", s, n[index(team)], dt), device("allgather", r, total(n), dt);
    join(team);
    return mpi_->allgatherv(s, r, n, dt, team);
  }
  std::unique_ptr<Work> reduceScatterv(const void* s, void* r, const Counts& n, DataType dt, ReduceOp op,
                                       const Team& team) override {
    device("reduce_scatter", s, total(n), dt), device("reduce_scatter", r, n[index(team)], dt);
    join(team);
    return mpi_->reduceScatterv(s, r, n, dt, op, team);
  }
  std::unique_ptr<Work> allreduce(const void* s, void* r, int64_t n, DataType dt, ReduceOp op,
                                  const Team& team) override {
    device("allreduce", s, n, dt), device("allreduce", r, n, dt);
    join(team);
    return mpi_->allreduce(s, r, n, dt, op, team);
  }
  std::unique_ptr<Work> allToAllv(const void* s, const Counts& sn, void* r, const Counts& rn, DataType dt,
                                  const Team& team) override {
    device("all_to_all", s, total(sn), dt), device("all_to_all", r, total(rn), dt);
    join(team);
    return mpi_->allToAllv(s, sn, r, rn, dt, team);
  }
  std::unique_ptr<Work> broadcast(void* b, int64_t n, DataType dt, int64_t root, const Team& team) override {
    device("broadcast", b, n, dt);
    join(team);
    return mpi_->broadcast(b, n, dt, root, team);
  }
  std::unique_ptr<Work> reduce(const void* s, void* r, int64_t n, DataType dt, ReduceOp op, int64_t root,
                               const Team& team) override {
    device("reduce", s, n, dt);
    if (root == rank()) device("reduce", r, n, dt);
    join(team);
    return mpi_->reduce(s, r, n, dt, op, root, team);
  }
  std::unique_ptr<Work> gatherv(const void* s, void* r, const Counts& n, DataType dt, int64_t root,
                                const Team& team) override {
    device("gather", s, n[index(team)], dt);
    if (root == rank()) device("gather", r, total(n), dt);
    join(team);
    return mpi_->gatherv(s, r, n, dt, root, team);
  }
  std::unique_ptr<Work> scatterv(const void* s, void* r, const Counts& n, DataType dt, int64_t root,
                                 const Team& team) override {
    if (root == rank()) device("scatter", s, total(n), dt);
    device("scatter", r, n[index(team)], dt);
    join(team);
    return mpi_->scatterv(s, r, n, dt, root, team);
  }
  // A lone send or receive returns when the peer has matched it (a rendezvous: the receiver
  // acknowledges), as an NCCL kernel holds its stream until then.
  std::unique_ptr<Work> send(const void* b, int64_t n, DataType dt, int64_t peer, int64_t tag) override {
    device("send", b, n, dt);
    join({std::min(rank(), peer), std::max(rank(), peer)});
    mpi_->send(b, n, dt, peer, tag)->wait();
    int64_t ack = 0;
    mpi_->recv(&ack, 1, DataType::Int64, peer, tag + kAck)->wait();
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<Work> recv(void* b, int64_t n, DataType dt, int64_t peer, int64_t tag) override {
    device("recv", b, n, dt);
    join({std::min(rank(), peer), std::max(rank(), peer)});
    mpi_->recv(b, n, dt, peer, tag)->wait();
    int64_t ack = 1;
    mpi_->send(&ack, 1, DataType::Int64, peer, tag + kAck)->wait();
    return std::make_unique<DoneWork>();
  }
  // One group: both halves posted before either is waited for (ncclGroupStart/End).
  std::unique_ptr<Work> sendRecv(const void* s, int64_t sn, int64_t to, void* r, int64_t rn, int64_t from,
                                 DataType dt, int64_t tag, const Team& team) override {
    if (to >= 0) device("send_recv", s, sn, dt);
    if (from >= 0) device("send_recv", r, rn, dt);
    join(team);
    std::vector<std::unique_ptr<Work>> parts;
    int64_t ack_in = 0, ack_out = 1;
    if (from >= 0) parts.push_back(mpi_->recv(r, rn, dt, from, tag));
    if (to >= 0) parts.push_back(mpi_->send(s, sn, dt, to, tag));
    for (auto& p : parts) p->wait();
    parts.clear();
    if (from >= 0) parts.push_back(mpi_->send(&ack_out, 1, DataType::Int64, from, tag + kAck));
    if (to >= 0) parts.push_back(mpi_->recv(&ack_in, 1, DataType::Int64, to, tag + kAck));
    for (auto& p : parts) p->wait();
    return std::make_unique<DoneWork>();
  }
  void prepareTeams(const std::vector<Team>& teams) override {
    prepared_calls_ += 1;
    for (const Team& t : teams) join(t);
  }
  void barrier() override { mpi_->barrier(); }
  [[noreturn]] void abort(const std::string& reason) override { mpi_->abort(reason); }

  int64_t preparedCalls() const { return prepared_calls_; }

 private:
  static constexpr int64_t kAck = int64_t{1} << 24;
  int64_t index(const Team& t) const { return std::find(t.begin(), t.end(), rank()) - t.begin(); }
  static int64_t total(const Counts& n) { return std::accumulate(n.begin(), n.end(), int64_t{0}); }

  void device(const char* what, const void* p, int64_t count, DataType dt) {
    const size_t bytes = static_cast<size_t>(count) * static_cast<size_t>(dtypeSize(dt));
    if (p == nullptr || bytes == 0 || arena_->contains(p, bytes)) return;
    std::lock_guard<std::mutex> lk(violations_->mu);
    violations_->list.push_back(fmt::format("{}: {} bytes at {} are host memory, not device memory", what, bytes, p));
  }

  // A team's "communicator": on first use, a blocking handshake of its members.
  void join(const Team& team) {
    if (team.size() < 2) return;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (joined_.count(team)) return;
    }
    int64_t one = 1, all = 0;
    mpi_->allreduce(&one, &all, 1, DataType::Int64, ReduceOp::Sum, team)->wait();
    std::lock_guard<std::mutex> lk(mu_);
    joined_.insert(team);
  }

  std::unique_ptr<Communicator> mpi_;
  std::shared_ptr<DeviceArena> arena_;
  std::shared_ptr<Violations> violations_;
  std::mutex mu_;
  std::set<Team> joined_;
  std::atomic<int64_t> prepared_calls_{0};
};

// Runs `def` on the NCCL-like communicator and fake device memory; every rank gathers the
// (downloaded) outputs over the world communicator and compares them with the reference.
void expectMatchesOnFakeDevices(const Fusion& def, const std::vector<Ps>& placements, const SymbolBindings& sizes,
                                const ExecutorOptions& options, NcclLikeCommunicator& comm,
                                const std::shared_ptr<DeviceArena>& arena) {
  std::vector<Tensor> full;
  std::vector<ShardedTensor> inputs;
  for (size_t i = 0; i < def.inputs().size(); ++i) {
    full.push_back(Tensor::random(def.inputs()[i]->dtype(), def.inputs()[i]->evaluateShape(sizes), 50 + i));
    inputs.push_back({Tensor(), worldMesh(), placements.at(i)});
  }
  std::vector<Tensor> reference = evaluateReference(def, full);
  MultiDeviceExecutor exec(def.clone(), comm, std::make_unique<FakeDeviceBackend>(arena), options);
  const CompiledProgram& plan = exec.plan(inputs);
  for (size_t i = 0; i < inputs.size(); ++i) {
    inputs[i].global_shape = full[i].shape();
    inputs[i].local = shardForRank(plan.fusion->inputs()[i], full[i], worldRank());
  }
  std::vector<ShardedTensor> outs = exec.run(inputs);
  Team everyone(worldSize());
  std::iota(everyone.begin(), everyone.end(), 0);
  for (size_t i = 0; i < outs.size(); ++i) {
    Tensor local = exec.backend().download(outs[i].local);
    Tensor all(local.dtype(), {worldSize() * std::max<int64_t>(local.numel(), 1)});
    world().allgather(local.data(), all.data(), local.numel(), local.dtype(), everyone)->wait();
    std::vector<Tensor> blocks;
    for (int64_t r = 0; r < worldSize(); ++r)
      blocks.push_back(all.slice0(r * local.numel(), local.numel()).reshaped(local.shape()));
    ReferenceComparison c = compareWithReference(assembleGlobal(plan.fusion->outputs()[i], blocks), reference[i]);
    EXPECT_TRUE(c.pass) << "output " << i << ": max abs err " << c.max_abs_err << ", allowed " << c.allowed_abs;
  }
  EXPECT_THAT(comm.violations(), ::testing::IsEmpty());
}

// A ring (sequence-parallel MLP, --overlap=ring): every rank receives from its left while it
// sends to its right. Issued as a receive and then a send, NCCL-like blocking deadlocks it, and
// with three or more ranks so does creating each pair's communicator at its first use.
MPI_TEST(DeviceTransport, RingExchangesRunAsOneGroupOnPreparedTeams, atLeast(2, "a ring needs two ranks")) {
  auto arena = std::make_shared<DeviceArena>();
  NcclLikeCommunicator comm(makeMpiCommunicator(), arena);
  Fusion f;
  models::buildMlp(f, 24);  // 4h = 96: sharded evenly on 1 to 4 ranks
  ExecutorOptions o;
  o.pipeline.overlap.algorithm = parseOverlapAlgorithm("ring");
  o.pipeline.overlap.chunks = worldSize();
  expectMatchesOnFakeDevices(f, {{S(0)}, {S(0)}, {S(1)}}, {{"s0", 16 * worldSize()}}, o, comm, arena);
  EXPECT_EQ(comm.preparedCalls(), 1) << "the program's teams are prepared once, before its first communication";
}

// A traced run starts with a barrier of the program's ranks: on the data communicator, so on
// device memory.
MPI_TEST(DeviceTransport, TracedRunsBarrierOnDeviceMemory, atLeast(2, "no barrier on one rank")) {
  auto arena = std::make_shared<DeviceArena>();
  NcclLikeCommunicator comm(makeMpiCommunicator(), arena);
  Fusion f;
  models::buildMlp(f, 24);  // 4h = 96: sharded evenly on 1 to 4 ranks
  ExecutorOptions o;
  o.trace = true;
  expectMatchesOnFakeDevices(f, {{R}, {S(0)}, {S(1)}}, {{"s0", 32}}, o, comm, arena);
}

// communicationTeams: what prepareTeams receives, sorted, every collective's team and for
// point-to-point the program's ranks.
MPI_TEST(DeviceTransport, ProgramTeamsAreSortedAndCoverThePointToPointExchanges, atLeast(2, "no team on one rank")) {
  Fusion f;
  models::buildMlp(f, 24);  // 4h = 96: sharded evenly on 1 to 4 ranks
  ExecutorOptions o;
  o.pipeline.overlap.algorithm = parseOverlapAlgorithm("ring");
  o.pipeline.overlap.chunks = worldSize();
  MultiDeviceExecutor exec(f.clone(), world(), nullptr, o);
  std::vector<ShardedTensor> inputs = {{Tensor(), worldMesh(), {S(0)}}, {Tensor(), worldMesh(), {S(0)}},
                                       {Tensor(), worldMesh(), {S(1)}}};
  for (size_t i = 0; i < inputs.size(); ++i) {
    inputs[i].global_shape = f.inputs()[i]->evaluateShape({{"s0", 16 * worldSize()}});
  }
  exec.plan(inputs);
  Team everyone(worldSize());
  std::iota(everyone.begin(), everyone.end(), 0);
  std::vector<Team> teams = communicationTeams(exec.programFor(inputs), everyone);
  EXPECT_TRUE(std::is_sorted(teams.begin(), teams.end()));
  EXPECT_THAT(teams, ::testing::Contains(everyone)) << "the ring's exchanges use the program's team";
}

// The examples that run on this many ranks, the way their header comments launch them.
std::vector<std::pair<std::string, std::vector<std::string>>> examplesFor(int64_t world) {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  if (world == 1) out.push_back({"mlp_block.mf", {}});
  if (world == 2) {
    out.push_back({"sp_mlp.mf", {"ring", "4"}});
    out.push_back({"fsdp_mlp.mf", {}});
  }
  if (world == 3) out.push_back({"pipeline_mlp.mf", {}});
  if (world == 4) {
    out.push_back({"decoder_layer.mf", {}});
    out.push_back({"tp_mlp.mf", {}});
  }
  return out;
}

// `meshfuse run --check --trace` with a device backend: the programs on the data communicator;
// outputs (downloaded), timelines and the exit code on the control communicator.
TEST(DeviceTransport, CliRunKeepsItsHostMessagesOnTheControlCommunicator) {
  const auto examples = examplesFor(worldSize());
  ASSERT_FALSE(examples.empty()) << "no example runs on " << worldSize() << " ranks";
  for (const auto& [file, overlap] : examples) {
    SCOPED_TRACE(file);
    std::ifstream in(std::string(MESHFUSE_SOURCE_DIR) + "/examples/" + file);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    std::unique_ptr<Fusion> def = parseFusion(text, file);
    auto arena = std::make_shared<DeviceArena>();
    auto violations = std::make_shared<NcclLikeCommunicator::Violations>();
    cli::RunEnvironment env;
    env.control = [] { return makeMpiCommunicator(); };
    env.backend = [arena](const std::string&) { return std::make_unique<FakeDeviceBackend>(arena); };
    env.data = [&](const Backend&) -> std::unique_ptr<Communicator> {
      return std::make_unique<NcclLikeCommunicator>(makeMpiCommunicator(), arena, violations);
    };
    cli::ShardedRunOptions o;
    for (const TensorView* tv : def->inputs())  // (a size the fusion lacks is a user error)
      for (const Extent& e : tv->shape())
        if (!e.isStatic()) o.sizes[e.symbol()] = 64;
    o.check = true;
    o.device = "cuda";
    o.trace_file = (std::filesystem::temp_directory_path() / fmt::format("meshfuse-device-transport-{}.json",
                                                                          ::getpid()))
                       .string();
    if (!overlap.empty()) {
      o.pipeline.overlap.algorithm = parseOverlapAlgorithm(overlap[0]);
      o.pipeline.overlap.chunks = std::stoll(overlap[1]);
    }
    const int rc = cli::runSharded(*def, o, env);
    EXPECT_EQ(rc, 0);
    EXPECT_THAT(violations->list, ::testing::IsEmpty());
    if (worldRank() == 0) std::filesystem::remove(o.trace_file);
  }
}

}  // namespace
}  // namespace meshfuse::testing
