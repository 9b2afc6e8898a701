// The CUDA backend on a GPU: memory, data movement, cuBLASLt GEMM segments and streams, each
// compared with the CPU backend or the reference executor. Skipped without a device.
#include <gtest/gtest.h>

#include "cuda_test_helpers.h"
#include "meshfuse/ops.h"
#include "meshfuse/reference.h"
#include "runtime/cuda.h"
#include "runtime/tensor_blocks.h"

namespace meshfuse {
namespace {

using cuda_testing::closeTo;
using cuda_testing::sameValues;

const DataType kAllTypes[] = {DataType::Float, DataType::BFloat16, DataType::Half, DataType::Int64, DataType::Bool};
const DataType kFloatTypes[] = {DataType::Float, DataType::BFloat16, DataType::Half};

TEST(CudaBackend, UploadDownloadRoundTripsEveryDtype) {
  MF_REQUIRE_CUDA();
  std::unique_ptr<Backend> b = makeCudaBackend();
  EXPECT_EQ(b->name(), "cuda");
  EXPECT_EQ(b->device(), Device::Cuda);
  for (DataType dt : kAllTypes) {
    for (std::vector<int64_t> shape : {std::vector<int64_t>{0}, {1}, {3, 5}, {64, 129}}) {
      Tensor host = Tensor::random(dt, shape, 7);
      Tensor dev = b->upload(host);
      EXPECT_EQ(dev.device(), Device::Cuda);
      Tensor back = b->download(dev);
      ASSERT_EQ(back.shape(), shape);
      EXPECT_EQ(std::memcmp(back.data(), host.data(), host.nbytes()), 0) << dtypeName(dt);
    }
  }
}

TEST(CudaBackend, CopyAndAccumulateMatchTheHost) {
  MF_REQUIRE_CUDA();
  std::unique_ptr<Backend> b = makeCudaBackend();
  std::unique_ptr<Backend> cpu = makeCpuBackend();
  for (DataType dt : kAllTypes) {
    // 4099 rows: the vectorized path and its scalar tail; a slice off by one row: misaligned.
    for (int64_t n : {1, 7, 4099}) {
      Tensor x = Tensor::random(dt, {n + 1, 3}, 1), y = Tensor::random(dt, {n + 1, 3}, 2);
      Tensor xs = x.slice0(1, n), ys = y.slice0(1, n);
      Tensor dx = b->upload(x), dy = b->upload(y);
      Tensor dxs = dx.slice0(1, n), dys = dy.slice0(1, n);
      b->accumulate(dxs, dys);
      cpu->accumulate(xs, ys);
      EXPECT_TRUE(sameValues(dx, x, b.get())) << dtypeName(dt) << " n=" << n;
      Tensor dz = b->allocate(dt, {n, 3});
      b->copy(dz, dys);
      b->streams().synchronize();
      EXPECT_TRUE(sameValues(dz, ys, b.get())) << dtypeName(dt) << " n=" << n;
    }
  }
}

TEST(CudaBackend, CopyBlockMatchesTheHost) {
  MF_REQUIRE_CUDA();
  std::unique_ptr<Backend> b = makeCudaBackend();
  struct Case {
    std::vector<int64_t> src, so, dst, dof, sizes;
  };
  for (const Case& c : std::vector<Case>{{{8, 32}, {0, 8}, {8, 8}, {0, 0}, {8, 8}},
                                         {{4, 6, 10}, {1, 2, 3}, {3, 4, 7}, {0, 0, 0}, {3, 4, 7}},
                                         {{2, 3, 4, 5}, {0, 1, 0, 0}, {2, 2, 4, 5}, {0, 0, 0, 0}, {2, 2, 4, 5}},
                                         {{9, 2}, {3, 1}, {6, 3}, {1, 2}, {5, 1}},
                                         {{16, 64}, {4, 0}, {8, 64}, {0, 0}, {8, 64}}}) {
    for (DataType dt : kAllTypes) {
      Tensor src = Tensor::random(dt, c.src, 3), want = Tensor::random(dt, c.dst, 4);
      Tensor dsrc = b->upload(src), ddst = b->upload(want);
      copyBlock(src, c.so, want, c.dof, c.sizes);
      b->copyBlock(dsrc, c.so, ddst, c.dof, c.sizes);
      b->streams().synchronize();
      EXPECT_TRUE(sameValues(ddst, want, b.get())) << dtypeName(dt) << " block " << fmt::format("{}", fmt::join(c.sizes, "x"));
    }
  }
}

// One GEMM segment run on the GPU against the reference executor's result.
void expectGemm(Backend& b, const Segment& seg, const std::vector<Tensor>& host_inputs, const Tensor& want) {
  std::vector<Tensor> dev;
  for (const Tensor& t : host_inputs) dev.push_back(b.upload(t));
  std::vector<const Tensor*> ins;
  for (const Tensor& t : dev) ins.push_back(&t);
  Tensor out = b.allocate(want.dtype(), want.shape());
  std::vector<Tensor*> outs = {&out};
  b.runSegment(seg, ins, outs, [](const TensorView*) -> std::vector<int64_t> { return {}; });
  b.streams().synchronize();
  EXPECT_TRUE(closeTo(out, want, &b));
}

Segment gemmSegment(std::vector<const Expr*> exprs, std::vector<const TensorView*> inputs) {
  Segment s;
  s.kind = Segment::Kind::Gemm;
  s.exprs = std::move(exprs);
  s.inputs = std::move(inputs);
  s.outputs = {s.exprs.back()->output()};
  return s;
}

TEST(CudaBackend, LinearAndMatmulGemmsMatchTheReference) {
  MF_REQUIRE_CUDA();
  std::unique_ptr<Backend> b = makeCudaBackend();
  for (DataType dt : kFloatTypes) {
    SCOPED_TRACE(dtypeName(dt));
    Fusion f;
    TensorView* x = f.defineTensor({3, 40, 96}, dt, "x");
    TensorView* w = f.defineTensor({72, 96}, dt, "w");
    TensorView* bias = f.defineTensor({72}, dt, "bias");
    TensorView* y = ops::linear(x, w, bias);
    TensorView* y_nobias = ops::linear(x, w);
    TensorView* b3 = f.defineTensor({3, 96, 24}, dt, "b3");
    TensorView* b2 = f.defineTensor({96, 24}, dt, "b2");
    TensorView* m3 = ops::matmul(x, b3);
    TensorView* m2 = ops::matmul(x, b2);
    Tensor tx = Tensor::random(dt, {3, 40, 96}, 1), tw = Tensor::random(dt, {72, 96}, 2),
           tb = Tensor::random(dt, {72}, 3), tb3 = Tensor::random(dt, {3, 96, 24}, 4),
           tb2 = Tensor::random(dt, {96, 24}, 5);
    expectGemm(*b, gemmSegment({y->definition()}, {x, w, bias}), {tx, tw, tb},
               evaluateExpr(y->definition(), {&tx, &tw, &tb}, {3, 40, 72}));
    expectGemm(*b, gemmSegment({y_nobias->definition()}, {x, w}), {tx, tw},
               evaluateExpr(y_nobias->definition(), {&tx, &tw, nullptr}, {3, 40, 72}));
    expectGemm(*b, gemmSegment({m3->definition()}, {x, b3}), {tx, tb3},
               evaluateExpr(m3->definition(), {&tx, &tb3}, {3, 40, 24}));
    expectGemm(*b, gemmSegment({m2->definition()}, {x, b2}), {tx, tb2},
               evaluateExpr(m2->definition(), {&tx, &tb2}, {3, 40, 24}));
  }
}

TEST(CudaBackend, BiasGeluEpilogueMatchesTheReference) {
  MF_REQUIRE_CUDA();
  std::unique_ptr<Backend> b = makeCudaBackend();
  for (DataType dt : kFloatTypes) {
    SCOPED_TRACE(dtypeName(dt));
    Fusion f;
    TensorView* x = f.defineTensor({64, 128}, dt, "x");
    TensorView* w = f.defineTensor({256, 128}, dt, "w");
    TensorView* bias = f.defineTensor({256}, dt, "bias");
    TensorView* lin = ops::linear(x, w);
    TensorView* bb = ops::broadcastInDim(bias, {64, 256}, {1});
    TensorView* biased = ops::add(lin, bb);
    TensorView* act = ops::gelu(biased, "tanh");
    Tensor tx = Tensor::random(dt, {64, 128}, 1), tw = Tensor::random(dt, {256, 128}, 2),
           tb = Tensor::random(dt, {256}, 3);
    Tensor t_lin = evaluateExpr(lin->definition(), {&tx, &tw, nullptr}, {64, 256});
    Tensor t_bb = evaluateExpr(bb->definition(), {&tb}, {64, 256});
    Tensor t_biased = evaluateExpr(biased->definition(), {&t_lin, &t_bb}, {64, 256});
    Tensor want = evaluateExpr(act->definition(), {&t_biased}, {64, 256});
    std::vector<Tensor> dev = {b->upload(tx), b->upload(tw), b->upload(tb)};
    Tensor out = b->allocate(dt, {64, 256});
    std::vector<Tensor*> outs = {&out};
    b->runSegment(gemmSegment({lin->definition(), bb->definition(), biased->definition(), act->definition()},
                              {x, w, bias}),
                  {&dev[0], &dev[1], &dev[2]}, outs, [](const TensorView*) -> std::vector<int64_t> { return {}; });
    b->streams().synchronize();
    EXPECT_TRUE(closeTo(out, want, b.get()));
  }
}

TEST(CudaBackend, StreamsOrderWorkThroughEvents) {
  MF_REQUIRE_CUDA();
  std::unique_ptr<Backend> b = makeCudaBackend();
  Streams& s = b->streams();
  const int64_t n = 1 << 20;
  Tensor ones = b->upload(Tensor::fromValues(DataType::Float, {n}, std::vector<double>(n, 1.0)));
  Tensor acc = b->upload(Tensor(DataType::Float, {n}));
  s.setTracing(true);
  // Stream 1 adds 1 ten times; stream 0 waits for it, then doubles the result by adding it to itself.
  for (int i = 0; i < 10; ++i) s.submit(1, TaskKind::Compute, "add one", [&] { b->accumulate(acc, ones); });
  std::shared_ptr<Event> done = s.record(1);
  s.wait(0, done);
  Tensor copy = b->allocate(DataType::Float, {n});
  s.submit(0, TaskKind::Copy, "copy", [&] { b->copy(copy, acc); });
  s.submit(0, TaskKind::Compute, "double", [&] { b->accumulate(acc, copy); });
  s.synchronize();
  Tensor host = b->download(acc);
  EXPECT_EQ(host.get(0), 20);
  EXPECT_EQ(host.get(n - 1), 20);
  std::vector<TraceEvent> trace = s.takeTrace();
  ASSERT_EQ(trace.size(), 12u);
  for (const TraceEvent& e : trace) EXPECT_LE(e.begin_us, e.end_us) << e.name;
  EXPECT_LE(trace[9].end_us, trace[10].begin_us + 1e-3) << "stream 0 ran before the event it waited for";
}

TEST(CudaBackend, TaskErrorsReachTheHostWithTheCall) {
  MF_REQUIRE_CUDA();
  std::unique_ptr<Backend> b = makeCudaBackend();
  Tensor x = b->allocate(DataType::Float, {4});
  Tensor y = b->allocate(DataType::BFloat16, {4});
  EXPECT_THROW(b->streams().submit(2, TaskKind::Copy, "bad copy", [&] { b->copy(x, y); }), InternalError);
  b->streams().synchronize();  // the stream is still usable
}

TEST(CudaBackend, FreedMemoryIsReusedWithoutNewAllocations) {
  MF_REQUIRE_CUDA();
  std::unique_ptr<Backend> b = makeCudaBackend();
  void* first = nullptr;
  {
    Tensor t = b->allocate(DataType::Float, {1 << 20});
    first = t.data();
  }
  b->streams().synchronize();
  Tensor again = b->allocate(DataType::Float, {1 << 20});
  EXPECT_EQ(again.data(), first);
}

// A block freed outside a task while a copy on the main stream still reads it must not be handed
// to work on another stream before that copy finished: the copy's Submission renews the fence
// the free takes (it used to reuse the fence of the last task, which did not cover the copy).
TEST(CudaBackend, ABlockFreedUnderAnUnfinishedCopyIsNotReusedByAnotherStream) {
  MF_REQUIRE_CUDA();
  std::unique_ptr<Backend> b = makeCudaBackend();
  const int64_t n = 64 << 20;  // 256 MiB: the copy is still running when the host moves on
  Tensor pattern = Tensor::empty(DataType::Float, {n});
  for (int64_t i = 0; i < n; ++i) static_cast<float*>(pattern.data())[i] = static_cast<float>(i % 1000);
  Tensor zeros = b->upload(Tensor(DataType::Float, {n}));
  Tensor src = b->upload(pattern);
  Tensor dst = b->allocate(DataType::Float, {n});
  b->copy(dst, src);  // outside a task: on the main stream, asynchronous
  src = Tensor();     // freed while the copy may still read it
  b->streams().submit(1, TaskKind::Copy, "overwrite", [&] {
    Tensor t = b->allocate(DataType::Float, {n});  // src's block only once the copy is done
    b->copy(t, zeros);
  });
  b->streams().synchronize();
  EXPECT_TRUE(cuda_testing::sameValues(dst, pattern, b.get()));
}

TEST(CudaBackend, DescriptionNamesTheDevice) {
  MF_REQUIRE_CUDA();
  std::string d = cudaDeviceDescription();
  EXPECT_NE(d.find("sm_"), std::string::npos) << d;
  EXPECT_NE(d.find("NCCL"), std::string::npos) << d;
}

}  // namespace
}  // namespace meshfuse
