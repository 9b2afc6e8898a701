// The CUDA backend's host-side logic, tested on any machine (no GPU needed): the behaviour
// without a device, NVRTC compilation of the runtime's kernels for sm_90, block-copy planning,
// GEMM planning, the caching allocator's reuse and failure rules, the NCCL watchdog's verdicts and
// the host-staged communicator's staging.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <list>
#include <map>
#include <set>

#include "meshfuse/ops.h"
#include "runtime/backend.h"
#include "runtime/cuda.h"
#include "runtime/cuda/caching_allocator.h"
#include "codegen/cuda/gemm_plan.h"
#include "runtime/cuda/host_staged_communicator.h"
#include "runtime/cuda/nccl_support.h"
#include "runtime/cuda/nvrtc_compiler.h"
#include "codegen/cuda/runtime_kernels.h"
#include "test_helpers.h"

namespace meshfuse {
namespace {

using testing_helpers::userErrorMessage;

// (Without a device: cuda_unavailable_test.cpp, which builds without the CUDA backend too.)

// ---- NVRTC -------------------------------------------------------------------------------

TEST(CudaNvrtc, RuntimeKernelsCompileForSm90) {
  for (bool ptx : {true, false}) {
    cuda::CompiledCode code = cuda::compileCuda(cuda::runtimeKernelsSource(), "runtime", {90, ptx, ""});
    ASSERT_FALSE(code.image.empty());
    if (!ptx) continue;
    for (DataType dt : {DataType::Float, DataType::BFloat16, DataType::Half, DataType::Int64, DataType::Bool})
      EXPECT_NE(code.image.find(".entry " + cuda::accumulateKernelName(dt)), std::string::npos) << dtypeName(dt);
    for (int unit : {1, 2, 4, 8, 16})
      EXPECT_NE(code.image.find(".entry " + cuda::copyBlockKernelName(unit)), std::string::npos) << unit;
    // bf16/f16 rounding uses the hardware conversions on sm_90 (round to nearest even).
    EXPECT_NE(code.image.find("cvt.rn.bf16.f32"), std::string::npos);
    // The vectorized paths move 16 bytes per access.
    EXPECT_NE(code.image.find("ld.global.v4"), std::string::npos);
  }
}

TEST(CudaNvrtc, DiskCacheServesTheSecondCompile) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() /
                              fmt::format("meshfuse-nvrtc-cache-test-{}", ::testing::UnitTest::GetInstance()->random_seed());
  std::filesystem::remove_all(dir);
  const std::string src = cuda::cudaPrelude() + "extern \"C\" __global__ void k(float* x) { x[0] = 1.f; }\n";
  cuda::CompiledCode first = cuda::compileCuda(src, "k", {90, false, dir.string()});
  cuda::CompiledCode second = cuda::compileCuda(src, "k", {90, false, dir.string()});
  EXPECT_FALSE(first.from_cache);
  EXPECT_TRUE(second.from_cache);
  EXPECT_EQ(first.image, second.image);
  // Another architecture is another entry.
  EXPECT_FALSE(cuda::compileCuda(src, "k", {80, false, dir.string()}).from_cache);
  std::filesystem::remove_all(dir);
}

TEST(CudaNvrtc, CompileErrorIsABugReportWithTheSource) {
  try {
    cuda::compileCuda("extern \"C\" __global__ void k() { undefined_thing(); }\n", "broken", {90, true, ""});
    FAIL() << "expected an InternalError";
  } catch (const InternalError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("this is a bug"), std::string::npos) << msg;
    EXPECT_NE(msg.find("undefined_thing"), std::string::npos) << msg;
    EXPECT_NE(msg.find("   1 | extern"), std::string::npos) << msg;
  }
}

// ---- block copies ------------------------------------------------------------------------

TEST(CudaBlockCopy, WholeTensorAndRowRangesAreOneMemcpy) {
  cuda::BlockCopyPlan p = cuda::planBlockCopy(4, {8, 16}, {0, 0}, {8, 16}, {0, 0}, {8, 16}, 0, 0);
  EXPECT_TRUE(p.contiguous);
  EXPECT_EQ(p.bytes, 8 * 16 * 4);
  p = cuda::planBlockCopy(2, {8, 16}, {2, 0}, {4, 16}, {0, 0}, {4, 16}, 0, 0);
  EXPECT_TRUE(p.contiguous);
  EXPECT_EQ(p.src_offset, 2 * 16 * 2);
  EXPECT_EQ(p.bytes, 4 * 16 * 2);
  p = cuda::planBlockCopy(4, {8, 16}, {0, 0}, {8, 16}, {0, 0}, {0, 16}, 0, 0);
  EXPECT_TRUE(p.contiguous);
  EXPECT_EQ(p.bytes, 0);
}

