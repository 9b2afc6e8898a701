// The Backend interface: memory, segments (generated kernels and library GEMMs) and streams for
// the host-IR evaluator (DESIGN.md "Host IR").
//
//   reference  the reference executor's loops, per op (the oracle; slow)
//   cpu        LLVM-JIT kernels and BLAS GEMMs, threads as streams
//   cuda       NVRTC kernels, cuBLASLt GEMMs, CUDA streams and events
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/memory.h"
#include "runtime/streams.h"
#include "lower/segment.h"
#include "meshfuse/tensor.h"

namespace meshfuse {

class TensorView;

// The shape of a segment's TensorView in this launch: its local (per-rank) shape, and inside a
// Stream-parallel loop the shape of one chunk. Kernels are specialized for these shapes.
using ShapeFn = std::function<std::vector<int64_t>(const TensorView*)>;

// One launch of an attention segment whose rows are blocks of longer sequences: a step of ring
// attention (an sdpa with its sdpa_lse; src/lower/lower_ring_attention.h), which may continue the
// online softmax of earlier steps, or a causal attention whose query rows are this rank's block
// of the sequence (the keys gathered).
struct AttentionLaunch {
  // Consecutive rows of the global sequence, `start` its first position.
  struct Rows {
    int64_t start = 0, count = 0;
    bool operator==(const Rows&) const = default;
  };
  // Where the local query (key) rows lie in the global sequence, block by block in local order
  // (the blocks cover the local rows). A causal mask compares these global positions; a pair of
  // blocks with nothing to attend is skipped whole.
  std::vector<Rows> query, key;
  // Merge into what the outputs hold (the attention output and the f32 log-sum-exp of the keys
  // attended so far, as an online softmax state) instead of starting afresh: the exact merge of
  // partial attention results by log-sum-exp, in f32. A row that attends no key of this launch
  // keeps its state; one that never attended any has output 0 and log-sum-exp -inf.
  bool accumulate = false;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual Device device() const { return Device::Cpu; }

  // Memory the segments and collectives read and write (uninitialized).
  virtual Tensor allocate(DataType dtype, const std::vector<int64_t>& shape) = 0;
  // The most bytes one tensor in that memory can take (memory.h): a larger allocation cannot
  // succeed and is refused up front, naming the tensor. The default is the host's memory.
  virtual MemoryLimit memoryLimit() const { return hostMemoryLimit(); }

  // Runs a Kernel or Gemm segment. `inputs` align with seg.inputs and `outputs` with
  // seg.outputs (already allocated with their shapes). Compiles on first use of a (segment
  // structure, shapes, dtypes) and reuses the compiled code afterwards.
  virtual void runSegment(const Segment& seg, const std::vector<const Tensor*>& inputs,
                          const std::vector<Tensor*>& outputs, const ShapeFn& shape_of) = 0;
  // Runs an attention segment (an sdpa and/or the sdpa_lse of the same query and key) on rows
  // at the positions `launch` gives, continuing its online softmax when it says so (then both).
  // The default is an UnsupportedError naming the backend: only backends that implement it run
  // ring attention, and causal attention on a block of the query rows.
  virtual void runAttentionStep(const Segment& seg, const std::vector<const Tensor*>& inputs,
                                const std::vector<Tensor*>& outputs, const ShapeFn& shape_of,
                                const AttentionLaunch& launch);

  // dst = src, and dst += src (same dtype and element count): the runtime's own data movement
  // (stage copies, ring reductions). The defaults work on host memory.
  virtual void copy(Tensor& dst, const Tensor& src);
  virtual void accumulate(Tensor& dst, const Tensor& src);
  // dst[dst_offsets + i] = src[src_offsets + i] for i < sizes (a rectangular block of row-major
  // tensors of one rank): local slices and all-to-all packing.
  virtual void copyBlock(const Tensor& src, const std::vector<int64_t>& src_offsets, Tensor& dst,
                         const std::vector<int64_t>& dst_offsets, const std::vector<int64_t>& sizes);

  // Moving tensors to and from the backend's memory (identity for host backends): the
  // evaluator uploads inputs that are not in the backend's memory; callers download outputs.
  virtual Tensor upload(const Tensor& t) { return t; }
  virtual Tensor download(const Tensor& t) { return t; }

  // The streams tasks run on. The default is CpuStreams (threads); a GPU backend overrides it.
  virtual Streams& streams();

  // Compile-time statistics, for --timing and the compile-cache tests.
  struct Stats {
    int64_t kernels_compiled = 0;
    double compile_seconds = 0;
  };
  virtual Stats stats() const { return {}; }

 private:
  std::unique_ptr<Streams> streams_;
};

// Generated kernels take every buffer as restrict/noalias (CPU and CUDA alike): a segment's outputs
// must not overlap one another or any of its inputs (inputs may overlap: they are only read).
// Backends check it before a launch; an overlap is an InternalError naming both buffers.
void checkSegmentBuffersDisjoint(const Segment& seg, const std::vector<const Tensor*>& inputs,
                                 const std::vector<Tensor*>& outputs);

// The CPU backend of the runtime (generated kernels and BLAS GEMMs).
std::unique_ptr<Backend> makeCpuBackend();
// The CUDA backend (NVRTC kernels, cuBLASLt GEMMs, CUDA streams) on this process's GPU. Throws
// RuntimeError "no CUDA device" (with the driver's reason) on machines without one.
std::unique_ptr<Backend> makeCudaBackend();
// Whether a CUDA device is usable here (cudart finds a driver and at least one device).
bool cudaDeviceAvailable();

}  // namespace meshfuse
