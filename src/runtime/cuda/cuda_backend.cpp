// The CUDA backend (backend.h): device memory from the caching allocator, segments as cuBLASLt
// GEMMs and NVRTC-compiled kernels, data movement as copies and runtime kernels, all enqueued on
// the current task's CUDA stream (cuda_streams.h).
#include <cstring>

#include "meshfuse/error.h"
#include "meshfuse/ir/expr.h"
#include "meshfuse/runtime/cuda.h"
#include "meshfuse/runtime/environment.h"
#include "runtime/cuda/cublaslt_gemm.h"
#include "runtime/cuda/cuda_context.h"
#include "runtime/cuda/cuda_error.h"
#include "runtime/cuda/cuda_streams.h"
#include "runtime/cuda/nccl_support.h"
#include "runtime/cuda/nvrtc_compiler.h"
#include "runtime/cuda/runtime_kernels.h"

namespace meshfuse {
namespace {

using cuda::CudaContext;

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& o)
      : ctx_(CudaContext::create(o.device)),
        streams_(cuda::makeCudaStreams(ctx_)),
        kernels_({ctx_->properties().arch(), false,
                  o.cache_dir.empty() ? readRuntimeEnvironment().cache_dir + "/cuda" : o.cache_dir}),
        gemm_(o.allow_tf32) {}

  std::string name() const override { return "cuda"; }
  Device device() const override { return Device::Cuda; }

  Tensor allocate(DataType dtype, const std::vector<int64_t>& shape) override {
    return CudaContext::allocateTensor(ctx_, dtype, shape);
  }

  void runSegment(const Segment& seg, const std::vector<const Tensor*>& inputs, const std::vector<Tensor*>& outputs,
                  const ShapeFn&) override {
    ctx_->activate();
    switch (seg.kind) {
      case Segment::Kind::Gemm:
        runGemm(seg, inputs, outputs);
        return;
      case Segment::Kind::Kernel: {
        std::vector<std::string> ops;
        for (const Expr* e : seg.exprs) ops.emplace_back(e->name());
        // The CUDA C emitter is written on the kernel IR of the generated-kernels issue; until
        // that IR is part of the build there is nothing to emit from.
        userError(ErrorKind::Unsupported,
                  "the CUDA backend cannot run kernel segments ({}) yet: its CUDA C emitter needs the kernel IR of "
                  "the generated-kernels issue, which this build does not have; run with --device=cpu",
                  fmt::join(ops, ", "));
      }
      case Segment::Kind::Communication:
        break;
    }
    MF_CHECK(false, "runSegment of a communication segment");
  }