TEST(CudaBlockCopy, ColumnBlocksUseTheWidestUnit) {
  // All-to-all packing: columns [8, 16) of a [4, 32] f32 tensor into a [4, 8] buffer.
  cuda::BlockCopyPlan p = cuda::planBlockCopy(4, {4, 32}, {0, 8}, {4, 8}, {0, 0}, {4, 8}, 0, 256);
  EXPECT_FALSE(p.contiguous);
  EXPECT_EQ(p.unit, 16);
  EXPECT_EQ(p.rank, 2);
  EXPECT_EQ(p.src_offset, 32);
  EXPECT_EQ((std::vector<int64_t>{p.sizes[0], p.sizes[1]}), (std::vector<int64_t>{4, 2}));
  EXPECT_EQ((std::vector<int64_t>{p.src_strides[0], p.dst_strides[0]}), (std::vector<int64_t>{8, 2}));
  EXPECT_EQ(p.total, 8);
  // A misaligned base address forces narrower units.
  p = cuda::planBlockCopy(4, {4, 32}, {0, 8}, {4, 8}, {0, 0}, {4, 8}, 4, 256);
  EXPECT_EQ(p.unit, 4);
  EXPECT_EQ(p.total, 32);
}

TEST(CudaBlockCopy, MergesDimsAndHandlesStridedInnermostDims) {
  // [2, 3, 4] block of a [2, 6, 4] tensor: dims 1-2 merge (rows of 4 are whole).
  cuda::BlockCopyPlan p = cuda::planBlockCopy(2, {2, 6, 4}, {0, 3, 0}, {2, 3, 4}, {0, 0, 0}, {2, 3, 4}, 0, 0);
  EXPECT_EQ(p.rank, 2);
  EXPECT_EQ(p.sizes[1] * p.unit, 12 * 2);
  // Column 5 of an [8, 6] tensor into an [8, 1] one: every element is its own run.
  p = cuda::planBlockCopy(8, {8, 6}, {0, 5}, {8, 1}, {0, 0}, {8, 1}, 0, 0);
  EXPECT_FALSE(p.contiguous);
  EXPECT_EQ(p.unit, 8);
  EXPECT_EQ(p.total, 8);
  EXPECT_EQ(p.src_strides[0], 6);
  EXPECT_EQ(p.dst_strides[0], 1);
}

// Replays a plan on the host and compares with a direct element copy.
TEST(CudaBlockCopy, PlansMoveExactlyTheBlock) {
  struct Case {
    std::vector<int64_t> src, so, dst, dof, sizes;
  };
  for (const Case& c : std::vector<Case>{{{4, 6, 10}, {1, 2, 3}, {3, 4, 7}, {0, 0, 0}, {3, 4, 7}},
                                         {{5, 12}, {0, 4}, {10, 4}, {5, 0}, {5, 4}},
                                         {{2, 3, 4, 5}, {0, 1, 0, 0}, {2, 2, 4, 5}, {0, 0, 0, 0}, {2, 2, 4, 5}},
                                         {{9, 2}, {3, 1}, {6, 3}, {1, 2}, {5, 1}}}) {
    for (int64_t elem : {1, 2, 4, 8}) {
      auto numel = [](const std::vector<int64_t>& s) {
        int64_t n = 1;
        for (int64_t x : s) n *= x;
        return n;
      };
      std::vector<unsigned char> src(numel(c.src) * elem), want(numel(c.dst) * elem, 0), got(want);
      for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 3);
      // Direct reference: iterate the block.
      std::vector<int64_t> idx(c.sizes.size(), 0);
      auto flat = [](const std::vector<int64_t>& shape, const std::vector<int64_t>& i) {
        int64_t f = 0;
        for (size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + i[d];
        return f;
      };
      for (int64_t n = 0; n < numel(c.sizes); ++n) {
        std::vector<int64_t> si(idx), di(idx);
        for (size_t d = 0; d < idx.size(); ++d) {
          si[d] += c.so[d];
          di[d] += c.dof[d];
        }
        std::memcpy(&want[flat(c.dst, di) * elem], &src[flat(c.src, si) * elem], elem);
        for (int64_t d = static_cast<int64_t>(idx.size()) - 1; d >= 0; --d) {
          if (++idx[d] < c.sizes[d]) break;
          idx[d] = 0;
        }
      }
      cuda::BlockCopyPlan p = cuda::planBlockCopy(elem, c.src, c.so, c.dst, c.dof, c.sizes, 0, 0);
      if (p.contiguous) {
        std::memcpy(&got[p.dst_offset], &src[p.src_offset], p.bytes);
      } else {
        for (int64_t u = 0; u < p.total; ++u) {  // what the kernel does per thread
          int64_t rest = u, so = 0, dof = 0;
          for (int k = p.rank - 1; k >= 0; --k) {
            int64_t i = rest % p.sizes[k];
            rest /= p.sizes[k];
            so += i * p.src_strides[k];
            dof += i * p.dst_strides[k];
          }
          std::memcpy(&got[p.dst_offset + dof * p.unit], &src[p.src_offset + so * p.unit], p.unit);
        }
      }
      EXPECT_EQ(got, want) << "elem " << elem << " sizes " << fmt::format("{}", fmt::join(c.sizes, ","));
    }
  }
}

