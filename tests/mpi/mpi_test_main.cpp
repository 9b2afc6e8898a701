// main() of the multi-rank tests: MPI initialized as the runtime needs it (initializeMpi():
// MPI_Init_thread, since stream threads call MPI) and finalized around GoogleTest (gtest_main
// never finalizes MPI), and only rank 0 prints test progress so the log stays readable.
#define OMPI_SKIP_MPICXX 1
#include "mpi_test_main.h"

#include <mpi.h>

#include <fnmatch.h>

#include <cmath>
#include <cstring>
#include <map>

#include "meshfuse/ir/parser.h"
#include "lower/pipeline.h"
#include "runtime/backend.h"

namespace meshfuse::testing {
namespace {
std::unique_ptr<Communicator> g_world;
}

Communicator& world() { return *g_world; }

ShardedRun runSharded(const Fusion& definition, const std::vector<std::pair<DeviceMesh, Ps>>& layouts,
                      const SymbolBindings& sizes, const ExecutorOptions& options, std::unique_ptr<Backend> backend) {
  ShardedRun run;
  std::vector<ShardedTensor> inputs;
  for (size_t i = 0; i < definition.inputs().size(); ++i) {
    const TensorView* tv = definition.inputs()[i];
    std::vector<int64_t> shape;
    for (const Extent& e : tv->shape()) shape.push_back(e.evaluate(sizes));
    run.full_inputs.push_back(Tensor::random(tv->dtype(), shape, 100 + i));
    inputs.push_back({Tensor(), layouts.at(i).first, layouts.at(i).second});
  }
  run.reference = evaluateReference(definition, run.full_inputs);
  MultiDeviceExecutor exec(definition.clone(), world(), std::move(backend), options);
  const CompiledProgram& plan = exec.plan(inputs);
  run.compiled = plan.fusion;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorView* tv = plan.fusion->inputs()[i];
    inputs[i].global_shape = run.full_inputs[i].shape();
    if (tv->mesh()->contains(worldRank())) inputs[i].local = shardForRank(tv, run.full_inputs[i], worldRank());
  }
  run.local_outputs = exec.run(inputs);
  run.collectives = exec.lastCollectives();
  run.reported = collectives(exec.programFor(inputs), sizes);
  run.peak_estimate = peakMemoryBytes(exec.programFor(inputs), sizes);
  for (const ShardedTensor& in : inputs) run.input_bytes += in.local.defined() ? in.local.nbytes() : 0;
  run.trace = exec.lastTrace();
  // Gather every output's blocks on every rank (uneven shards: blocks of different shapes).
  for (size_t i = 0; i < run.local_outputs.size(); ++i) {
    const TensorView* tv = plan.fusion->outputs()[i];
    run.gathered.push_back(assembleGlobal(tv, everyRanksBlock(run.local_outputs[i].local, tv->rank(), tv->dtype())));
  }
  return run;
}

std::vector<Tensor> everyRanksBlock(const Tensor& given, int64_t dims, DataType dtype) {
  Team everyone(worldSize());
  std::iota(everyone.begin(), everyone.end(), 0);
  // A rank that holds no block (outside the tensor's mesh) sends an empty one.
  const Tensor local = given.defined() ? given : Tensor(dtype, std::vector<int64_t>(dims, 0));
  const int64_t n = worldSize();
  std::vector<int64_t> shapes(static_cast<size_t>(n * dims));
  world().allgather(local.shape().data(), shapes.data(), dims, DataType::Int64, everyone)->wait();
  Counts counts;
  for (int64_t r = 0; r < n; ++r)
    counts.push_back(numel({shapes.begin() + r * dims, shapes.begin() + (r + 1) * dims}));
  Tensor all(local.dtype(), {std::max<int64_t>(std::accumulate(counts.begin(), counts.end(), int64_t{0}), 1)});
  world().allgatherv(local.data(), all.data(), counts, local.dtype(), everyone)->wait();
  std::vector<Tensor> blocks;
  int64_t at = 0;
  for (int64_t r = 0; r < n; ++r) {
    blocks.push_back(all.slice0(at, counts[r]).reshaped({shapes.begin() + r * dims, shapes.begin() + (r + 1) * dims}));
    at += counts[r];
  }
  return blocks;
}

std::vector<std::string> kinds(const std::vector<CollectiveInfo>& cs) {
  std::vector<std::string> out;
  for (const CollectiveInfo& c : cs) out.push_back(commKindName(c.kind));
  return out;
}

