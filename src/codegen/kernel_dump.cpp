// `meshfuse dump --stage=kernels|llvm|cuda`: the kernel IR (or the CPU emitter's optimized LLVM
// IR, or the CUDA emitter's source) of every Kernel and Gemm segment one rank launches, specialized for that rank's local shapes
// with the symbolic sizes bound as given. Segments launched on chunks inside a Stream-parallel
// loop are shown for their whole local tensors (at run time they compile for the chunk shapes).
#include <fmt/format.h>

#include <algorithm>

#include "lower/host_ir.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/placement.h"
#include "codegen/kernel_ir.h"
#include "codegen/kernel_dump.h"
#include "lower/pipeline.h"

namespace meshfuse {

std::vector<kir::Program> kernelPrograms(const CompiledProgram& program, int64_t rank, const SymbolBindings& sizes,
                                         std::vector<int64_t>* segment_indices) {
  HostProgram p = programForRank(program, rank);
  std::vector<int64_t> launched;  // segment indices in the order this rank first launches them
  forEachNode(p.nodes, [&](const HostNode& n) {
    const hir::SegmentCall* call = n.as<hir::LaunchKernel>();
    if (call == nullptr) call = n.as<hir::Gemm>();
    if (call != nullptr && std::find(launched.begin(), launched.end(), call->segment) == launched.end())
      launched.push_back(call->segment);
  });
  std::vector<kir::Program> out;
  for (int64_t i : launched) {
    const Segment& seg = p.segments->at(i);
    out.push_back(kir::lowerSegment(
        *program.fusion, seg, [&](const TensorView* tv) { return localShape(tv, sizes, rank); },
        fmt::format("{} #{}", segmentKindName(seg.kind), i)));
  }
  if (segment_indices != nullptr) *segment_indices = launched;
  return out;
}

std::string dumpKernels(const CompiledProgram& program, int64_t rank, const SymbolBindings& sizes, KernelDump format) {
  std::vector<int64_t> segments;
  std::vector<kir::Program> programs = kernelPrograms(program, rank, sizes, &segments);
  HostProgram p = programForRank(program, rank);
  std::string out;
  for (size_t j = 0; j < programs.size(); ++j) {
    const kir::Program& k = programs[j];
    const int64_t i = segments[j];
    const Segment& seg = p.segments->at(i);
    switch (format) {
      case KernelDump::KernelIr: out += printProgram(k); break;
      case KernelDump::Llvm: out += fmt::format("; ----- {}\n{}", k.name, cpuLlvmIr(k)); break;
      case KernelDump::Cuda:  // the prelude once, at the top; kernel names as the backend makes them
        out += fmt::format("// ----- {}\n{}{}", k.name,
                           seg.kind == Segment::Kind::Gemm
                               ? "// (a linear or matmul runs as one cuBLASLt call in its own dtype where cuBLASLt can "
                                 "express it; this lowering is the fallback, and sdpa's)\n"
                               : "",
                           cudaSource(k, fmt::format("mf{}_{}", i, segmentKindName(seg.kind)), /*sm_count=*/132,
                                      /*with_prelude=*/out.empty()));
        break;
    }
  }
  return out;
}

}  // namespace meshfuse
