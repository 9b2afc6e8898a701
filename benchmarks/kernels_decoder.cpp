// A GPT decoder layer (examples/models.cpp) on one rank, one thread:
//   cold compile  the pipeline (propagation ... host IR) plus the CPU backend lowering, JIT
//                 compiling and caching every kernel on the first run (a fresh backend)
//   dispatch      host time of a cached run beyond the kernels: the run's wall time minus the
//                 time spent inside Backend::runSegment (measured by a forwarding backend);
//                 and the whole run at a tiny shape, where the kernels themselves take almost
//                 nothing (so it bounds everything the host does per layer, dispatch included)
//   build/benchmarks/kernels_decoder [BATCH SEQ HIDDEN HEADS]
#include "kernels_common.h"
#include "meshfuse/executor.h"
#include "models.h"

using namespace meshfuse;

namespace {

// Forwards to the CPU backend and adds up the time spent in runSegment.
class Timed final : public Backend {
 public:
  std::string name() const override { return inner_->name(); }
  Tensor allocate(DataType dt, const std::vector<int64_t>& shape) override { return inner_->allocate(dt, shape); }
  void runSegment(const Segment& seg, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out,
                  const ShapeFn& shape_of) override {
    auto start = std::chrono::steady_clock::now();
    inner_->runSegment(seg, in, out, shape_of);
    inside += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ++launches;
  }
  Stats stats() const override { return inner_->stats(); }
  double inside = 0;
  int64_t launches = 0;

 private:
  std::unique_ptr<Backend> inner_ = makeCpuBackend();
};

struct Layer {
  std::unique_ptr<Communicator> comm = makeSelfCommunicator();
  Timed* backend = nullptr;
  std::unique_ptr<MultiDeviceExecutor> exec;
  std::vector<ShardedTensor> inputs;
};

Layer makeLayer(const models::DecoderShape& s) {
  Layer l;
  auto f = std::make_unique<Fusion>();
  models::buildDecoderLayer(*f, s);
  DeviceMesh one({0});
  uint64_t seed = 1;
  for (const TensorView* tv : f->inputs()) {
    std::vector<int64_t> shape;
    for (const Extent& e : tv->shape()) shape.push_back(e.value());
    l.inputs.push_back({Tensor::random(DataType::Float, shape, seed++), one, {Placement::replicate()}});
  }
  auto backend = std::make_unique<Timed>();
  l.backend = backend.get();
  l.exec = std::make_unique<MultiDeviceExecutor>(std::move(f), *l.comm, std::move(backend));
  return l;
}

}  // namespace

int main(int argc, char** argv) {
  bench::singleThreaded();
  models::DecoderShape s{.batch = 4, .seq = 128, .hidden = 512, .heads = 8};
  if (argc > 4) s = {std::stoll(argv[1]), std::stoll(argv[2]), std::stoll(argv[3]), std::stoll(argv[4])};
  fmt::print("# decoder layer b={} s={} h={} heads={} (pre-norm, causal sdpa), f32, 1 thread\n", s.batch, s.seq,
             s.hidden, s.heads);
  fmt::print("# {}\n", bench::machine());

  Layer l = makeLayer(s);
  auto t0 = std::chrono::steady_clock::now();
  l.exec->plan(l.inputs);
  auto t1 = std::chrono::steady_clock::now();
  l.exec->run(l.inputs);
  auto t2 = std::chrono::steady_clock::now();
  const Backend::Stats cold = l.backend->stats();
  const double pipeline = std::chrono::duration<double>(t1 - t0).count();
  const double first_run = std::chrono::duration<double>(t2 - t1).count();
  fmt::print("| measurement | value |\n|---|---|\n");
  fmt::print("| cold compile: pipeline passes + host IR | {:.1f} ms |\n", pipeline * 1e3);
  fmt::print("| cold compile: {} kernels lowered, JIT-compiled, cached (first run) | {:.1f} ms |\n",
             cold.kernels_compiled, cold.compile_seconds * 1e3);
  fmt::print("| cold compile total (target <= 1 s) | {:.1f} ms |\n", (pipeline + cold.compile_seconds) * 1e3);
  fmt::print("| first run, wall (compiles and runs) | {:.1f} ms |\n", first_run * 1e3);

  const int iters = 20;
  std::vector<double> wall, beyond;
  for (int i = 0; i < iters; ++i) {
    l.backend->inside = 0;
    l.backend->launches = 0;
    auto a = std::chrono::steady_clock::now();
    l.exec->run(l.inputs);
    double w = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
    wall.push_back(w);
    beyond.push_back(w - l.backend->inside);
  }
  std::sort(wall.begin(), wall.end());
  std::sort(beyond.begin(), beyond.end());
  MF_CHECK(l.backend->stats().kernels_compiled == cold.kernels_compiled, "a cached run compiled kernels");
  fmt::print("| cached run, wall ({} segment launches) | {:.3f} ms |\n", l.backend->launches, wall[iters / 2] * 1e3);
  fmt::print("| cached run, host time outside runSegment (target <= 20 us) | {:.1f} us |\n", beyond[iters / 2] * 1e6);

  Layer tiny = makeLayer({.batch = 1, .seq = 2, .hidden = 8, .heads = 2});
  tiny.exec->run(tiny.inputs);
  const double tiny_run = bench::medianSeconds([&] { tiny.exec->run(tiny.inputs); }, 200, 5);
  tiny.backend->inside = 0;
  tiny.exec->run(tiny.inputs);
  fmt::print("| cached run of a tiny layer (b=1 s=2 h=8): everything the host does, kernels included | {:.1f} us |\n",
             tiny_run * 1e6);
  fmt::print("| ... of which inside runSegment (dispatch + tiny kernels) | {:.1f} us |\n", tiny.backend->inside * 1e6);
  return 0;
}