void expectMatchesReference(const ShardedRun& run) {
  ASSERT_EQ(run.gathered.size(), run.reference.size());
  for (size_t i = 0; i < run.reference.size(); ++i) {
    const Tensor& a = run.gathered[i];
    const Tensor& b = run.reference[i];
    ASSERT_EQ(a.shape(), b.shape()) << "output " << i;
    double rtol = b.dtype() == DataType::Float ? 1e-4 : 2e-2, atol = b.dtype() == DataType::Float ? 1e-4 : 2e-2;
    int64_t bad = 0;
    double worst = 0;
    for (int64_t k = 0; k < b.numel(); ++k) {
      double err = std::fabs(a.get(k) - b.get(k));
      if (err > atol + rtol * std::fabs(b.get(k))) ++bad;
      worst = std::max(worst, err);
    }
    EXPECT_EQ(bad, 0) << "output " << i << ": " << bad << " of " << b.numel()
                      << " elements differ from single-device execution; max abs err " << worst;
  }
}

Tensor CountingBackend::allocate(DataType dtype, const std::vector<int64_t>& shape) {
  Tensor t = inner_->allocate(dtype, shape);
  const auto bytes = static_cast<int64_t>(t.nbytes());
  const int64_t live = counts_->live += bytes;
  for (int64_t peak = counts_->peak; live > peak && !counts_->peak.compare_exchange_weak(peak, live);) {
  }
  // The returned tensor (and every view of it) shares an owner that gives the bytes back when the
  // last holder lets go; it keeps the inner buffer alive until then.
  std::shared_ptr<void> owner(new Tensor(t), [counts = counts_, bytes](void* p) {
    counts->live -= bytes;
    delete static_cast<Tensor*>(p);
  });
  return Tensor::wrap(t.data(), dtype, shape, owner, t.device());
}

void expectSameCollectives(const std::vector<CollectiveInfo>& reported, const std::vector<CollectiveInfo>& executed) {
  ASSERT_EQ(kinds(reported), kinds(executed));
  for (size_t i = 0; i < executed.size(); ++i) {
    SCOPED_TRACE(fmt::format("collective {}: {} {} -> {}", i, commKindName(executed[i].kind), executed[i].source,
                             executed[i].tensor));
    EXPECT_EQ(reported[i].bytes, executed[i].bytes);
    EXPECT_EQ(reported[i].padded_bytes, executed[i].padded_bytes);
    EXPECT_EQ(reported[i].team, executed[i].team);
    EXPECT_EQ(reported[i].mesh_axis, executed[i].mesh_axis);
    EXPECT_EQ(reported[i].root, executed[i].root);
    EXPECT_EQ(reported[i].source, executed[i].source);
    EXPECT_EQ(reported[i].tensor, executed[i].tensor);
    EXPECT_EQ(reported[i].provenance, executed[i].provenance);
  }
}

std::string errorOf(ErrorKind kind, const std::function<void()>& fn) {
  try {
    fn();
  } catch (const UserError& e) {
    EXPECT_EQ(e.kind(), kind) << e.message();
    return e.message();
  }
  ADD_FAILURE() << "expected a " << errorKindName(kind);
  return "";
}

namespace {
std::map<std::string, WorldSizes>& declaredWorldSizes() {
  static std::map<std::string, WorldSizes> sizes;
  return sizes;
}
}  // namespace

std::string WorldSizes::describe() const {
  std::string out = min == max ? fmt::format("needs {} ranks", min) : fmt::format("needs at least {} ranks", min);
  return why.empty() ? out : fmt::format("{} ({})", out, why);
}

bool declareWorldSizes(const char* test, WorldSizes sizes) {
  declaredWorldSizes()[test] = std::move(sizes);
  return true;
}