// ---- GEMM planning -----------------------------------------------------------------------

Segment gemmSegment(std::vector<const Expr*> exprs, std::vector<const TensorView*> inputs) {
  Segment s;
  s.kind = Segment::Kind::Gemm;
  s.exprs = std::move(exprs);
  s.inputs = std::move(inputs);
  s.outputs = {s.exprs.back()->output()};
  return s;
}

TEST(CudaGemmPlan, LinearIsTheTransposedColumnMajorProduct) {
  Fusion f;
  TensorView* x = f.defineTensor({2, 3, 64}, DataType::BFloat16, "x");
  TensorView* w = f.defineTensor({128, 64}, DataType::BFloat16, "w");
  TensorView* b = f.defineTensor({128}, DataType::BFloat16, "b");
  TensorView* y = ops::linear(x, w, b);
  cuda::GemmPlan p = cuda::planGemm(gemmSegment({y->definition()}, {x, w, b}), {{2, 3, 64}, {128, 64}, {128}});
  EXPECT_EQ(p.describe(), "bf16 m=128 n=6 k=64 TN lda=64 ldb=64 ldd=128 batch=1 strides=(0, 0, 0) epilogue=bias");
  EXPECT_EQ(p.a_input, 1);
  EXPECT_EQ(p.b_input, 0);
  EXPECT_EQ(p.bias_input, 2);
}

TEST(CudaGemmPlan, MatmulBatchesOrFoldsTheBatchIntoRows) {
  Fusion f;
  TensorView* a = f.defineTensor({4, 8, 16}, DataType::Float, "a");
  TensorView* b3 = f.defineTensor({4, 16, 32}, DataType::Float, "b3");
  TensorView* b2 = f.defineTensor({16, 32}, DataType::Float, "b2");
  TensorView* y3 = ops::matmul(a, b3);
  TensorView* y2 = ops::matmul(a, b2);
  EXPECT_EQ(cuda::planGemm(gemmSegment({y3->definition()}, {a, b3}), {{4, 8, 16}, {4, 16, 32}}).describe(),
            "f32 m=32 n=8 k=16 NN lda=32 ldb=16 ldd=32 batch=4 strides=(512, 128, 256) epilogue=none");
  EXPECT_EQ(cuda::planGemm(gemmSegment({y2->definition()}, {a, b2}), {{4, 8, 16}, {16, 32}}).describe(),
            "f32 m=32 n=32 k=16 NN lda=32 ldb=16 ldd=32 batch=1 strides=(0, 0, 0) epilogue=none");
}

TEST(CudaGemmPlan, BiasAndTanhGeluFuseIntoTheEpilogue) {
  Fusion f;
  TensorView* x = f.defineTensor({32, 64}, DataType::Half, "x");
  TensorView* w = f.defineTensor({128, 64}, DataType::Half, "w");
  TensorView* b = f.defineTensor({128}, DataType::Half, "b");
  TensorView* lin = ops::linear(x, w);
  TensorView* bb = ops::broadcastInDim(b, {32, 128}, {1});
  TensorView* biased = ops::add(lin, bb);
  TensorView* act = ops::gelu(biased, "tanh");
  cuda::GemmPlan p = cuda::planGemm(
      gemmSegment({lin->definition(), bb->definition(), biased->definition(), act->definition()}, {x, w, b}),
      {{32, 64}, {128, 64}, {128}});
  EXPECT_EQ(p.epilogue, cuda::GemmEpilogue::GeluBias);
  EXPECT_EQ(p.bias_input, 2);
  // A [1, N] bias input broadcasts by itself.
  TensorView* b2 = f.defineTensor({1, 128}, DataType::Half, "b2");
  TensorView* biased2 = ops::add(b2, lin);
  p = cuda::planGemm(gemmSegment({lin->definition(), biased2->definition()}, {x, w, b2}), {{32, 64}, {128, 64}, {1, 128}});
  EXPECT_EQ(p.epilogue, cuda::GemmEpilogue::Bias);
  EXPECT_EQ(p.bias_input, 2);
  TensorView* r = ops::relu(lin);
  EXPECT_EQ(cuda::planGemm(gemmSegment({lin->definition(), r->definition()}, {x, w}), {{32, 64}, {128, 64}}).epilogue,
            cuda::GemmEpilogue::Relu);
}

