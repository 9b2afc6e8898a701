// The CPU backend: segments run as LLVM-JIT kernels and OpenBLAS GEMMs, compiled once per
// (segment structure, local shapes, dtypes) and cached.
//
// A launch: key = segmentKey(seg, shapes) -> cache hit, or lower the segment to kernel IR
// (kir::lowerSegment), emit LLVM IR, optimize and JIT it (counted in stats()) -> run the
// program's steps in order: loop nests through their compiled functions, GEMM calls through
// cblas_sgemm, attention steps through the tiled kernel (attention_kernel.h). Temporaries come from a per-thread scratch area that grows to the largest
// program's need and is reused, so a cached launch allocates nothing; tensors the evaluator
// allocates are recycled by size (host_allocator.h).
#include <cblas.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "meshfuse/ir/fusion.h"
#include "codegen/kernel_ir.h"
#include "runtime/backend.h"
#include "runtime/cpu/attention_kernel.h"
#include "runtime/cpu/host_allocator.h"
#include "codegen/llvm/jit.h"
#include "runtime/cpu/segment_key.h"
#include "runtime/environment.h"

namespace meshfuse {
namespace {

// Per-thread memory for kernel temporaries (64-byte aligned, never shrinks).
class Scratch {
 public:
  ~Scratch() { std::free(data_); }
  std::byte* get(size_t bytes) {
    if (bytes > capacity_) {
      std::free(data_);
      capacity_ = (bytes + 63) / 64 * 64;
      data_ = static_cast<std::byte*>(std::aligned_alloc(64, capacity_));
      MF_CHECK(data_ != nullptr, "out of memory for {} bytes of kernel temporaries", capacity_);
    }
    return data_;
  }

 private:
  std::byte* data_ = nullptr;
  size_t capacity_ = 0;
};

// C = alpha op(A) op(B) + beta C for every batch entry (kir::Gemm's contract).
void runGemm(const kir::Gemm& g, void* const* buffers) {
  auto* a = static_cast<const float*>(buffers[g.a.buffer]) + g.a.offset;
  auto* b = static_cast<const float*>(buffers[g.b.buffer]) + g.b.offset;
  auto* c = static_cast<float*>(buffers[g.c.buffer]) + g.c.offset;
  int64_t total = 1;
  for (const kir::Gemm::BatchDim& d : g.batch) total *= d.extent;
  for (int64_t t = 0; t < total; ++t) {
    int64_t rest = t, oa = 0, ob = 0, oc = 0;
    for (size_t d = g.batch.size(); d-- > 0;) {
      const kir::Gemm::BatchDim& bd = g.batch[d];
      int64_t j = rest % bd.extent;
      rest /= bd.extent;
      oa += j * bd.stride_a, ob += j * bd.stride_b, oc += j * bd.stride_c;
    }
    cblas_sgemm(CblasRowMajor, g.a.trans ? CblasTrans : CblasNoTrans, g.b.trans ? CblasTrans : CblasNoTrans,
                static_cast<blasint>(g.m), static_cast<blasint>(g.n), static_cast<blasint>(g.k),
                static_cast<float>(g.alpha), a + oa, static_cast<blasint>(g.a.ld), b + ob, static_cast<blasint>(g.b.ld),
                static_cast<float>(g.beta), c + oc, static_cast<blasint>(g.c.ld));
  }
}

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  Tensor allocate(DataType dtype, const std::vector<int64_t>& shape) override { return memory_.allocate(dtype, shape); }

  void runSegment(const Segment& seg, const std::vector<const Tensor*>& inputs, const std::vector<Tensor*>& outputs,
                  const ShapeFn& shape_of) override {
    run(seg, inputs, outputs, shape_of, nullptr);
  }

  void runAttentionStep(const Segment& seg, const std::vector<const Tensor*>& inputs,
                        const std::vector<Tensor*>& outputs, const ShapeFn& shape_of,
                        const AttentionLaunch& launch) override {
    MF_CHECK(seg.exprs.back()->info().category == OpCategory::Attention, "an attention step of a {} segment",
             segmentKindName(seg.kind));
    run(seg, inputs, outputs, shape_of, &launch);
  }

