// One case on every rank and its three checks (run_case.h).
#define OMPI_SKIP_MPICXX 1
#include "run_case.h"

#include <fmt/format.h>
#include <mpi.h>

#include <cstring>
#include <functional>
#include <numeric>

#include "meshfuse/error.h"
#include "meshfuse/executor.h"
#include "lower/host_ir.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/reference.h"
#include "decompose/search_placements.h"
#include "runtime/host_ir_evaluator.h"

namespace meshfuse::placement_fuzz {
namespace {

// Whether any rank says yes (every rank must call it at the same point).
bool anyRank(bool mine) {
  int in = mine ? 1 : 0, out = 0;
  MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return out != 0;
}

int64_t sumOverRanks(int64_t mine) {
  long long in = mine, out = 0;
  MPI_Allreduce(&in, &out, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  return out;
}

std::vector<ShardedTensor> layoutsOf(const CaseSpec& c) {
  std::vector<ShardedTensor> layouts;
  for (const std::vector<Placement>& ps : c.input_placements) layouts.push_back({Tensor(), meshOf(c), ps});
  return layouts;
}

std::string describeCollective(const CollectiveInfo& ci) {
  return fmt::format("{} {} -> {} team [{}] {} bytes ({})", commKindName(ci.kind), ci.source, ci.tensor,
                     fmt::join(ci.team, ","), ci.bytes, ci.provenance);
}

// (b): the executed collectives against the static report, on this rank ("" when equal).
std::string compareCollectives(const std::vector<CollectiveInfo>& ran, const std::vector<CollectiveInfo>& reported) {
  if (ran.size() != reported.size())
    return fmt::format("{} collectives ran, the report lists {}", ran.size(), reported.size());
  for (size_t i = 0; i < ran.size(); ++i) {
    const CollectiveInfo &a = ran[i], &b = reported[i];
    if (a.kind != b.kind || a.team != b.team || a.bytes != b.bytes || a.tensor != b.tensor || a.source != b.source ||
        a.root != b.root)
      return fmt::format("collective {} ran as {}, reported as {}", i, describeCollective(a), describeCollective(b));
  }
  return "";
}

// (a): every output gathered from all ranks against the reference ("" when all match).
std::string compareOutputs(Communicator& world, const Fusion& compiled, const std::vector<ShardedTensor>& outs,
                           const std::vector<Tensor>& reference) {
  Team everyone(world.size());
  std::iota(everyone.begin(), everyone.end(), 0);
  std::string bad;
  for (size_t i = 0; i < outs.size(); ++i) {
    const Tensor& local = outs[i].local;
    // An unpinned output may be split unevenly (torch.chunk sizes), so ranks hold different
    // extents: share the shapes first, then gather blocks padded to the largest.
    const std::vector<int64_t>& mine = local.shape();
    std::vector<int64_t> shapes(mine.size() * static_cast<size_t>(world.size()));
    MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_INT64_T, shapes.data(), static_cast<int>(mine.size()),
                  MPI_INT64_T, MPI_COMM_WORLD);
    int64_t most = 1;
    for (int64_t r = 0; r < world.size(); ++r)
      most = std::max(most, std::accumulate(shapes.begin() + r * mine.size(), shapes.begin() + (r + 1) * mine.size(),
                                            int64_t{1}, std::multiplies<>()));
    Tensor padded(local.dtype(), {most});
    if (local.numel() > 0) std::memcpy(padded.data(), local.data(), local.nbytes());
    Tensor all(local.dtype(), {world.size() * most});
    world.allgather(padded.data(), all.data(), most, local.dtype(), everyone)->wait();
    std::vector<Tensor> blocks;
    for (int64_t r = 0; r < world.size(); ++r) {
      std::vector<int64_t> shape(shapes.begin() + r * mine.size(), shapes.begin() + (r + 1) * mine.size());
      const int64_t n = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
      blocks.push_back(all.slice0(r * most, n).reshaped(shape));
    }
    ReferenceComparison cmp = compareWithReference(assembleGlobal(compiled.outputs()[i], blocks), reference[i]);
    if (!cmp.pass)
      bad += fmt::format("output {} differs from the reference: max abs err {:.3g} (allowed {:.3g}); ", i,
                         cmp.max_abs_err, cmp.allowed_abs);
  }
  return bad;
}

CaseResult verdict(CaseResult::Status status, std::string detail) {
  CaseResult r;
  r.status = status;
  r.detail = std::move(detail);
  return r;
}

}  // namespace

std::unique_ptr<Fusion> placedDefinition(const CaseSpec& c) { return placeInputs(*buildDefinition(c), layoutsOf(c)); }

int64_t plannedWireTimesN(std::unique_ptr<Fusion> placed, int64_t ranks) {
  CompiledProgram program = compile(std::move(placed));
  int64_t total = 0;
  for (int64_t r = 0; r < ranks; ++r)
    for (const CollectiveInfo& ci : collectives(programForRank(program, r), {}))
      total += wireBytesTimesN(ci.kind, ci.bytes, static_cast<int64_t>(ci.team.size()), ranks);
  return total;
}

int64_t plannedWork(std::unique_ptr<Fusion> placed) {
  // The passes up to decomposition, as the plan search measures: later passes add permutes that
  // lay a collective's blocks out contiguously (part of a conversion, which the oracle counts in
  // bytes, not in work).
  runPasses(*placed, {"dead-code-elimination", "expand-for-sharding", "propagate-shardings",
                      "expand-attention-gradients", "decompose-reshardings"});
  return workPerRank(*placed);
}

PlanBounds plannedBounds(std::unique_ptr<Fusion> placed) {
  CompiledProgram program = compile(placed->clone());
  PlanBounds b;
  b.collectives = static_cast<int64_t>(collectives(programForRank(program, 0), {}).size());
  b.work = plannedWork(std::move(placed));
  return b;
}

CaseResult runCase(const CaseSpec& c, Communicator& world) {
  CaseResult res;
  std::unique_ptr<Fusion> def;
  try {
    def = buildDefinition(c);
  } catch (const UserError& e) {
    return verdict(CaseResult::Invalid, e.message());  // (the shrinker made an ill-formed case)
  }
  std::vector<ShardedTensor> inputs = layoutsOf(c);
  std::vector<Tensor> full;
  for (size_t i = 0; i < def->inputs().size(); ++i)
    full.push_back(Tensor::random(DataType::Float, extents(c, c.input_shapes[i]), 100 + i));
  const std::vector<Tensor> reference = evaluateReference(*def, full);
  ExecutorOptions options;
  options.check_inputs = false;  // every rank builds the same inputs from the case
  MultiDeviceExecutor exec(std::move(def), world, nullptr, options);
  // Compiling is deterministic, so every rank throws the same error or none.
  try {
    const CompiledProgram& plan = exec.plan(inputs);
    for (size_t i = 0; i < inputs.size(); ++i) inputs[i].local = shardForRank(plan.fusion->inputs()[i], full[i], world.rank());
  } catch (const UserError& e) {
    // Uneven splits are supported (torch.chunk's blocks): refusing one is a bug, not a clean
    // refusal.
    const bool refused =
        e.kind() == ErrorKind::Unsupported && e.message().find("uneven sharding") == std::string::npos;
    return verdict(refused ? CaseResult::Refused : CaseResult::Fail,
                   fmt::format("{}{}: {}", refused ? "" : "a valid case was rejected: ", errorKindName(e.kind()), e.message()));
  } catch (const std::exception& e) {  // an internal error (a bug): the same on every rank
    return verdict(CaseResult::Fail, fmt::format("compiling threw: {}", e.what()));
  }
  const std::vector<ShardedTensor> outs = exec.run(inputs);
  const std::vector<CollectiveInfo>& ran = exec.lastCollectives();
  const std::string numerics = compareOutputs(world, *exec.plan(inputs).fusion, outs, reference);
  const std::string mine = compareCollectives(ran, collectives(exec.programFor(inputs), {}));
  if (!mine.empty()) std::fprintf(stderr, "[rank %d] %s: %s\n", static_cast<int>(world.rank()), c.name.c_str(), mine.c_str());
  const bool report_differs = anyRank(!mine.empty());
  int64_t wire = 0;
  for (const CollectiveInfo& ci : ran) {
    wire += wireBytesTimesN(ci.kind, ci.bytes, static_cast<int64_t>(ci.team.size()), c.meshSize());
    res.plan += "    " + describeCollective(ci) + "\n";
  }
  res.plan_wire_times_n = sumOverRanks(wire);
  {
    long long in = static_cast<long long>(ran.size()), most = 0;
    MPI_Allreduce(&in, &most, 1, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
    res.plan_bounds.collectives = most;
    res.plan_bounds.work = plannedWork(placedDefinition(c));
  }
  // An unpinned output's placement is meshfuse's choice (DESIGN.md: a Partial output is
  // all-reduced unless its inputs were sharded along a dim it keeps), not a matter of bytes: the
  // oracle gets it as a pin, and judges only the way there.
  CaseSpec judged = c;
  for (size_t i = 0; i < c.outputs.size(); ++i)
    if (judged.output_pins[i].empty()) judged.output_pins[i] = outs[i].placements;
  res.oracle = minimumBytes(judged, res.plan_bounds);
  for (const ShardedTensor& o : outs) res.output_placements.push_back(o.placements);
  const std::string waste = compareWithOracle(res.oracle, res.plan_wire_times_n);
  if (!numerics.empty()) res.detail += "(a) " + numerics;
  if (report_differs) res.detail += "(b) executed collectives differ from the static report" + (mine.empty() ? "" : ": " + mine) + "; ";
  if (!waste.empty()) res.detail += "(c) " + waste;
  res.status = res.detail.empty() ? CaseResult::Pass : CaseResult::Fail;
  return res;
}

std::string report(const CaseSpec& c, const CaseResult& r) {
  std::string s = describeCase(c);
  for (size_t i = 0; i < c.outputs.size(); ++i)
    if (c.output_pins[i].empty() && i < r.output_placements.size())
      s += fmt::format("  (meshfuse gave output %t{} {}: the oracle keeps that)\n", c.outputs[i],
                       placementsToString(r.output_placements[i]));
  s += fmt::format("  failure: {}\n", r.detail);
  const auto n = static_cast<double>(c.meshSize());
  s += fmt::format("  meshfuse's plan (sends {:.1f} bytes over all ranks; rank 0's collectives, bytes in):\n{}",
                   r.plan_wire_times_n / n, r.plan.empty() ? "    (none)\n" : r.plan);
  s += fmt::format("  (meshfuse's plan: {} collectives per rank, {} elements of work per rank)\n", r.plan_bounds.collectives,
                   r.plan_bounds.work);
  if (r.oracle.applicable) {
    s += fmt::format(
        "  the oracle's plan, the best with at most as many collectives and as much work (sends {:.1f} bytes over all "
        "ranks; {} collectives, {} elements of work per rank):\n",
        r.oracle.min_wire_times_n / n, r.oracle.collectives, r.oracle.work);
    for (const std::string& line : r.oracle.lines) s += line + "\n";
  } else {
    s += fmt::format("  the oracle: not applicable ({})\n", r.oracle.why_not);
  }
  return s;
}

}  // namespace meshfuse::placement_fuzz
