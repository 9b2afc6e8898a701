// Host-IR interpreter overhead per instruction on tiny tensors (goal: <= 1 us per node).
// A chain of 200 GEMMs on [1, 1] tensors (each its own segment: pointwise chains would fuse into
// one kernel) runs through MultiDeviceExecutor, the path of the CLI and Python; its host program
// allocates, launches and frees per op (~600 nodes). The backend either does no work at all (pure
// interpreter cost) or is the real CPU backend (cblas on 1x1 matrices). Counters report the time
// per host-IR node, the whole run (cache lookup, size binding, outputs) divided by the nodes.
#include <benchmark/benchmark.h>

#include "meshfuse/executor.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/ops.h"
#include "models.h"
#include "lower/host_ir.h"
#include "runtime/backend.h"

using namespace meshfuse;

namespace {

constexpr int kOps = 200;

// Every node of a host program, loop bodies included.
int64_t countNodes(const std::vector<HostNode>& nodes) {
  int64_t n = 0;
  forEachNode(nodes, [&](const HostNode&) { ++n; });
  return n;
}

void perNode(benchmark::State& state, const HostProgram& program) {
  const int64_t nodes = countNodes(program.nodes);
  state.counters["nodes"] = static_cast<double>(nodes);
  // Seconds per node (printed with an SI prefix: "590n" is 590 ns).
  state.counters["time_per_node"] = benchmark::Counter(
      static_cast<double>(nodes), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// Allocates and does nothing else: what remains is the interpreter's own cost.
class NoWorkBackend final : public Backend {
 public:
  std::string name() const override { return "no-work"; }
  Tensor allocate(DataType dt, const std::vector<int64_t>& shape) override { return Tensor::empty(dt, shape); }
  void runSegment(const Segment&, const std::vector<const Tensor*>&, const std::vector<Tensor*>&,
                  const ShapeFn&) override {}
};

void run(benchmark::State& state, std::unique_ptr<Backend> backend) {
  auto f = std::make_unique<Fusion>();
  TensorView* x = f->defineTensor({1, 1}, DataType::Float, "x");
  TensorView* w = f->defineTensor({1, 1}, DataType::Float, "w");
  for (int i = 0; i < kOps; ++i) x = ops::linear(x, w);
  f->addOutput(x);
  std::unique_ptr<Communicator> comm = makeSelfCommunicator();
  MultiDeviceExecutor exec(std::move(f), *comm, std::move(backend));
  DeviceMesh one({0});
  std::vector<ShardedTensor> in = {{Tensor(DataType::Float, {1, 1}), one, {Placement::replicate()}},
                                   {Tensor(DataType::Float, {1, 1}), one, {Placement::replicate()}}};
  for (auto _ : state) benchmark::DoNotOptimize(exec.run(in));
  perNode(state, exec.programFor(in));
}

void BM_InterpreterOnly(benchmark::State& state) { run(state, std::make_unique<NoWorkBackend>()); }

// A cached dispatch of a whole decoder layer through MultiDeviceExecutor::run (cache lookup,
// size binding, every node, output collection) with no kernel work: the host time a layer costs
// beyond its kernels.
void BM_DecoderLayerDispatch(benchmark::State& state) {
  auto f = std::make_unique<Fusion>();
  models::buildDecoderLayer(*f, {.batch = 2, .seq = 16, .hidden = 64, .heads = 8});
  std::unique_ptr<Communicator> comm = makeSelfCommunicator();
  std::vector<ShardedTensor> in;
  DeviceMesh mesh({0});
  for (const TensorView* tv : f->inputs()) {
    std::vector<int64_t> shape;
    for (const Extent& e : tv->shape()) shape.push_back(e.value());
    in.push_back({Tensor(DataType::Float, shape), mesh, {Placement::replicate()}});
  }
  MultiDeviceExecutor exec(std::move(f), *comm, std::make_unique<NoWorkBackend>());
  for (auto _ : state) benchmark::DoNotOptimize(exec.run(in));
  perNode(state, exec.programFor(in));
}
void BM_CpuBackend(benchmark::State& state) { run(state, makeCpuBackend()); }

}  // namespace

BENCHMARK(BM_InterpreterOnly)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecoderLayerDispatch)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CpuBackend)->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