  Stats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  void run(const Segment& seg, const std::vector<const Tensor*>& inputs, const std::vector<Tensor*>& outputs,
           const ShapeFn& shape_of, const AttentionLaunch* launch) {
    MF_CHECK(seg.kind != Segment::Kind::Communication, "runSegment of a communication");
    MF_CHECK(inputs.size() == seg.inputs.size() && outputs.size() == seg.outputs.size(),
             "a segment launch with {} inputs and {} outputs for {} and {}", inputs.size(), outputs.size(),
             seg.inputs.size(), seg.outputs.size());
    checkSegmentBuffersDisjoint(seg, inputs, outputs);
    const Compiled& c = compiled(seg, shape_of);
    static thread_local Scratch scratch;
    static thread_local std::vector<void*> ptrs;
    ptrs.clear();
    for (const Tensor* t : inputs) ptrs.push_back(const_cast<void*>(t->data()));
    for (Tensor* t : outputs) ptrs.push_back(t->data());
    std::byte* temps = scratch.get(c.scratch_bytes);
    for (size_t i = ptrs.size(); i < c.program.buffers.size(); ++i) ptrs.push_back(temps + c.temp_offsets[i]);
    for (size_t i = 0; i < inputs.size() + outputs.size(); ++i) {
      const kir::Buffer& b = c.program.buffers[i];
      const Tensor& t = i < inputs.size() ? *inputs[i] : *outputs[i - inputs.size()];
      MF_CHECK(t.dtype() == b.dtype && t.numel() == b.numel(), "{}: buffer {} is {}{} but the kernel expects {}{}",
               c.program.name, i, dtypeName(t.dtype()), t.shapeString(), dtypeName(b.dtype), fmt::join(b.shape, ","));
    }
    for (size_t i = 0; i < c.program.steps.size(); ++i) {
      const kir::Step& step = c.program.steps[i];
      if (c.functions[i] != nullptr) {
        c.functions[i](ptrs.data());
      } else if (step.kind == kir::Step::AttentionCall) {
        const int64_t rounded = step.attention.o_rounded;
        const DataType dt = rounded >= 0 ? c.program.buffers[rounded].dtype : DataType::Float;
        if (step.attention.wrt >= 0) {
          cpu::runAttentionGrad(step.attention, ptrs.data(), launch, dt);
        } else {
          cpu::runAttention(step.attention, ptrs.data(), launch, dt);
        }
      } else {
        runGemm(step.gemm, ptrs.data());
      }
    }
  }

  struct Compiled {
    kir::Program program;
    std::vector<cpu::KernelFn> functions;  // per step; nullptr for a GEMM or attention call
    std::vector<size_t> temp_offsets;      // per buffer: its offset in the scratch area
    size_t scratch_bytes = 0;
  };

  // The kernels' symbol prefix: unique in this backend's JIT, and saying what they compute to
  // whoever reads a profile (MESHFUSE_PERF_MAP=1): mf_4_gelu_mul_sum.
  static std::string symbolPrefix(const Segment& seg, int64_t id) {
    std::string s = fmt::format("mf_{}", id);
    for (const Expr* e : seg.exprs) {
      if (s.size() > 48) break;
      s += '_';
      for (char ch : std::string(e->name())) s += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
    }
    return s;
  }

  const Compiled& compiled(const Segment& seg, const ShapeFn& shape_of) {
    const cpu::SegmentKey key = cpu::segmentKey(seg, shape_of);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) return *it->second;
    auto start = std::chrono::steady_clock::now();
    const int64_t id = static_cast<int64_t>(cache_.size());
    auto c = std::make_unique<Compiled>();
    const Fusion& fusion = *seg.exprs.at(0)->output()->fusion();
    c->program = kir::lowerSegment(fusion, seg, shape_of, fmt::format("{} {}", segmentKindName(seg.kind), id));
    size_t offset = 0;
    for (const kir::Buffer& b : c->program.buffers) {
      c->temp_offsets.push_back(offset);
      if (b.role == kir::Buffer::Temp) offset += (static_cast<size_t>(b.numel() * dtypeSize(b.dtype)) + 63) / 64 * 64;
    }
    c->scratch_bytes = offset;
    cpu::EmittedModule m = cpu::emitModule(c->program, symbolPrefix(seg, id));
    int64_t kernels = 0;
    for (const std::string& f : m.functions) kernels += f.empty() ? 0 : 1;
    if (kernels > 0) {
      if (!jit_) jit_ = std::make_unique<cpu::Jit>(readRuntimeEnvironment().perf_map);
      c->functions = jit_->compile(std::move(m));
    } else {
      c->functions.assign(c->program.steps.size(), nullptr);
    }
    stats_.kernels_compiled += kernels;
    stats_.compile_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return *cache_.emplace(key, std::move(c)).first->second;
  }

  cpu::HostAllocator memory_;
  mutable std::mutex mu_;
  std::unordered_map<cpu::SegmentKey, std::unique_ptr<Compiled>, cpu::SegmentKeyHash> cache_;
  std::unique_ptr<cpu::Jit> jit_;  // created by the first compilation
  Stats stats_;
};

}  // namespace

std::unique_ptr<Backend> makeCpuBackend() { return std::make_unique<CpuBackend>(); }

}  // namespace meshfuse
