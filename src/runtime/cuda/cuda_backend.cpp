// The CUDA backend (backend.h): device memory from the caching allocator, segments as cuBLASLt
// GEMMs and NVRTC-compiled kernels, data movement as copies and runtime kernels, all enqueued on
// the current task's CUDA stream (cuda_streams.h).
//
// A linear or matmul segment runs directly on cuBLASLt in its own dtype (bf16/f16 on tensor
// cores). Every other segment (kernels, sdpa) is lowered to kernel IR, as on the CPU; its loop
// nests become NVRTC kernels (cuda_emitter.h) and its GEMM calls f32 cuBLASLt calls. Compiled
// programs are cached per segment structure and local shapes (the CPU backend's key).
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "meshfuse/error.h"
#include "meshfuse/ir/expr.h"
#include "meshfuse/ir/fusion.h"
#include "codegen/kernel_ir.h"
#include "runtime/cuda.h"
#include "runtime/environment.h"
#include "runtime/cpu/segment_key.h"
#include "runtime/cuda/cublaslt_gemm.h"
#include "codegen/cuda/cuda_attention.h"
#include "codegen/cuda/cuda_emitter.h"
#include "runtime/cuda/cuda_context.h"
#include "runtime/cuda/cuda_error.h"
#include "runtime/cuda/cuda_streams.h"
#include "runtime/cuda/nccl_support.h"
#include "runtime/cuda/nvrtc_compiler.h"
#include "codegen/cuda/runtime_kernels.h"

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

  // Kernels and GEMMs may still run: their libraries and cuBLASLt's handle must outlive them. A
  // destructor cannot throw, and the error of work nobody waited for would otherwise be lost: it
  // is reported on stderr (a run that failed has thrown its own error already).
  ~CudaBackend() override {
    try {
      streams_->synchronize();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "meshfuse: the CUDA backend's work failed after its last run: %s\n", e.what());
    } catch (...) {
      std::fprintf(stderr, "meshfuse: the CUDA backend's work failed after its last run\n");
    }
  }

  std::string name() const override { return "cuda"; }
  Device device() const override { return Device::Cuda; }

  Tensor allocate(DataType dtype, const std::vector<int64_t>& shape) override {
    return CudaContext::allocateTensor(ctx_, dtype, shape);
  }
  MemoryLimit memoryLimit() const override {
    return {ctx_->properties().memory_bytes, fmt::format("memory of GPU {}", ctx_->device())};
  }

  void runSegment(const Segment& seg, const std::vector<const Tensor*>& inputs, const std::vector<Tensor*>& outputs,
                  const ShapeFn& shape_of) override {
    run(seg, inputs, outputs, shape_of, nullptr);
  }

  // A ring step, or a causal attention on a block of the query rows: the attention kernels take
  // the launch's positions as an argument (cuda_attention.h), so every step reuses one kernel.
  void runAttentionStep(const Segment& seg, const std::vector<const Tensor*>& inputs,
                        const std::vector<Tensor*>& outputs, const ShapeFn& shape_of,
                        const AttentionLaunch& launch) override {
    MF_CHECK(seg.exprs.back()->info().category == OpCategory::Attention, "an attention step of a {} segment",
             segmentKindName(seg.kind));
    run(seg, inputs, outputs, shape_of, &launch);
  }

  void copy(Tensor& dst, const Tensor& src) override {
    MF_CHECK(dst.dtype() == src.dtype() && dst.numel() == src.numel(), "copy of {} into {}", src.shapeString(),
             dst.shapeString());
    if (src.nbytes() == 0 || dst.data() == src.data()) return;
    ctx_->activate();
    cuda::Submission q(*ctx_);
    // cudaMemcpyDefault: unified addressing tells device from host memory.
    MF_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDefault, q.stream()));
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
    cuda::Submission q(*ctx_);
    cuda::launchKernel(k, grid(n / (vec ? 4 : 1)), dim3(kThreads), 0, q.stream(), args);
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
      cuda::Submission q(*ctx_);
      if (p.bytes > 0)
        MF_CUDA_CHECK(cudaMemcpyAsync(d, s, static_cast<size_t>(p.bytes), cudaMemcpyDeviceToDevice, q.stream()));
      return;
    }
    cuda::BlockCopyDims dims = cuda::kernelDims(p);
    long long total = p.total;
    int rank = p.rank;
    void* args[] = {&d, &s, &total, &rank, &dims};
    cudaKernel_t k = kernels_.get(cuda::runtimeKernelsSource(), cuda::copyBlockKernelName(p.unit));
    cuda::Submission q(*ctx_);
    cuda::launchKernel(k, grid(total), dim3(kThreads), 0, q.stream(), args);
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
    cuda::Submission q(*ctx_);
    MF_CUDA_CHECK(cudaMemcpyAsync(out.data(), staging.get(), t.nbytes(), cudaMemcpyHostToDevice, q.stream()));
    MF_CUDA_CHECK(cudaStreamSynchronize(q.stream()));
    return out;
  }

  Tensor download(const Tensor& t) override {
    if (t.device() != Device::Cuda) return t;
    Tensor out = Tensor::empty(t.dtype(), t.shape());
    if (t.nbytes() == 0) return out;
    ctx_->activate();
    std::shared_ptr<void> staging = CudaContext::pinned(ctx_, t.nbytes());
    {
      cuda::Submission q(*ctx_);
      MF_CUDA_CHECK(cudaMemcpyAsync(staging.get(), t.data(), t.nbytes(), cudaMemcpyDeviceToHost, q.stream()));
      MF_CUDA_CHECK(cudaStreamSynchronize(q.stream()));
    }
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

  // A linear or matmul in its own dtype on cuBLASLt (bf16/f16 on tensor cores); false when the
  // segment needs the kernel IR's lowering instead (sdpa, an empty contraction).
  bool runDirectGemm(const Segment& seg, const std::vector<const Tensor*>& inputs,
                     const std::vector<Tensor*>& outputs) {
    const Expr* e = seg.exprs.front();
    if (e->kind() != OpKind::Linear && e->kind() != OpKind::Matmul) return false;
    std::vector<std::vector<int64_t>> shapes;
    for (const Tensor* t : inputs) shapes.push_back(t->shape());
    cuda::GemmPlan plan = cuda::planGemm(seg, shapes);
    if (plan.k == 0) return false;
    const void* bias = plan.bias_input >= 0 ? inputs[plan.bias_input]->data() : nullptr;
    cuda::Submission q(*ctx_);
    cudaStream_t s = q.stream();
    gemm_.run(plan, inputs[plan.a_input]->data(), inputs[plan.b_input]->data(), bias, outputs.at(0)->data(), s,
              workspace(s), cuda::CublasLtGemm::kWorkspaceBytes);
    return true;
  }

  // A segment lowered to kernel IR: NVRTC kernels for its loop nests, cuBLASLt for its GEMM
  // calls, temporaries in the stream's scratch area.
  struct Program {
    kir::Program program;
    cuda::EmittedProgram emitted;
    std::vector<std::vector<cudaKernel_t>> kernels;          // per step
    std::vector<std::vector<cuda::KirGemmCall>> gemms;       // per step
    std::vector<size_t> offsets;                             // per temporary buffer, in the scratch
    size_t scratch_bytes = 0;
  };

  const Program& program(const Segment& seg, const ShapeFn& shape_of) {
    const cpu::SegmentKey key = cpu::segmentKey(seg, shape_of);
    std::lock_guard<std::mutex> lk(mu_);  // executors on several threads may share a backend
    auto it = programs_.find(key);
    if (it != programs_.end()) return *it->second;
    const int64_t id = static_cast<int64_t>(programs_.size());
    auto p = std::make_unique<Program>();
    const Fusion& fusion = *seg.exprs.at(0)->output()->fusion();
    p->program = kir::lowerSegment(fusion, seg, shape_of, fmt::format("{} {}", segmentKindName(seg.kind), id));
    p->emitted = cuda::emitCuda(p->program, fmt::format("mf{}_{}", id, segmentKindName(seg.kind)),
                                ctx_->properties().sm_count, ctx_->properties().arch());
    for (size_t i = 0; i < p->program.steps.size(); ++i) {
      p->kernels.emplace_back();
      p->gemms.emplace_back();
      if (p->program.steps[i].kind == kir::Step::GemmCall) {
        p->gemms.back() = cuda::planKirGemm(p->program.steps[i].gemm);
        continue;
      }
      for (const cuda::KernelLaunch& l : p->emitted.steps[i]) p->kernels.back().push_back(kernels_.get(p->emitted.source, l.name));
    }
    for (size_t b = 0; b < p->program.buffers.size(); ++b) {
      const kir::Buffer& buf = p->program.buffers[b];
      p->offsets.push_back(p->scratch_bytes);
      if (buf.role == kir::Buffer::Temp)
        p->scratch_bytes += (static_cast<size_t>(buf.numel() * dtypeSize(buf.dtype) * p->emitted.copies[b]) + 255) / 256 * 256;
    }
    for (int64_t bytes : p->emitted.extra_bytes) {  // after the program's buffers (cuda_emitter.h)
      p->offsets.push_back(p->scratch_bytes);
      p->scratch_bytes += (static_cast<size_t>(bytes) + 255) / 256 * 256;
    }
    return *programs_.emplace(key, std::move(p)).first->second;
  }

  void run(const Segment& seg, const std::vector<const Tensor*>& inputs, const std::vector<Tensor*>& outputs,
           const ShapeFn& shape_of, const AttentionLaunch* launch) {
    MF_CHECK(seg.kind != Segment::Kind::Communication, "runSegment of a communication segment");
    MF_CHECK(inputs.size() == seg.inputs.size() && outputs.size() == seg.outputs.size(),
             "a segment launch with {} inputs and {} outputs for {} and {}", inputs.size(), outputs.size(),
             seg.inputs.size(), seg.outputs.size());
    for (const Tensor* t : inputs) requireDevice(*t, "a segment input");
    for (const Tensor* t : outputs) requireDevice(*t, "a segment output");
    checkSegmentBuffersDisjoint(seg, inputs, outputs);  // the kernels' buffers are __restrict__
    ctx_->activate();
    if (launch == nullptr && seg.kind == Segment::Kind::Gemm && runDirectGemm(seg, inputs, outputs)) return;
    runProgram(seg, inputs, outputs, shape_of, launch);
  }

  // The attention kernels' second argument: the launch's row positions (every row at its own
  // position without a launch).
  static cuda::AttentionRowsArg rowsArg(const kir::Attention& a, const AttentionLaunch* launch) {
    cuda::AttentionRowsArg r = cuda::AttentionRowsArg::whole(a.s, a.skv);
    if (launch == nullptr) return r;
    auto blocks = [](const std::vector<AttentionLaunch::Rows>& rows, int64_t n, cuda::AttentionRowsArg::Blocks& b,
                     const char* what) {
      if (rows.empty()) return;
      b = {};
      for (const AttentionLaunch::Rows& x : rows) b.add(x.start, x.count, what);
      MF_CHECK(b.rows() == n, "an attention step's {} blocks cover {} rows of {}", what, b.rows(), n);
    };
    blocks(launch->query, a.s, r.query, "query");
    blocks(launch->key, a.skv, r.key, "key");
    r.accumulate = launch->accumulate ? 1 : 0;
    MF_CHECK(!launch->accumulate || a.wrt >= 0 || (a.lse >= 0 && (a.o >= 0 || a.dv == 0)),
             "an attention step that continues an online softmax needs its log-sum-exp and output");
    return r;
  }

  void runProgram(const Segment& seg, const std::vector<const Tensor*>& inputs, const std::vector<Tensor*>& outputs,
                  const ShapeFn& shape_of, const AttentionLaunch* launch) {
    const Program& p = program(seg, shape_of);
    cuda::Submission q(*ctx_);
    cudaStream_t s = q.stream();
    void* scratch = p.scratch_bytes > 0 ? this->scratch(s, p.scratch_bytes) : nullptr;
    std::vector<void*> ptrs;
    for (const Tensor* t : inputs) ptrs.push_back(const_cast<void*>(t->data()));
    for (Tensor* t : outputs) ptrs.push_back(t->data());
    for (size_t i = 0; i < ptrs.size(); ++i) {
      const kir::Buffer& b = p.program.buffers.at(i);
      const Tensor& t = i < inputs.size() ? *inputs[i] : *outputs[i - inputs.size()];
      MF_CHECK(t.dtype() == b.dtype && t.numel() == b.numel(), "{}: buffer {} is {}{} but the kernel expects {}[{}]",
               p.program.name, i, dtypeName(t.dtype()), t.shapeString(), dtypeName(b.dtype), fmt::join(b.shape, ", "));
    }
    for (size_t i = ptrs.size(); i < p.offsets.size(); ++i)  // temporaries, then the emitter's scratch
      ptrs.push_back(static_cast<char*>(scratch) + p.offsets[i]);
    if (ptrs.empty()) ptrs.push_back(nullptr);  // the kernels' parameter has at least one slot
    for (size_t i = 0; i < p.program.steps.size(); ++i) {
      for (size_t k = 0; k < p.kernels[i].size(); ++k) {
        const cuda::KernelLaunch& l = p.emitted.steps[i][k];
        if (l.blocks == 0) continue;  // no rows (an empty block of an uneven split)
        // The kernels' parameters: every buffer pointer, by value; an attention kernel's positions.
        cuda::AttentionRowsArg rows;
        if (l.attention_rows) rows = rowsArg(p.program.steps[i].attention, launch);
        void* args[] = {ptrs.data(), &rows};
        cuda::launchKernel(p.kernels[i][k], dim3(static_cast<unsigned>(l.blocks)), dim3(l.threads), 0, s, args);
      }
      for (const cuda::KirGemmCall& g : p.gemms[i]) {
        auto at = [&](int buffer, int64_t offset) { return static_cast<float*>(ptrs.at(buffer)) + offset; };
        gemm_.run(g.plan, at(g.plan.a_input, g.a_offset), at(g.plan.b_input, g.b_offset), nullptr,
                  at(p.program.steps[i].gemm.c.buffer, g.d_offset), s, workspace(s), cuda::CublasLtGemm::kWorkspaceBytes);
      }
    }
  }

  // Kernel temporaries, one area per stream and host thread that grows to the largest program's
  // need: launches on one stream run in order, so the next program this thread enqueues there may
  // reuse it without waiting for anything. Per thread too: two threads enqueueing on one stream
  // (executors sharing the backend, both on stream 0) interleave their launches, and one
  // program's temporaries must survive between its own launches.
  void* scratch(cudaStream_t s, size_t bytes) {
    std::lock_guard<std::mutex> lk(mu_);
    Tensor& t = scratch_[{s, std::this_thread::get_id()}];
    if (!t.defined() || t.nbytes() < bytes) t = allocate(DataType::Bool, {static_cast<int64_t>(bytes)});
    return t.data();
  }

  // One cuBLASLt workspace per stream: GEMMs on different streams may run at the same time.
  void* workspace(cudaStream_t s) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = workspaces_.find(s);
    if (it == workspaces_.end())
      it = workspaces_
               .emplace(s, allocate(DataType::Float, {static_cast<int64_t>(cuda::CublasLtGemm::kWorkspaceBytes / 4)}))
               .first;
    return it->second.data();
  }

  std::shared_ptr<CudaContext> ctx_;
  std::unique_ptr<Streams> streams_;
  cuda::KernelCache kernels_;
  cuda::CublasLtGemm gemm_;
  std::mutex mu_;  // guards the maps below
  std::map<cudaStream_t, Tensor> workspaces_;  // a GEMM uses its workspace within one launch
  std::map<std::pair<cudaStream_t, std::thread::id>, Tensor> scratch_;
  std::unordered_map<cpu::SegmentKey, std::unique_ptr<Program>, cpu::SegmentKeyHash> programs_;
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