  void copy(Tensor& dst, const Tensor& src) override {
    MF_CHECK(dst.dtype() == src.dtype() && dst.numel() == src.numel(), "copy of {} into {}", src.shapeString(),
             dst.shapeString());
    if (src.nbytes() == 0 || dst.data() == src.data()) return;
    ctx_->activate();
    // cudaMemcpyDefault: unified addressing tells device from host memory.
    MF_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDefault, ctx_->currentOrMain()));
  }

  void accumulate(Tensor& dst, const Tensor& src) override {
    MF_CHECK(dst.dtype() == src.dtype() && dst.numel() == src.numel(), "accumulating {} into {}", src.shapeString(),
             dst.shapeString());
    requireDevice(dst, "accumulate");
    requireDevice(src, "accumulate");
    long long n = dst.numel();
    if (n == 0) return;
    ctx_->activate();
    void* d = dst.data();
    const void* s = src.data();
    int vec = reinterpret_cast<uintptr_t>(d) % 16 == 0 && reinterpret_cast<uintptr_t>(s) % 16 == 0;
    void* args[] = {&d, &s, &n, &vec};
    cudaKernel_t k = kernels_.get(cuda::runtimeKernelsSource(), cuda::accumulateKernelName(dst.dtype()));
    cuda::launchKernel(k, grid(n / (vec ? 4 : 1)), dim3(kThreads), 0, ctx_->currentOrMain(), args);
  }

  void copyBlock(const Tensor& src, const std::vector<int64_t>& src_offsets, Tensor& dst,
                 const std::vector<int64_t>& dst_offsets, const std::vector<int64_t>& sizes) override {
    MF_CHECK(src.dtype() == dst.dtype(), "block copy from {} to {}", dtypeName(src.dtype()), dtypeName(dst.dtype()));
    requireDevice(src, "copyBlock");
    requireDevice(dst, "copyBlock");
    cuda::BlockCopyPlan p = cuda::planBlockCopy(dtypeSize(src.dtype()), src.shape(), src_offsets, dst.shape(),
                                                dst_offsets, sizes, reinterpret_cast<uintptr_t>(src.data()),
                                                reinterpret_cast<uintptr_t>(dst.data()));
    ctx_->activate();
    const char* s = static_cast<const char*>(src.data()) + p.src_offset;
    char* d = static_cast<char*>(dst.data()) + p.dst_offset;
    if (p.contiguous) {
      if (p.bytes > 0)
        MF_CUDA_CHECK(cudaMemcpyAsync(d, s, static_cast<size_t>(p.bytes), cudaMemcpyDeviceToDevice,
                                      ctx_->currentOrMain()));
      return;
    }
    cuda::BlockCopyDims dims = cuda::kernelDims(p);
    long long total = p.total;
    int rank = p.rank;
    void* args[] = {&d, &s, &total, &rank, &dims};
    cudaKernel_t k = kernels_.get(cuda::runtimeKernelsSource(), cuda::copyBlockKernelName(p.unit));
    cuda::launchKernel(k, grid(total), dim3(kThreads), 0, ctx_->currentOrMain(), args);
  }

  // Through pinned staging: a pageable copy would be staged by the driver anyway, in small
  // pieces. The copy completes before returning, because the evaluator's tasks on other streams
  // read uploaded inputs without an event to wait for.
  Tensor upload(const Tensor& t) override {
    if (t.device() == Device::Cuda) return t;
    Tensor out = allocate(t.dtype(), t.shape());
    if (t.nbytes() == 0) return out;
    ctx_->activate();
    std::shared_ptr<void> staging = CudaContext::pinned(ctx_, t.nbytes());
    std::memcpy(staging.get(), t.data(), t.nbytes());
    cudaStream_t s = ctx_->currentOrMain();
    MF_CUDA_CHECK(cudaMemcpyAsync(out.data(), staging.get(), t.nbytes(), cudaMemcpyHostToDevice, s));
    MF_CUDA_CHECK(cudaStreamSynchronize(s));
    return out;
  }

  Tensor download(const Tensor& t) override {
    if (t.device() != Device::Cuda) return t;
    Tensor out = Tensor::empty(t.dtype(), t.shape());
    if (t.nbytes() == 0) return out;
    ctx_->activate();
    std::shared_ptr<void> staging = CudaContext::pinned(ctx_, t.nbytes());
    cudaStream_t s = ctx_->currentOrMain();
    MF_CUDA_CHECK(cudaMemcpyAsync(staging.get(), t.data(), t.nbytes(), cudaMemcpyDeviceToHost, s));
    MF_CUDA_CHECK(cudaStreamSynchronize(s));
    std::memcpy(out.data(), staging.get(), t.nbytes());
    return out;
  }

  Streams& streams() override { return *streams_; }

  Stats stats() const override { return {kernels_.compiled(), kernels_.compileSeconds()}; }

 private:
  static constexpr int kThreads = 256;

  // A grid-stride launch: enough blocks to fill the GPU a few times over, no more.
  dim3 grid(long long work) const {
    long long blocks = (work + kThreads - 1) / kThreads;
    long long cap = static_cast<long long>(ctx_->properties().sm_count) * 8;
    return dim3(static_cast<unsigned>(std::max<long long>(1, std::min(blocks, cap))));
  }

  static void requireDevice(const Tensor& t, const char* what) {
    MF_CHECK(t.device() == Device::Cuda, "{} on a host tensor in the CUDA backend", what);
  }

  void runGemm(const Segment& seg, const std::vector<const Tensor*>& inputs, const std::vector<Tensor*>& outputs) {
    std::vector<std::vector<int64_t>> shapes;
    for (const Tensor* t : inputs) {
      requireDevice(*t, "a GEMM operand");
      shapes.push_back(t->shape());
    }
    cuda::GemmPlan plan = cuda::planGemm(seg, shapes);
    Tensor& out = *outputs.at(0);
    requireDevice(out, "a GEMM output");
    cudaStream_t s = ctx_->currentOrMain();
    if (plan.k == 0) {  // an empty contraction is zeros (plus the bias, which cuBLASLt would add)
      MF_USER_CHECK(plan.epilogue == cuda::GemmEpilogue::None, ErrorKind::Unsupported,
                    "a GEMM with an empty contraction dim and a {} epilogue", cuda::gemmEpilogueName(plan.epilogue));
      MF_CUDA_CHECK(cudaMemsetAsync(out.data(), 0, out.nbytes(), s));
      return;
    }
    const void* bias = plan.bias_input >= 0 ? inputs[plan.bias_input]->data() : nullptr;
    gemm_.run(plan, inputs[plan.a_input]->data(), inputs[plan.b_input]->data(), bias, out.data(), s, workspace(s),
              cuda::CublasLtGemm::kWorkspaceBytes);
  }

  // One cuBLASLt workspace per stream: GEMMs on different streams may run at the same time.
  void* workspace(cudaStream_t s) {
    auto it = workspaces_.find(s);
    if (it == workspaces_.end())
      it = workspaces_
               .emplace(s, allocate(DataType::Float, {static_cast<int64_t>(cuda::CublasLtGemm::kWorkspaceBytes / 4)}))
               .first;
    return it->second.data();
  }

  std::shared_ptr<CudaContext> ctx_;
  std::unique_ptr<Streams> streams_;
  mutable cuda::KernelCache kernels_;
  cuda::CublasLtGemm gemm_;
  std::map<cudaStream_t, Tensor> workspaces_;
};

}  // namespace

bool cudaDeviceAvailable() { return cuda::unavailableReason().empty(); }

std::unique_ptr<Backend> makeCudaBackend(const CudaBackendOptions& options) {
  return std::make_unique<CudaBackend>(options);
}

std::unique_ptr<Backend> makeCudaBackend() { return makeCudaBackend(CudaBackendOptions{}); }

std::string cudaDeviceDescription(int device) {
  std::string why = cuda::unavailableReason();
  if (!why.empty()) return "no CUDA device: " + why;
  cuda::DeviceProperties p = cuda::deviceProperties(cuda::requireDevice(device));
  return fmt::format("{} (sm_{}, {} SMs, {:.1f} GiB, {} MiB L2); driver {}, runtime {}, NVRTC {}, cuBLASLt {}, NCCL {}",
                     p.name, p.arch(), p.sm_count, p.memory_bytes / double(1 << 30), p.l2_bytes >> 20,
                     cuda::driverVersionString(), cuda::runtimeVersionString(), cuda::nvrtcVersionString(),
                     cuda::cublasLtVersionString(), cuda::ncclVersionString());
}

}  // namespace meshfuse
