// The CUDA C emitter: kernel IR programs (meshfuse/kernel_ir.h, the same IR the CPU's LLVM
// emitter reads) -> CUDA C for NVRTC, and how to launch it.
//
// The IR's loop nests are target-neutral; the emitter decides the parallelization. A nest's
// outer perfect loops (the loops every stage of the segment shares) are independent iterations.
// Two mappings:
//
//   thread mode  one thread per outer iteration (grid-stride), the body run serially: pointwise
//                chains (the body has no loop), and bodies with little inner work
//   block mode   one block per outer iteration (grid-stride over blocks), the body run by the
//                block: each inner loop's iterations spread over the threads; a loop that
//                accumulates (sum/max/min) keeps per-thread partials, combined by a warp-shuffle
//                + shared-memory block reduction; __syncthreads() after loops that store, so the
//                next stage of the same row sees them. Rows of softmax, layer_norm, rms_norm and
//                reductions over the last dims take this path.
//
// A loop whose iterations are not independent in a way the emitter can prove (an accumulator it
// cannot identify as a reduction, a store whose index does not vary with the loop) runs serially
// in every thread, with stores by thread 0 only: slower, still correct. Two shapes of
// accumulation are recognized instead: an accumulation over serial outer loops of a nest
// (a reduction over a dim that is not innermost) runs in *columns* mode (32 consecutive outer
// iterations per block, one per lane, the block's warps splitting the serial loops), and an
// accumulation loop inside a row (`b[I] = op(b[I], v)` over loops I does not involve) is split
// over the block's threads with a block reduction. A kernel that is one block with a long
// accumulation first (a full reduction) runs that accumulation as a grid of partial results
// first (a second launch; no atomics, so results are deterministic).
//
// A root made of several independent loop nests becomes one launch each; anything else with no
// shared outer loops runs as one block. Temporaries that hold one outer iteration (their indices
// never involve the outer loops) get a private copy per parallel worker.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codegen/kernel_ir.h"

namespace meshfuse::cuda {

struct KernelLaunch {
  std::string name;  // extern "C" symbol in EmittedProgram::source
  int64_t blocks = 1;
  int threads = 256;
  // The kernel is written for exactly `threads` threads (its registers hold a share of a tile
  // sized for them: the attention kernel); others are correct for any multiple of 32.
  bool exact_threads = false;
  // The kernel takes a second parameter after the buffers: a cuda::AttentionRowsArg, by value
  // (the attention kernels, cuda_attention.h).
  bool attention_rows = false;
};

struct EmittedProgram {
  std::string source;                            // the prelude and every kernel
  std::vector<std::vector<KernelLaunch>> steps;  // per program step, in order (empty for a GEMM; an
                                                 // attention step: its tiled kernel, cuda_attention.h)
  // Per buffer: how many copies of it the runtime must provide (1 except for private
  // temporaries, which kernels index by worker).
  std::vector<int64_t> copies;
  // Scratch the kernels need beyond the program's buffers (the partial results of a full
  // reduction split over the grid), in bytes: the runtime passes them after the program's
  // buffers, in this order.
  std::vector<int64_t> extra_bytes;
};

// `prefix` makes kernel names unique in a process; `sm_count` sizes grids; `arch` (the compute
// capability, 90 for sm_90) decides which instructions kernels may use (attention on tensor cores
// from sm_80). Every kernel takes one argument: the program's buffer pointers, in order, as an
// array of void* by value.
EmittedProgram emitCuda(const kir::Program& program, const std::string& prefix, int sm_count, int arch = 90);

// The helpers every emitted source has after cudaPrelude() (block reductions, literals).
extern const char* kKernelHelpers;

}  // namespace meshfuse::cuda
