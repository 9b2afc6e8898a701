// Fully sharded data parallelism (parameters gathered where used, freed after, prefetched one
// ahead) and pipeline parallelism (stages on different meshes, microbatches, MPMD programs).
#include "meshfuse/ir/parser.h"
#include "meshfuse/ops.h"
#include "mpi_test_main.h"

namespace meshfuse::testing {
namespace {

using ::testing::Each;
using ::testing::Eq;

// x [t, 32] -> linear(w0 [64, 32]) -> gelu -> linear(w1 [64, 64]) -> gelu -> linear(w2 [32, 64]).
void threeLayerMlp(Fusion& f) {
  TensorView* x = f.defineTensor({-1, 32}, DataType::Float, "x");
  TensorView* w0 = f.defineTensor({64, 32}, DataType::Float, "w0");
  TensorView* w1 = f.defineTensor({64, 64}, DataType::Float, "w1");
  TensorView* w2 = f.defineTensor({32, 64}, DataType::Float, "w2");
  TensorView* h = ops::gelu(ops::linear(x, w0), "tanh");
  h = ops::gelu(ops::linear(h, w1), "tanh");
  f.addOutput(ops::linear(h, w2));
}

TEST(Fsdp, ThreeLayerMlpGathersOneParameterPerLayerAndFreesIt) {
  Fusion f;
  threeLayerMlp(f);
  ExecutorOptions options;
  options.pipeline.propagation.gather_parameters = true;
  const int64_t t = 32 * worldSize();
  std::vector<std::pair<DeviceMesh, Ps>> layouts(4, {worldMesh(), Ps{S(0)}});
  auto counts = std::make_shared<MemoryCounts>();
  ShardedRun run = runSharded(f, layouts, {{"s0", t}}, options, std::make_unique<CountingBackend>(counts));
  expectMatchesReference(run);
  EXPECT_EQ(run.local_outputs[0].placements, Ps{S(0)}) << "activations keep their data-parallel sharding";
  if (worldSize() == 1) return;
  EXPECT_EQ(kinds(run.collectives), (std::vector<std::string>{"allgather", "allgather", "allgather"}));
  // Each gathered parameter is freed after its last use...
  MultiDeviceExecutor exec(f.clone(), world(), nullptr, options);
  std::vector<ShardedTensor> in;
  for (size_t i = 0; i < 4; ++i) in.push_back({Tensor(), worldMesh(), {S(0)}});
  in[0].local = Tensor(DataType::Float, {t / worldSize(), 32});
  const HostProgram& program = exec.programFor(in);
  std::vector<const TensorView*> gathered, freed;
  for (const HostNode& n : program.nodes) {
    if (const auto* c = n.as<hir::Communication>()) gathered.push_back(c->out.tv);
    if (const auto* d = n.as<hir::Deallocate>()) freed.push_back(d->tv);
  }
  for (const TensorView* g : gathered) EXPECT_NE(std::find(freed.begin(), freed.end(), g), freed.end());
  // ... so the peak is the issue's "params/N + one layer's gathered params + activations": every
  // parameter's shard and the input's, then, at the worst layer k, its gathered weight, the next
  // layer's (being prefetched: at most two are alive), and the activations its GEMM reads and
  // writes (layer 0 reads the input, already counted).
  const int64_t n = worldSize(), f32 = 4, rows = t / n;
  const std::vector<std::pair<int64_t, int64_t>> layers = {{32, 64}, {64, 64}, {64, 32}};  // (in, out) features
  auto gathered_bytes = [&](size_t k) { return k < layers.size() ? layers[k].first * layers[k].second * f32 : 0; };
  int64_t params = 0, worst_layer = 0, most_activations = 0;
  for (size_t k = 0; k < layers.size(); ++k) {
    params += gathered_bytes(k);
    const int64_t activations = (k > 0 ? rows * layers[k].first * f32 : 0) + rows * layers[k].second * f32;
    worst_layer = std::max(worst_layer, gathered_bytes(k) + gathered_bytes(k + 1) + activations);
    most_activations = std::max(most_activations, activations);
  }
  const int64_t shards = params / n + rows * 32 * f32;
  const int64_t peak = peakMemoryBytes(program, {{"s0", t}});
  EXPECT_EQ(peak, shards + worst_layer);
  EXPECT_LT(peak, shards + params + most_activations) << "less than holding every parameter whole";
  EXPECT_LE(run.input_bytes + counts->peak, run.peak_estimate) << "the run held more than the estimate";
  if (worldRank() == 0)
    std::printf("[ fsdp     ] peak %lld bytes = shards %lld + worst layer %lld (2 gathered weights, activations)\n",
                static_cast<long long>(peak), static_cast<long long>(shards), static_cast<long long>(worst_layer));
}

// Three MLP blocks (hidden h, 4h inside), one per stage {0}, {1}, {2}; the input split into 4
// microbatches.
std::unique_ptr<Fusion> threeStagePipeline(int64_t h = 16) {
  return parseFusion(fmt::format(R"(fusion {{
  mesh @s0 = [0]
  mesh @s1 = [1]
  mesh @s2 = [2]
  %inp = input f32[?t, {0}] @s0 {{split(0, 4), parallelize(0, Stream)}}
  %up0 = input f32[{1}, {0}] @s0 {{}}
  %down0 = input f32[{0}, {1}] @s0 {{}}
  %up1 = input f32[{1}, {0}] @s1 {{}}
  %down1 = input f32[{0}, {1}] @s1 {{}}
  %up2 = input f32[{1}, {0}] @s2 {{}}
  %down2 = input f32[{0}, {1}] @s2 {{}}
  %a0 = linear(%inp, %up0)
  %b0 = gelu(%a0, approximate="tanh")
  %out0 = linear(%b0, %down0)
  %a1 = linear(%out0, %up1)
  %b1 = gelu(%a1, approximate="tanh")
  %out1 = linear(%b1, %down1)
  %a2 = linear(%out1, %up2)
  %b2 = gelu(%a2, approximate="tanh")
  %out2 = linear(%b2, %down2)
  output %out2
}})",
                                 h, 4 * h),
                     "pipeline.mf");
}

