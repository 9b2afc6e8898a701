// `meshfuse dump --stage=kernels|llvm`: the kernel IR (or the CPU emitter's optimized LLVM IR)
// of every Kernel and Gemm segment one rank launches, specialized for that rank's local shapes
// with the symbolic sizes bound as given. Segments launched on chunks inside a Stream-parallel
// loop are shown for their whole local tensors (at run time they compile for the chunk shapes).
#include <fmt/format.h>

#include <algorithm>

#include "meshfuse/host_ir.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/placement.h"
#include "meshfuse/kernel_ir.h"
#include "meshfuse/pipeline.h"

namespace meshfuse {

std::string dumpKernels(const CompiledProgram& program, int64_t rank, const SymbolBindings& sizes, bool llvm) {
  HostProgram p = programForRank(program, rank);
  std::vector<int64_t> launched;  // segment indices in the order this rank first launches them
  forEachNode(p.nodes, [&](const HostNode& n) {
    if ((n.kind == HostNodeKind::LaunchKernel || n.kind == HostNodeKind::Gemm) &&
        std::find(launched.begin(), launched.end(), n.segment) == launched.end())
      launched.push_back(n.segment);
  });
  std::string out;
  for (int64_t i : launched) {
    const Segment& seg = p.segments->at(i);
    kir::Program k = kir::lowerSegment(
        *program.fusion, seg, [&](const TensorView* tv) { return localShape(tv, sizes); },
        fmt::format("{} #{}", segmentKindName(seg.kind), i));
    out += llvm ? fmt::format("; ----- {}\n{}", k.name, cpuLlvmIr(k)) : printProgram(k);
  }
  return out;
}

}  // namespace meshfuse
