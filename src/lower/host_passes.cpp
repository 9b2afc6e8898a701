// The host passes in the pass registry: each with its precondition, verified after it (the
// host-IR verifier), dumped and timed like the fusion passes (pipeline.cpp).
//
// Order: lower-to-host-ir (decomposed fusion -> collective program), specialize-for-rank (one
// rank's part), assign-streams (stream pools, prefetch, pipeline stages; it moves allocations),
// insert-deallocations (frees after last use, so it must see the final placement).
#include <algorithm>
#include <chrono>

#include "lower/assign_streams.h"
#include "lower/host_ir_verifier.h"
#include "meshfuse/error.h"
#include "meshfuse/ir/fusion.h"
#include "lower/pipeline.h"

namespace meshfuse {
namespace {

bool lowered(const HostProgram& p) { return p.segments != nullptr; }

// Whether insert-deallocations ran: it frees tensors' buffers at the top level. (Lowering frees
// only per-iteration buffers, in loop bodies, and a ring's second slot after its loop.)
bool deallocationsInserted(const HostProgram& p) {
  return std::any_of(p.nodes.begin(), p.nodes.end(),
                     [](const HostNode& n) {
                       const auto* d = n.as<hir::Deallocate>();
                       return d != nullptr && d->slot == 0;
                     });
}

bool hasStreamPool(const std::vector<HostNode>& nodes) {
  bool found = false;
  forEachNode(nodes, [&](const HostNode& n) {
    const auto* l = n.as<hir::ForLoop>();
    found |= l != nullptr && l->stream_pool > 0;
  });
  return found;
}

void requireLowered(const HostProgram& p, const HostPass& pass) {
  MF_USER_CHECK(lowered(p), ErrorKind::Value, "{} needs lower-to-host-ir first: its input is a fusion, not a host "
                "program", pass.name);
}

void requireSpecialized(const HostProgram& p, const HostPass& pass) {
  requireLowered(p, pass);
  MF_USER_CHECK(p.rank >= 0, ErrorKind::Value,
                "{} needs specialize-for-rank first: its input is the collective program of all ranks", pass.name);
}

void lowerPrecondition(const HostProgram& p, const HostPass& pass, int64_t) {
  MF_USER_CHECK(!lowered(p), ErrorKind::Value, "{} runs on a decomposed fusion, not on a host program", pass.name);
  if (p.fusion->inputs().empty()) return;  // (nothing is placed: no mesh to ask for)
  for (const TensorView* tv : p.fusion->tensorViews())
    MF_USER_CHECK(tv->mesh() != nullptr, ErrorKind::Value,
                  "{} needs propagate-shardings and decompose-reshardings first: {} has no device mesh", pass.name,
                  p.fusion->displayName(tv));
}

void specializePrecondition(const HostProgram& p, const HostPass& pass, int64_t rank) {
  requireLowered(p, pass);
  MF_USER_CHECK(p.rank < 0, ErrorKind::Value,
                "{} runs on the collective program (`hostir {{`), but this one is already rank {}'s", pass.name,
                p.rank);
  MF_USER_CHECK(rank >= 0, ErrorKind::Value, "{} needs the rank to keep (--rank=R)", pass.name);
}

void assignStreamsPrecondition(const HostProgram& p, const HostPass& pass, int64_t) {
  requireSpecialized(p, pass);
  MF_USER_CHECK(!deallocationsInserted(p), ErrorKind::Value,
                "{} must run before insert-deallocations: it moves allocations (found a deallocate)", pass.name);
}

void deallocationsPrecondition(const HostProgram& p, const HostPass& pass, int64_t) {
  requireSpecialized(p, pass);
  MF_USER_CHECK(!hasStreamPool(p.nodes), ErrorKind::Value,
                "{} needs assign-streams first: a loop is still marked `on k streams`", pass.name);
  MF_USER_CHECK(!deallocationsInserted(p), ErrorKind::Value,
                "{} has run already: the program has deallocate nodes", pass.name);
}

}  // namespace

const std::vector<HostPass>& hostPasses() {
  static const std::vector<HostPass> passes = {
      {"lower-to-host-ir", "the collective host program of a decomposed fusion (segments, collectives, loops)",
       [](HostProgram& p, const PipelineOptions& o, int64_t) { p = lowerToHostIr(p.fusion, o.overlap); },
       lowerPrecondition},
      {"specialize-for-rank", "keep one rank's work (--rank=R) and resolve teams to global ranks",
       [](HostProgram& p, const PipelineOptions&, int64_t rank) { p = specializeForRank(p, rank); },
       specializePrecondition},
      {"assign-streams", "place stream-pool loops, parameter prefetches and pipeline stages on streams",
       [](HostProgram& p, const PipelineOptions&, int64_t) { assignStreams(p); }, assignStreamsPrecondition,
       /*streams_assigned_after=*/true},
      {"insert-deallocations", "free each intermediate right after its last use",
       [](HostProgram& p, const PipelineOptions&, int64_t) { insertDeallocations(p); }, deallocationsPrecondition,
       /*streams_assigned_after=*/true},
  };
  return passes;
}

const HostPass& findHostPass(std::string_view name) {
  std::vector<std::string> names;
  for (const HostPass& p : hostPasses()) {
    if (p.name == name) return p;
    names.push_back(p.name);
  }
  userError(ErrorKind::Value, "unknown host pass '{}' (known host passes: {})", name, fmt::join(names, ", "));
}

void runHostPasses(HostProgram& program, const std::vector<std::string>& names, const PipelineOptions& options,
                   int64_t rank) {
  for (const std::string& name : names) {
    const HostPass& pass = findHostPass(name);
    if (pass.precondition) pass.precondition(program, pass, rank);
    auto start = std::chrono::steady_clock::now();
    pass.run(program, options, rank);
    auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count();
    if (options.verify) verifyHostIr(program, {.streams_assigned = pass.streams_assigned_after});
    if (options.timing) *options.timing << fmt::format("pass {:<28} {:>8} us\n", name, us);
    if (options.dump) *options.dump << "# ----- host IR after " << name << "\n" << printHostModule(program);
  }
}

HostProgram programForRank(const CompiledProgram& program, int64_t rank, const PipelineOptions& options) {
  HostProgram p = program.host;
  runHostPasses(p, {"specialize-for-rank", "assign-streams", "insert-deallocations"}, options, rank);
  return p;
}

}  // namespace meshfuse