// The inputs of the three-stage pipeline for t rows: every rank passes the global shapes (which
// bind ?t on ranks that do not hold %inp) and its stage's blocks; `full` gets the full inputs.
std::vector<ShardedTensor> pipelineInputs(const Fusion& def, int64_t t, std::vector<Tensor>* full = nullptr) {
  std::vector<ShardedTensor> inputs = inputLayouts(def);
  for (size_t i = 0; i < def.inputs().size(); ++i) {
    std::vector<int64_t> shape;
    for (const Extent& e : def.inputs()[i]->shape()) shape.push_back(e.evaluate({{"t", t}}));
    Tensor values = Tensor::random(DataType::Float, shape, 7 + i);
    if (full) full->push_back(values);
    inputs[i].global_shape = shape;
    if (inputs[i].mesh.contains(worldRank())) inputs[i].local = values;
  }
  return inputs;
}

MPI_TEST(Pipeline, ThreeStagesFourMicrobatches, atLeast(3)) {
  std::unique_ptr<Fusion> def = threeStagePipeline();
  std::vector<Tensor> full;
  std::vector<ShardedTensor> inputs = pipelineInputs(*def, 32, &full);
  auto counts = std::make_shared<MemoryCounts>();
  MultiDeviceExecutor exec(def->clone(), world(), std::make_unique<CountingBackend>(counts));
  std::vector<ShardedTensor> outs = exec.run(inputs);
  // The peak-memory estimate bounds what the stage really held (a receive buffer of every
  // microbatch, at most two microbatches' buffers in flight).
  int64_t input_bytes = 0;
  for (const ShardedTensor& in : inputs) input_bytes += in.local.defined() ? in.local.nbytes() : 0;
  EXPECT_LE(input_bytes + counts->peak, peakMemoryBytes(exec.programFor(inputs), {{"t", 32}}));
  // MPMD: a stage's rank runs a loop over the 4 microbatches holding only its stage's work (the
  // receives of the stages after the first are posted and waited for in loops before it).
  const HostProgram& program = exec.programFor(inputs);
  int64_t compute_loops = 0, gemms = 0;
  for (const HostNode& n : program.nodes) {
    const auto* loop = n.as<hir::ForLoop>();
    if (loop == nullptr || loop->trip_count != 4) continue;
    int64_t here = 0;
    for (const HostNode& b : loop->body) here += b.is<hir::Gemm>();
    compute_loops += here > 0;
    gemms += here;
  }
  EXPECT_EQ(compute_loops, worldRank() < 3 ? 1 : 0);
  EXPECT_EQ(gemms, worldRank() < 3 ? 2 : 0) << "one stage: two linears per microbatch";
  std::vector<std::string> kinds_seen = kinds(exec.lastCollectives());
  EXPECT_THAT(kinds_seen, Each(Eq("send_recv")));
  // A stage sends each microbatch to the next stage and receives each from the one before.
  EXPECT_EQ(kinds_seen.size(), worldRank() == 0 || worldRank() == 2 ? 4u
                               : worldRank() == 1                   ? 8u
                                                                    : 0u)
      << "one send_recv per microbatch and stage boundary this rank is on";
  expectSameCollectives(collectives(program, {{"t", 32}}), exec.lastCollectives());
  if (worldRank() != 2) return;
  Tensor expected = evaluateReference(*def, full).at(0);
  ASSERT_EQ(outs[0].local.shape(), expected.shape());
  for (int64_t k = 0; k < expected.numel(); ++k)
    ASSERT_NEAR(outs[0].local.get(k), expected.get(k), 1e-4 + 1e-4 * std::fabs(expected.get(k))) << "element " << k;
}