TEST(CudaGemmPlan, WhatCublasLtCannotFuseIsNamed) {
  Fusion f;
  TensorView* x = f.defineTensor({32, 64}, DataType::Float, "x");
  TensorView* w = f.defineTensor({128, 64}, DataType::Float, "w");
  TensorView* lin = ops::linear(x, w);
  TensorView* erf_gelu = ops::gelu(lin);
  std::string msg = userErrorMessage(ErrorKind::Unsupported, [&] {
    cuda::planGemm(gemmSegment({lin->definition(), erf_gelu->definition()}, {x, w}), {{32, 64}, {128, 64}});
  });
  EXPECT_NE(msg.find("cuBLASLt cannot apply gelu"), std::string::npos) << msg;
  EXPECT_NE(msg.find("exact (erf)"), std::string::npos) << msg;
  TensorView* e = ops::exp(lin);
  msg = userErrorMessage(ErrorKind::Unsupported, [&] {
    cuda::planGemm(gemmSegment({lin->definition(), e->definition()}, {x, w}), {{32, 64}, {128, 64}});
  });
  EXPECT_NE(msg.find("cuBLASLt cannot apply exp"), std::string::npos) << msg;
}

// ---- caching allocator -------------------------------------------------------------------

struct FakeFence final : cuda::Fence {
  bool passed = false;
  bool done() override { return passed; }
  void wait() override { passed = true; }
};

struct FakeDevice {
  std::vector<std::shared_ptr<FakeFence>> fences;
  std::set<void*> live;
  int64_t limit = 1 << 30, used = 0;
  std::map<void*, size_t> sizes;
  cuda::CachingAllocator::Hooks hooks() {
    return {[this](size_t n) -> void* {
              if (used + static_cast<int64_t>(n) > limit) return nullptr;
              void* p = std::malloc(n);
              live.insert(p);
              sizes[p] = n;
              used += static_cast<int64_t>(n);
              return p;
            },
            [this](void* p) {
              live.erase(p);
              used -= static_cast<int64_t>(sizes[p]);
              std::free(p);
            },
            [this] {
              fences.push_back(std::make_shared<FakeFence>());
              return fences.back();
            }};
  }
};

TEST(CudaCachingAllocator, ReusesABlockOnlyAfterItsFencePassed) {
  FakeDevice dev;
  {
    cuda::CachingAllocator a("test memory", dev.hooks());
    void* p = a.allocate(1000);
    a.release(p);
    void* q = a.allocate(1000);  // the GPU may still use p: a fresh block
    EXPECT_NE(p, q);
    dev.fences[0]->passed = true;
    void* r = a.allocate(900);  // same 1024-byte class, fence passed: p again
    EXPECT_EQ(r, p);
    EXPECT_EQ(a.stats().raw_allocs, 2);
    EXPECT_EQ(a.stats().reuses, 1);
    // A much bigger cached block is not spent on a small request.
    void* big = a.allocate(8 << 20);
    a.release(big);
    dev.fences.back()->passed = true;
    void* small = a.allocate(4 << 20);
    EXPECT_NE(small, big);
    a.release(q);
    a.release(r);
    a.release(small);
  }
  EXPECT_TRUE(dev.live.empty());  // everything freed at destruction (after waiting)
}

TEST(CudaCachingAllocator, OutOfMemoryEmptiesTheCacheThenSaysHowMuch) {
  FakeDevice dev;
  dev.limit = 4 << 20;
  cuda::CachingAllocator a("test memory", dev.hooks());
  void* p = a.allocate(3 << 20);
  a.release(p);                   // cached, fence pending
  void* q = a.allocate(3 << 20);  // 4 MiB block each: needs the cached one freed first (waits)
  EXPECT_NE(q, nullptr);
  std::string msg = userErrorMessage(ErrorKind::Runtime, [&] { a.allocate(3 << 20); });
  EXPECT_NE(msg.find("out of test memory allocating 4194304 bytes"), std::string::npos) << msg;
  a.release(q);
}

