// The pipeline: passes in order, verified (and optionally dumped and timed) between passes.
// Ordering constraints between passes are stated here and asserted by each pass's checks.
#include "lower/pipeline.h"

#include <chrono>

#include "decompose/decompose_for_overlap.h"
#include "decompose/decompose_reshardings.h"
#include "decompose/decompose_ring_attention.h"
#include "decompose/expand_attention_gradients.h"
#include "decompose/expand_for_sharding.h"
#include "decompose/layout_for_communication.h"
#include "decompose/search_placements.h"
#include "lower/check_aliases.h"
#include "lower/dead_code_elimination.h"
#include "meshfuse/error.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/placement.h"
#include "meshfuse/ir/printer.h"
#include "meshfuse/ir/verifier.h"
#include "propagation/propagate_streams.h"

namespace meshfuse {

namespace {

// The precondition of every pass after propagate-shardings: each tensor has a mesh. (That the
// sets are single-axis, which layout-for-communication and later passes also need, is not
// checked: only decompose-reshardings can tell, by doing it.)
void requirePropagated(const Fusion& f, const FusionPass& pass) {
  for (const TensorView* tv : f.tensorViews())
    MF_USER_CHECK(tv->mesh() != nullptr, ErrorKind::Value,
                  "{} needs propagate-shardings first: {} has no device mesh (run --pass=propagate-shardings,{})",
                  pass.name, f.displayName(tv), pass.name);
}

}  // namespace

const std::vector<FusionPass>& fusionPasses() {
  // Passes that take no options.
  auto plain = [](void (*pass)(Fusion&)) { return [pass](Fusion& f, const PipelineOptions&) { pass(f); }; };
  static const std::vector<FusionPass> passes = {
      {"dead-code-elimination", "remove ops whose results reach no output", plain(eliminateDeadCode)},
      {"expand-for-sharding",
       "rewrite cross_entropy's mean (a sum over a count) and row-sharded embeddings (grouped by row block) "
       "into ops propagation can shard",
       plain(expandForSharding)},
      {"propagate-shardings",
       "give every tensor a mesh and DID axes, from the pinned ones (op by op, then a search for fewer bytes moved)",
       [](Fusion& f, const PipelineOptions& o) { searchPlacements(f, o); }},
      {"expand-attention-gradients", "rewrite each placed sdpa_grad into GEMMs and a softmax backward, sharded alike",
       plain(expandAttentionGradients), requirePropagated},
      {"decompose-reshardings", "split every op into local compute plus single-axis communications",
       plain(decomposeReshardings), requirePropagated},
      {"decompose-ring-attention",
       "let the k and v an sdpa needs whole rotate around the ring (ring attention) instead of being all-gathered",
       [](Fusion& f, const PipelineOptions& o) { decomposeRingAttention(f, o.propagation.context_parallel); },
       requirePropagated},
      {"layout-for-communication", "move each collective's sharded dim outermost (permutes only where needed)",
       plain(layoutForCommunication), requirePropagated},
      {"propagate-streams", "carry the inputs' microbatch split (Stream) to every tensor computed from their rows",
       plain(propagateStreams), requirePropagated},
      {"decompose-for-overlap", "pipeline collectives with their GEMMs in chunks (collective- or ring-based)",
       [](Fusion& f, const PipelineOptions& o) { decomposeForOverlap(f, o.overlap, o.sizes); }, requirePropagated},
  };
  return passes;
}

const FusionPass& findPass(std::string_view name) {
  std::vector<std::string> names;
  for (const FusionPass& p : fusionPasses()) {
    if (p.name == name) return p;
    names.push_back(p.name);
  }
  userError(ErrorKind::Value, "unknown pass '{}' (known passes: {})", name, fmt::join(names, ", "));
}

void runPasses(Fusion& fusion, const std::vector<std::string>& names, const PipelineOptions& options) {
  if (options.verify) verify(fusion);
  for (const std::string& name : names) {
    const FusionPass& pass = findPass(name);
    if (pass.precondition) pass.precondition(fusion, pass);
    auto start = std::chrono::steady_clock::now();
    pass.run(fusion, options);
    auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count();
    if (options.verify) verify(fusion);
    if (options.timing) *options.timing << fmt::format("pass {:<28} {:>8} us\n", name, us);
    // "# -----" lines split a file into cases (meshfuse --split-input-file): the dump reads back.
    if (options.dump) *options.dump << "# ----- IR after " << name << "\n" << printFusion(fusion);
  }
}

const std::vector<std::string>& pipelineStages() {
  static const std::vector<std::string> stages = {"fusion", "propagated", "decomposed", "segmented", "hostir"};
  return stages;
}

CompiledProgram compile(std::unique_ptr<Fusion> fusion, const PipelineOptions& options, bool keep_stages) {
  CompiledProgram out;
  requireOutputs(*fusion);
  if (keep_stages) out.stages["fusion"] = printFusion(*fusion);
  // A single-device fusion (no mesh anywhere) is the program of a one-device mesh.
  if (fusion->numMeshes() == 0)
    for (TensorView* in : fusion->inputs()) applyPlacements(in, DeviceMesh({0}), {Placement::replicate()});
  // Values no output needs are removed first: otherwise they are placed, moved and computed on
  // every rank (a collective for a result nobody reads; found by the placement fuzzer).
  // expand-for-sharding reads the input placements and must run before propagation, which then
  // shards the ops it wrote. propagate-shardings must run before decompose-reshardings:
  // decomposition compares each op's operand shardings with what its output's sharding needs.
  runPasses(*fusion, {"dead-code-elimination", "expand-for-sharding", "propagate-shardings"}, options);
  if (keep_stages) out.stages["propagated"] = printFusion(*fusion);
  // expand-attention-gradients needs the sdpa_grad ops placed (as attention: batch and heads);
  // decompose-reshardings then moves the operands of the ops it writes.
  runPasses(*fusion, {"expand-attention-gradients", "decompose-reshardings"}, options);
  // decompose-ring-attention reads the allgathers decompose-reshardings makes, before
  // layout-for-communication would reorder them (a ring sends whole local blocks);
  // layout-for-communication needs the single-axis sets decompose-reshardings makes;
  // propagate-streams must see every tensor decomposition made; decompose-for-overlap needs the
  // dim-0 collectives layout-for-communication makes and must know the microbatched tensors.
  runPasses(*fusion, {"decompose-ring-attention", "layout-for-communication", "propagate-streams", "decompose-for-overlap"},
            options);
  if (options.verify) verify(*fusion, {.require_meshes = !fusion->inputs().empty() && fusion->inputs()[0]->mesh()});
  if (keep_stages) out.stages["decomposed"] = printFusion(*fusion);
  out.fusion = std::shared_ptr<Fusion>(std::move(fusion));
  out.host.fusion = out.fusion;
  runHostPasses(out.host, {"lower-to-host-ir"}, options);
  // In-place updates are decided on segments: which kernel writes the output, who reads the input.
  checkAliases(*out.fusion, *out.host.segments);
  if (keep_stages) out.stages["segmented"] = printSegments(*out.fusion, *out.host.segments);
  if (keep_stages) out.stages["hostir"] = out.host.toString();
  return out;
}

bool compileDependsOnSizes(const Fusion& f, const OverlapOptions& options) {
  bool symbolic = false, chunked = options.algorithm != OverlapAlgorithm::None, reshaped = false;
  for (const TensorView* in : f.inputs())
    for (const Extent& e : in->shape()) symbolic |= !e.isStatic();
  for (const TensorView* tv : f.tensorViews()) chunked |= streamSplitOf(tv).has_value();
  // A reshape that splits or merges a symbolic dim carries a shard only where torch.chunk's
  // blocks line up, which depends on its size (propagation: carriesShard).
  for (const Expr* e : f.exprs()) {
    if (e->info().category != OpCategory::Reshape) continue;
    const TensorView* in = static_cast<const TensorView*>(e->input(size_t{0}));
    const std::vector<Extent> a = in->shape(), b = e->output()->shape();
    for (const Extent& x : a)
      reshaped |= !x.isStatic() && std::find(b.begin(), b.end(), x) == b.end();
  }
  return symbolic && (chunked || reshaped);
}

}  // namespace meshfuse