// GPipe forward: a middle stage receives microbatch i + 1 and sends microbatch i - 1 while it
// computes microbatch i. Its timeline, measured (no claim about speed): communication intervals
// (the receive waits on stream 1, the sends on stream 2) intersect its compute intervals.
MPI_TEST(Pipeline, MiddleStageCommunicatesBesideItsCompute, atLeast(3)) {
  std::unique_ptr<Fusion> def = threeStagePipeline(64);  // 128 KiB per microbatch and boundary
  std::vector<Tensor> full;
  std::vector<ShardedTensor> inputs = pipelineInputs(*def, 2048, &full);
  ExecutorOptions options;
  options.trace = true;
  MultiDeviceExecutor exec(def->clone(), world(), nullptr, options);
  exec.run(inputs);  // compiles the kernels: the timeline below is of warm runs
  // The intervals depend on the OS's scheduling of two cores among the three ranks: of three
  // runs (every rank runs all three), the one with the most overlap on the middle stage counts.
  OverlapSummary middle;
  for (int run = 0; run < 3; ++run) {
    std::vector<ShardedTensor> outs = exec.run(inputs);
    if (worldRank() == 2 && run == 0) {  // (EXPECT, not ASSERT: every rank must make all three runs)
      Tensor expected = evaluateReference(*def, full).at(0);
      double largest = 0, worst = 0;
      for (int64_t k = 0; k < expected.numel(); ++k) {
        largest = std::max(largest, std::fabs(expected.get(k)));
        worst = std::max(worst, std::fabs(outs[0].local.get(k) - expected.get(k)));
      }
      EXPECT_LE(worst, 1e-5 * largest) << "f32 vs the double reference, relative to the largest value";
    }
    OverlapSummary s = summarizeOverlap(exec.lastTrace());
    if (worldRank() == 1 && s.hidden_us >= middle.hidden_us) middle = s;
  }
  if (worldRank() != 1) return;
  bool recv_waits = false, sends = false;
  for (const TraceEvent& e : exec.lastTrace()) {
    recv_waits |= e.kind == TaskKind::Communication && e.stream == 1;
    sends |= e.kind == TaskKind::Communication && e.stream == 2;
  }
  EXPECT_TRUE(recv_waits && sends) << "receives on stream 1, sends on stream 2";
  EXPECT_GT(middle.hidden_us, 0) << "no communication interval of the middle stage intersects its compute";
  std::printf("[ pipeline ] middle stage: compute %.0f us, communication %.0f us, %.0f%% of it beside compute\n",
              middle.compute_us, middle.communication_us, 100 * middle.hiddenFraction());
}

// Microbatches are torch.chunk's blocks of rows, as shards are: a batch the 4 microbatches do not
// split runs them unequal (6 rows: 2, 2, 2, 0; 10 rows: 3, 3, 3, 1), each stage sending each
// microbatch's rows; the program is compiled for each run's sizes.
MPI_TEST(Pipeline, MicrobatchesThatDoNotSplitTheBatchAreTorchChunkBlocks, atLeast(3)) {
  std::unique_ptr<Fusion> def = threeStagePipeline();
  for (int64_t t : {6, 10}) {
    SCOPED_TRACE(fmt::format("{} rows", t));
    std::vector<Tensor> full;
    std::vector<ShardedTensor> inputs = pipelineInputs(*def, t, &full);
    MultiDeviceExecutor exec(def->clone(), world());
    std::vector<ShardedTensor> outs = exec.run(inputs);
    expectSameCollectives(collectives(exec.programFor(inputs), {{"t", t}}), exec.lastCollectives());
    if (worldRank() == 0) {  // stage 0 sends each microbatch's rows of its [t, 64] activations
      std::vector<int64_t> sent;
      for (const CollectiveInfo& c : exec.lastCollectives()) sent.push_back(c.bytes / (16 * 4));
      EXPECT_EQ(sent, (std::vector<int64_t>{chunkSpan(t, 4, 0).size, chunkSpan(t, 4, 1).size,
                                            chunkSpan(t, 4, 2).size, chunkSpan(t, 4, 3).size}));
    }
    if (worldRank() != 2) continue;
    Tensor expected = evaluateReference(*def, full).at(0);
    ASSERT_EQ(outs[0].local.shape(), expected.shape());
    for (int64_t k = 0; k < expected.numel(); ++k)
      ASSERT_NEAR(outs[0].local.get(k), expected.get(k), 1e-4 + 1e-4 * std::fabs(expected.get(k))) << "element " << k;
  }
}

}  // namespace
}  // namespace meshfuse::testing