// A fence that cannot be taken (the device faulted, the runtime is tearing down) must not throw
// out of release(), which runs in tensors' destructors (std::terminate): the block is leaked,
// never reused under work that may still run.
TEST(CudaCachingAllocator, ReleaseNeverThrowsAndLeaksWhatItCannotFence) {
  FakeDevice dev;
  cuda::CachingAllocator::Hooks hooks = dev.hooks();
  bool faulted = false;
  auto make = hooks.fence;
  hooks.fence = [&, make]() -> std::shared_ptr<cuda::Fence> {
    if (faulted) throw std::runtime_error("CUDA error in cudaEventRecord: an illegal memory access was encountered");
    return make();
  };
  void* kept = nullptr;
  {
    cuda::CachingAllocator a("test memory", hooks);
    void* p = a.allocate(1000);
    faulted = true;
    EXPECT_NO_THROW(a.release(p));
    EXPECT_EQ(a.stats().unfenced, 1);
    EXPECT_EQ(a.stats().in_use_bytes, 0);
    EXPECT_EQ(a.stats().cached_bytes, 0);
    faulted = false;
    void* q = a.allocate(1000);  // never p again
    EXPECT_NE(q, p);
    kept = p;
    a.release(q);
  }
  EXPECT_EQ(dev.live.count(kept), 1u) << "an unfenced block is leaked, not freed";
  std::free(kept);
}

// The destructor waits for pending fences; one that throws (a faulted device) leaks its blocks
// instead of terminating the process.
TEST(CudaCachingAllocator, DestructorSurvivesAFenceThatThrows) {
  struct ThrowingFence final : cuda::Fence {
    bool done() override { return false; }
    void wait() override { throw std::runtime_error("CUDA error in cudaEventSynchronize: unspecified launch failure"); }
  };
  FakeDevice dev;
  cuda::CachingAllocator::Hooks hooks = dev.hooks();
  hooks.fence = [] { return std::make_shared<ThrowingFence>(); };
  void* p = nullptr;
  EXPECT_NO_THROW({
    cuda::CachingAllocator a("test memory", hooks);
    p = a.allocate(100);
    a.release(p);
  });
  std::free(p);
}

// Fences are shared between frees while no work is submitted; work submitted (noted) in between
// makes the next free take a new one, which covers it. (Every enqueue of the CUDA backend and
// the NCCL communicator goes through a cuda::Submission, which notes its work when it ends.)
TEST(CudaCachingAllocator, SharedFencesAreRenewedByWork) {
  int64_t made = 0, work = 0, completed = 0;
  struct WorkFence final : cuda::Fence {  // passes once the work submitted before it completed
    int64_t upto;
    const int64_t* completed;
    bool done() override { return *completed >= upto; }
    void wait() override {}
  };
  cuda::SharedFences fences([&] {
    ++made;
    auto f = std::make_shared<WorkFence>();
    f->upto = work;
    f->completed = &completed;
    return f;
  });
  FakeDevice dev;
  cuda::CachingAllocator::Hooks hooks = dev.hooks();
  hooks.fence = [&] { return fences.get(); };
  cuda::CachingAllocator a("test memory", hooks);
  void* x = a.allocate(512);
  void* y = a.allocate(512);
  a.release(x);
  a.release(y);
  EXPECT_EQ(made, 1) << "two frees without work in between share a fence";
  void* z = a.allocate(512);  // work 0 completed: reusable
  EXPECT_TRUE(z == x || z == y);
  ++work;  // a kernel on z is enqueued...
  fences.noteWork();  // ...and noted when its Submission ends
  a.release(z);
  EXPECT_EQ(made, 2);
  void* w = a.allocate(512);
  EXPECT_NE(w, z) << "z is reused only after the kernel that uses it completed";
  completed = 1;
  void* v = a.allocate(512);
  EXPECT_EQ(v, z);
  a.release(w);
  a.release(v);
}

// ---- the NCCL communicator's watchdog ------------------------------------------------------