namespace {
// GoogleTest's filter syntax ("POSITIVE[-NEGATIVE]", ':'-separated globs) applied to "Suite.Name".
bool matchesFilter(const std::string& filter, const std::string& test) {
  const size_t dash = filter.find('-');
  auto any = [&](std::string patterns) {
    for (size_t at = 0; at <= patterns.size();) {
      size_t end = std::min(patterns.find(':', at), patterns.size());
      if (fnmatch(patterns.substr(at, end - at).c_str(), test.c_str(), 0) == 0) return true;
      at = end + 1;
    }
    return false;
  };
  std::string positive = filter.substr(0, dash);
  if (positive.empty()) positive = "*";
  return any(positive) && (dash == std::string::npos || !any(filter.substr(dash + 1)));
}

std::vector<std::string> allTests() {
  std::vector<std::string> out;
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  for (int i = 0; i < unit.total_test_suite_count(); ++i) {
    const ::testing::TestSuite& suite = *unit.GetTestSuite(i);
    for (int j = 0; j < suite.total_test_count(); ++j)
      out.push_back(std::string(suite.name()) + "." + suite.GetTestInfo(j)->name());
  }
  return out;
}

bool runsAt(const std::string& test, int64_t world_size) {
  auto it = declaredWorldSizes().find(test);
  return it == declaredWorldSizes().end() || it->second.accepts(world_size);
}

// `--world-coverage=N:FILTER,N:FILTER,...`, the launches ctest makes (world size and gtest filter):
// every test must run in one of them. Prints where each sized test runs; returns the exit code.
int checkWorldCoverage(const std::string& spec) {
  std::vector<std::pair<int64_t, std::string>> launches;
  for (size_t at = 0; at < spec.size();) {
    size_t end = std::min(spec.find(',', at), spec.size());
    const std::string launch = spec.substr(at, end - at);
    const size_t colon = launch.find(':');
    if (colon == std::string::npos) {
      std::fprintf(stderr, "--world-coverage: '%s' is not N:FILTER\n", launch.c_str());
      return 2;
    }
    launches.emplace_back(std::stoll(launch.substr(0, colon)), launch.substr(colon + 1));
    at = end + 1;
  }
  int uncovered = 0;
  const std::vector<std::string> tests = allTests();
  for (const std::string& test : tests) {
    std::vector<std::string> where;
    for (const auto& [n, filter] : launches)
      if (runsAt(test, n) && matchesFilter(filter, test)) where.push_back(fmt::format("np{} {}", n, filter));
    auto sized = declaredWorldSizes().find(test);
    if (where.empty()) {
      ++uncovered;
      std::printf("NOT RUN  %s: %s, and no launch gives it that\n", test.c_str(),
                  sized == declaredWorldSizes().end() ? "matches no launch's filter" : sized->second.describe().c_str());
    } else if (sized != declaredWorldSizes().end()) {
      std::printf("runs     %s in %s: %s\n", test.c_str(), fmt::format("{}", fmt::join(where, ", ")).c_str(),
                  sized->second.describe().c_str());
    }
  }
  std::printf("%zu tests, %zu of them at particular world sizes; %d run in none of the %zu launches\n", tests.size(),
              declaredWorldSizes().size(), uncovered, launches.size());
  return uncovered ? 1 : 0;
}

// Leaves the tests that need another world size out of this run (GoogleTest's filter), listing
// them on rank 0 so the log says what did not run here and why.
void filterByWorldSize(int64_t world_size, int rank) {
  const std::string filter = GTEST_FLAG_GET(filter);
  std::vector<std::string> left_out;
  for (const std::string& test : allTests())
    if (!runsAt(test, world_size) && matchesFilter(filter, test)) left_out.push_back(test);
  if (left_out.empty()) return;
  if (rank == 0) {
    std::printf("[ world %lld ] %zu tests need another world size and run in the launches that have it:\n",
                static_cast<long long>(world_size), left_out.size());
    for (const std::string& test : left_out)
      std::printf("[ not run  ] %s: %s\n", test.c_str(), declaredWorldSizes().at(test).describe().c_str());
  }
  const std::string negative = fmt::format("{}", fmt::join(left_out, ":"));
  GTEST_FLAG_SET(filter, filter + (filter.find('-') == std::string::npos ? "-" : ":") + negative);
}
}  // namespace

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  // (UnitTest::current_test_info() would deadlock inside OnTestPartResult: gtest holds its lock.)
  void OnTestStart(const ::testing::TestInfo& t) override { test_ = std::string(t.test_suite_name()) + "." + t.name(); }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s: %s:%d: %s\n", rank_, test_.c_str(), r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.message());
  }

 private:
  int rank_;
  std::string test_;
};

}  // namespace meshfuse::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i)  // no MPI: a check of the test list against ctest's launches
    if (std::strncmp(argv[i], "--world-coverage=", 17) == 0)
      return meshfuse::testing::checkWorldCoverage(argv[i] + 17);
  meshfuse::initializeMpi();
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  meshfuse::testing::filterByWorldSize(size, rank);
  if (rank != 0) {  // other ranks print only their failures, tagged with the rank
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new meshfuse::testing::FailurePrinter(rank));
  }
  int failed = 0;
  {
    meshfuse::testing::g_world = meshfuse::makeMpiCommunicator();
    failed = RUN_ALL_TESTS();
    meshfuse::testing::g_world.reset();
  }
  // Every rank's verdict counts: a failure on any rank fails the run.
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any_failed && !failed) std::fprintf(stderr, "rank %d passed, but another rank failed\n", rank);
  MPI_Finalize();
  return any_failed ? 1 : 0;
}
