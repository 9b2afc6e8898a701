// The compilation pipeline: the one function that runs the passes in order (DESIGN.md "Data
// flow"). The CLI, the C++ API and Python all call it.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "lower/host_ir.h"
#include "meshfuse/options.h"

namespace meshfuse {

class Fusion;


struct FusionPass {
  std::string name;         // the CLI's --pass=NAME
  std::string description;  // one line for --help
  std::function<void(Fusion&, const PipelineOptions&)> run;
  // What the pass needs of its input IR (e.g. that propagate-shardings ran): runPasses checks it
  // first and throws a ValueError saying which pass must come before. Empty: nothing.
  std::function<void(const Fusion&, const FusionPass&)> precondition = nullptr;
};

// Every fusion-to-fusion pass, in pipeline order.
const std::vector<FusionPass>& fusionPasses();
// Throws ValueError listing the known passes when `name` is unknown.
const FusionPass& findPass(std::string_view name);
// Runs the named passes in the given order, verifying (and dumping) between them. A pass whose
// precondition does not hold (run out of order) is a ValueError naming the pass it needs first.
void runPasses(Fusion& fusion, const std::vector<std::string>& names, const PipelineOptions& options = {});

// The whole pipeline: a single-device definition whose inputs carry placements becomes a
// decomposed fusion plus the collective host program. A fusion without any mesh is compiled for
// one device: its inputs are placed (replicated) on the mesh [0].
struct CompiledProgram {
  std::shared_ptr<Fusion> fusion;                          // after propagation and decomposition
  HostProgram host;                                        // all ranks together (not specialized)
  std::map<std::string, std::string, std::less<>> stages;  // IR text per stage, when asked for
};

// The stages compile() can keep, in order: "fusion", "propagated", "decomposed", "segmented",
// "hostir".
const std::vector<std::string>& pipelineStages();
// With `keep_stages`, the text of each stage is kept in CompiledProgram::stages.
CompiledProgram compile(std::unique_ptr<Fusion> fusion, const PipelineOptions& options = {}, bool keep_stages = false);
// Whether compiling `fusion` (placed, or decomposed) with other sizes may give another program:
// it has symbolic sizes and chunked loops (overlap asked for, or Stream splits: their default
// chunk counts depend on the rows), or a reshape that splits or merges a symbolic dim (whether a
// shard passes through it depends on the size: torch.chunk's blocks must line up).
// MultiDeviceExecutor compiles such programs for the sizes of each run.
bool compileDependsOnSizes(const Fusion& fusion, const OverlapOptions& options);

// A host pass: a host program in, a host program out (lower-to-host-ir takes a HostProgram
// holding only the decomposed fusion). Each states its contract (requires / guarantees /
// before-after) at the top of its source file; the precondition checks what it needs.
struct HostPass {
  std::string name;         // opt-host's --pass=NAME
  std::string description;  // one line for --help
  // `rank`: the rank specialize-for-rank keeps (-1: not given).
  std::function<void(HostProgram&, const PipelineOptions&, int64_t rank)> run;
  // Throws a ValueError naming the pass that must come first when the input is not what the
  // pass needs. Empty: nothing.
  std::function<void(const HostProgram&, const HostPass&, int64_t rank)> precondition = nullptr;
  // After this pass every stream-pool loop has been placed on streams (the verifier then
  // requires it).
  bool streams_assigned_after = false;
};

// Every host pass, in pipeline order: lower-to-host-ir, specialize-for-rank, assign-streams,
// insert-deallocations.
const std::vector<HostPass>& hostPasses();
// Throws ValueError listing the known host passes when `name` is unknown.
const HostPass& findHostPass(std::string_view name);
// Runs the named host passes in order: each pass's precondition, the pass, then (with
// options.verify) the host-IR verifier; options.dump receives the host program after each pass
// (headed by "# ----- host IR after <pass>", in the parsable form of printHostModule) and
// options.timing each pass's wall time.
void runHostPasses(HostProgram& program, const std::vector<std::string>& names, const PipelineOptions& options = {},
                   int64_t rank = -1);
// What `rank` runs: the host passes specialize-for-rank, assign-streams, insert-deallocations
// run on the collective program.
HostProgram programForRank(const CompiledProgram& program, int64_t rank, const PipelineOptions& options = {});

}  // namespace meshfuse