TEST(CudaNcclWatchdog, AFaultOnThisRankFailsAtOnceAndIsNotATimeout) {
  using Clock = std::chrono::steady_clock;
  const auto now = Clock::now();
  auto event = [](uintptr_t i) { return reinterpret_cast<cudaEvent_t>(i); };
  std::map<cudaEvent_t, cudaError_t> states = {
      {event(1), cudaSuccess}, {event(2), cudaErrorNotReady}, {event(3), cudaErrorIllegalAddress}};
  auto query = [&](cudaEvent_t e) { return states.at(e); };
  std::list<cuda::WatchedOperation> ops = {{event(1), now + std::chrono::hours(1), "allreduce on team [0, 1]"},
                                           {event(2), now + std::chrono::hours(1), "allgather on team [0, 1]"},
                                           {event(3), now + std::chrono::hours(1), "reduce_scatter on team [0, 1]"}};
  std::string failure = cuda::pollWatched(ops, now, 60, query);
  EXPECT_NE(failure.find("CUDA error on this rank's GPU while reduce_scatter on team [0, 1] was in flight"),
            std::string::npos) << failure;
  EXPECT_NE(failure.find("cudaErrorIllegalAddress"), std::string::npos) << failure;
  EXPECT_NE(failure.find("a kernel faulted"), std::string::npos) << failure;
  EXPECT_EQ(failure.find("did not complete"), std::string::npos) << "a fault is not a timeout: " << failure;
  EXPECT_EQ(ops.size(), 2u) << "the completed operation is dropped";
  // Without the fault: nothing to report before the deadline, a timeout after it.
  ops.pop_back();
  EXPECT_EQ(cuda::pollWatched(ops, now, 60, query), "");
  failure = cuda::pollWatched(ops, now + std::chrono::hours(2), 60, query);
  EXPECT_NE(failure.find("allgather on team [0, 1] did not complete within 60 s"), std::string::npos) << failure;
  // A blocking call in progress (no event) times out too.
  std::list<cuda::WatchedOperation> creating = {{nullptr, now, "creating the NCCL communicator of team [0, 1, 2]"}};
  EXPECT_NE(cuda::pollWatched(creating, now + std::chrono::seconds(1), 60, query).find("did not complete"),
            std::string::npos);
}

// ---- host-staged communicator ------------------------------------------------------------

// "Device" memory is host memory registered here; every copy is counted.
struct FakeStaging final : cuda::StagingMemory {
  std::set<const void*> device;
  int64_t to_host = 0, to_device = 0, host_buffers = 0;
  bool onDevice(const void* p) override { return device.count(p) > 0; }
  std::shared_ptr<void> hostBuffer(size_t bytes) override {
    ++host_buffers;
    return std::shared_ptr<void>(std::malloc(bytes), std::free);
  }
  void toHost(void* h, const void* d, size_t n) override {
    ++to_host;
    std::memcpy(h, d, n);
  }
  void toDevice(void* d, const void* h, size_t n) override {
    ++to_device;
    std::memcpy(d, h, n);
  }
};

TEST(CudaHostStaging, DeviceBuffersGoThroughHostTwins) {
  auto staging = std::make_shared<FakeStaging>();
  std::unique_ptr<Communicator> comm = cuda::makeHostStagedCommunicator(makeSelfCommunicator(), staging);
  EXPECT_EQ(comm->name(), "self+host-staging");
  std::vector<float> send = {1, 2, 3, 4}, recv(4, 0);
  staging->device = {send.data(), recv.data()};
  std::unique_ptr<Work> w = comm->allreduce(send.data(), recv.data(), 4, DataType::Float, ReduceOp::Sum, {0});
  EXPECT_EQ(staging->to_host, 1);
  EXPECT_EQ(staging->to_device, 0);  // not before wait()
  w->wait();
  w->wait();  // a second wait copies nothing again
  EXPECT_EQ(staging->to_device, 1);
  EXPECT_EQ(recv, send);
  EXPECT_EQ(staging->host_buffers, 2);
}

TEST(CudaHostStaging, InPlaceUsesOneTwinAndHostBuffersPassThrough) {
  auto staging = std::make_shared<FakeStaging>();
  std::unique_ptr<Communicator> comm = cuda::makeHostStagedCommunicator(makeSelfCommunicator(), staging);
  std::vector<float> buf = {5, 6};
  staging->device = {buf.data()};
  comm->allreduce(buf.data(), buf.data(), 2, DataType::Float, ReduceOp::Sum, {0})->wait();
  EXPECT_EQ(staging->host_buffers, 1);
  EXPECT_EQ(staging->to_host, 1);
  EXPECT_EQ(staging->to_device, 1);
  EXPECT_EQ(buf, (std::vector<float>{5, 6}));
  // Host memory: no staging at all.
  std::vector<int64_t> a = {7}, b = {0};
  comm->allgather(a.data(), b.data(), 1, DataType::Int64, {0})->wait();
  EXPECT_EQ(b[0], 7);
  EXPECT_EQ(staging->host_buffers, 1);
}

