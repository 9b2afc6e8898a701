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