// A ring step's send and receive stage both buffers and go to the inner communicator as one
// sendRecv (so that its grouping, not the staging, decides how they are issued).
TEST(CudaHostStaging, SendRecvStagesBothBuffersAndStaysOneOperation) {
  struct Recorder final : Communicator {
    std::vector<std::string> calls;
    std::string name() const override { return "recorder"; }
    int64_t rank() const override { return 1; }
    int64_t size() const override { return 3; }
    std::unique_ptr<Work> none() {
      struct Done final : Work {
        void wait() override {}
      };
      return std::make_unique<Done>();
    }
    std::unique_ptr<Work> allgatherv(const void*, void*, const Counts&, DataType, const Team&) override {
      return none();
    }
    std::unique_ptr<Work> reduceScatterv(const void*, void*, const Counts&, DataType, ReduceOp, const Team&) override {
      return none();
    }
    std::unique_ptr<Work> allreduce(const void*, void*, int64_t, DataType, ReduceOp, const Team&) override {
      return none();
    }
    std::unique_ptr<Work> allToAllv(const void*, const Counts&, void*, const Counts&, DataType, const Team&) override {
      return none();
    }
    std::unique_ptr<Work> broadcast(void*, int64_t, DataType, int64_t, const Team&) override { return none(); }
    std::unique_ptr<Work> reduce(const void*, void*, int64_t, DataType, ReduceOp, int64_t, const Team&) override {
      return none();
    }
    std::unique_ptr<Work> gatherv(const void*, void*, const Counts&, DataType, int64_t, const Team&) override {
      return none();
    }
    std::unique_ptr<Work> scatterv(const void*, void*, const Counts&, DataType, int64_t, const Team&) override {
      return none();
    }
    std::unique_ptr<Work> send(const void*, int64_t, DataType, int64_t peer, int64_t) override {
      calls.push_back(fmt::format("send to {}", peer));
      return none();
    }
    std::unique_ptr<Work> recv(void*, int64_t, DataType, int64_t peer, int64_t) override {
      calls.push_back(fmt::format("recv from {}", peer));
      return none();
    }
    std::unique_ptr<Work> sendRecv(const void* s, int64_t, int64_t to, void* r, int64_t n, int64_t from, DataType,
                                   int64_t, const Team& team) override {
      calls.push_back(fmt::format("sendRecv to {} from {} on [{}]", to, from, fmt::join(team, ", ")));
      std::memcpy(r, s, static_cast<size_t>(n) * 4);  // "receives" what it sends
      return none();
    }
    void prepareTeams(const std::vector<Team>& teams) override {
      for (const Team& t : teams) calls.push_back(fmt::format("prepare [{}]", fmt::join(t, ", ")));
    }
    void barrier() override {}
    [[noreturn]] void abort(const std::string& why) override { throw std::runtime_error(why); }
  };
  auto staging = std::make_shared<FakeStaging>();
  auto inner = std::make_unique<Recorder>();
  Recorder* rec = inner.get();
  std::unique_ptr<Communicator> comm = cuda::makeHostStagedCommunicator(std::move(inner), staging);
  std::vector<float> out = {1, 2, 3}, in(3, 0);
  staging->device = {out.data(), in.data()};
  comm->prepareTeams({{0, 1}, {0, 1, 2}});
  comm->sendRecv(out.data(), 3, 2, in.data(), 3, 0, DataType::Float, 5, {0, 1, 2})->wait();
  EXPECT_EQ(rec->calls, (std::vector<std::string>{"prepare [0, 1]", "prepare [0, 1, 2]", "sendRecv to 2 from 0 on [0, 1, 2]"}));
  EXPECT_EQ(in, out);
  EXPECT_EQ(staging->to_host, 1);
  EXPECT_EQ(staging->to_device, 1);
}

// A staged operation dropped without wait() (a failed run) must not give its host twins back
// while the inner operation may still use them (an MPI request outlives its handle).
TEST(CudaHostStaging, TwinsOutliveTheInnerOperationOfADroppedWork) {
  struct Log {
    std::vector<std::string> events;
  };
  auto log = std::make_shared<Log>();
  struct LoggingStaging final : cuda::StagingMemory {
    std::shared_ptr<Log> log;
    const void* device = nullptr;
    bool onDevice(const void* p) override { return p == device; }
    std::shared_ptr<void> hostBuffer(size_t bytes) override {
      auto l = log;
      return std::shared_ptr<void>(std::malloc(bytes), [l](void* p) {
        l->events.push_back("twin freed");
        std::free(p);
      });
    }
    void toHost(void*, const void*, size_t) override {}
    void toDevice(void*, const void*, size_t) override {}
  };
  struct SlowWork final : Work {
    std::shared_ptr<Log> log;
    bool waited = false;
    void wait() override {
      waited = true;
      log->events.push_back("inner waited");
    }
    ~SlowWork() override { log->events.push_back(waited ? "inner destroyed" : "inner destroyed while in flight"); }
  };
  struct SlowSelf final : Communicator {
    std::shared_ptr<Log> log;
    std::unique_ptr<Communicator> self = makeSelfCommunicator();
    std::string name() const override { return "slow"; }
    int64_t rank() const override { return 0; }
    int64_t size() const override { return 1; }
    std::unique_ptr<Work> slow() {
      auto w = std::make_unique<SlowWork>();
      w->log = log;
      return w;
    }
    std::unique_ptr<Work> allgatherv(const void*, void*, const Counts&, DataType, const Team&) override {
      return slow();
    }
    std::unique_ptr<Work> reduceScatterv(const void*, void*, const Counts&, DataType, ReduceOp, const Team&) override {
      return slow();
    }
    std::unique_ptr<Work> allreduce(const void*, void*, int64_t, DataType, ReduceOp, const Team&) override {
      return slow();
    }
    std::unique_ptr<Work> allToAllv(const void*, const Counts&, void*, const Counts&, DataType, const Team&) override {
      return slow();
    }
    std::unique_ptr<Work> broadcast(void*, int64_t, DataType, int64_t, const Team&) override { return slow(); }
    std::unique_ptr<Work> reduce(const void*, void*, int64_t, DataType, ReduceOp, int64_t, const Team&) override {
      return slow();
    }
    std::unique_ptr<Work> gatherv(const void*, void*, const Counts&, DataType, int64_t, const Team&) override {
      return slow();
    }
    std::unique_ptr<Work> scatterv(const void*, void*, const Counts&, DataType, int64_t, const Team&) override {
      return slow();
    }
    std::unique_ptr<Work> send(const void*, int64_t, DataType, int64_t, int64_t) override { return slow(); }
    std::unique_ptr<Work> recv(void*, int64_t, DataType, int64_t, int64_t) override { return slow(); }
    void barrier() override {}
    [[noreturn]] void abort(const std::string& why) override { throw std::runtime_error(why); }
  };
  auto staging = std::make_shared<LoggingStaging>();
  staging->log = log;
  auto inner = std::make_unique<SlowSelf>();
  inner->log = log;
  std::unique_ptr<Communicator> comm = cuda::makeHostStagedCommunicator(std::move(inner), staging);
  std::vector<float> buf(4, 1);
  staging->device = buf.data();
  comm->allreduce(buf.data(), buf.data(), 4, DataType::Float, ReduceOp::Sum, {0}).reset();  // dropped unwaited
  EXPECT_EQ(log->events, (std::vector<std::string>{"inner waited", "inner destroyed", "twin freed"}));
}

TEST(CudaHostStaging, RootOnlyBuffersAreStagedOnlyWhereUsed) {
  auto staging = std::make_shared<FakeStaging>();
  std::unique_ptr<Communicator> comm = cuda::makeHostStagedCommunicator(makeSelfCommunicator(), staging);
  std::vector<float> x = {1, 2, 3}, y(3, 0);
  staging->device = {x.data(), y.data()};
  comm->broadcast(x.data(), 3, DataType::Float, 0, {0})->wait();  // the root's buffer is only read
  EXPECT_EQ(staging->to_host, 1);
  EXPECT_EQ(staging->to_device, 0);
  comm->gather(x.data(), y.data(), 3, DataType::Float, 0, {0})->wait();
  EXPECT_EQ(y, x);
  comm->scatter(x.data(), y.data(), 3, DataType::Float, 0, {0})->wait();
  comm->reduce(x.data(), y.data(), 3, DataType::Float, ReduceOp::Sum, 0, {0})->wait();
  comm->reduceScatter(x.data(), y.data(), 3, DataType::Float, ReduceOp::Sum, {0})->wait();
  comm->allToAll(x.data(), y.data(), 3, DataType::Float, {0})->wait();
  EXPECT_EQ(y, x);
  EXPECT_EQ(staging->to_host, 6);
  EXPECT_EQ(staging->to_device, 5);
  // Bad teams are the inner communicator's user errors, before any staging.
  std::string msg = userErrorMessage(ErrorKind::Mesh, [&] {
    comm->allgather(x.data(), y.data(), 3, DataType::Float, {0, 1});
  });
  EXPECT_NE(msg.find("team [0, 1] names rank 1"), std::string::npos) << msg;
  EXPECT_EQ(staging->to_host, 6);
}

}  // namespace
}  // namespace meshfuse
