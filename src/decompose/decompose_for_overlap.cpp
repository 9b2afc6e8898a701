// decompose-for-overlap (contract in decompose_for_overlap.h).
#include "decompose/decompose_for_overlap.h"

#include <algorithm>

#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/placement.h"
#include "propagation/sharding.h"
#include "propagation/sharding_rule.h"

namespace meshfuse {
namespace {

enum class Pattern { None, AllgatherGemm, GemmReduceScatter, GemmAllreduce };

struct Change {
  int64_t axis = -1;
  Placement from, to;
};

// The one mesh axis a resharding set changes, or axis -1.
Change changeOf(const Expr* set) {
  Sharding a = readSharding(static_cast<const TensorView*>(set->input(size_t{0}))), b = readSharding(set->output());
  Change c;
  if (!a.decided() || !b.decided() || a.mesh != b.mesh) return c;
  for (size_t i = 0; i < a.axes.size(); ++i) {
    if (a.axes[i] == b.axes[i]) continue;
    if (c.axis >= 0) return {};
    c = {static_cast<int64_t>(i), a.axes[i], b.axes[i]};
  }
  return c;
}

bool isGemm(const Expr* e) { return e != nullptr && e->info().category == OpCategory::Gemm; }

// Whether the GEMM's output rows (dim 0) are its first operand's rows, so that chunking one
// chunks the other.
bool rowsFollowOperand0(const Expr* g) {
  const ShardingRule rule = shardingRuleOf(g);
  const std::vector<int64_t>& map = rule.operand_maps.at(0);
  const TensorView* out = g->output();
  return !map.empty() && map[0] >= 0 && out->logical()[map[0]] == out->dims()[0];
}

Pattern patternOf(const Fusion& f, const Expr* set, const Change& c, const Expr** gemm) {
  if (c.axis < 0) return Pattern::None;
  const auto* in = static_cast<const TensorView*>(set->input(size_t{0}));
  const TensorView* out = set->output();
  if (c.from.kind == Placement::Shard && c.from.dim == 0 && c.to.kind == Placement::Replicate) {
    if (out->uses().size() != 1 || f.isOutput(out)) return Pattern::None;
    const Expr* g = out->uses()[0];
    if (!isGemm(g) || g->input(size_t{0}) != out || g->input(size_t{1}) == out || !rowsFollowOperand0(g))
      return Pattern::None;
    *gemm = g;
    return Pattern::AllgatherGemm;
  }
  if (c.from.kind != Placement::Partial) return Pattern::None;
  const Expr* g = in->definition();
  if (!isGemm(g) || in->uses().size() != 1 || f.isOutput(in) || !rowsFollowOperand0(g)) return Pattern::None;
  *gemm = g;
  if (c.to.kind == Placement::Shard && c.to.dim == 0) return Pattern::GemmReduceScatter;
  if (c.to.kind == Placement::Replicate) return Pattern::GemmAllreduce;
  return Pattern::None;
}

}  // namespace

void decomposeForOverlap(Fusion& f, const OverlapOptions& options) {
  MF_USER_CHECK(options.algorithm == "none" || options.algorithm == "collective" || options.algorithm == "ring",
                ErrorKind::Value, "overlap algorithm must be none, collective or ring but is '{}'", options.algorithm);
  MF_USER_CHECK(options.chunks >= 0, ErrorKind::Value, "overlap chunks must be >= 0 (0: one per device) but is {}",
                options.chunks);
  // Microbatched programs (pipelines) already run in a Stream-parallel loop over microbatches.
  bool microbatched = std::any_of(f.inputs().begin(), f.inputs().end(),
                                  [](const TensorView* in) { return streamSplitOf(in).has_value(); });
  MF_USER_CHECK(!microbatched || options.algorithm == "none", ErrorKind::Unsupported,
                "overlap decomposition (--overlap={}) inside a microbatched pipeline is not supported",
                options.algorithm);
  if (microbatched) return;
  for (Expr* e : f.exprs()) {
    if (e->kind() != OpKind::Set || e->attr<std::string>("overlap") != "none") continue;
    Change c = changeOf(e);
    const Expr* g = nullptr;
    Pattern p = patternOf(f, e, c, &g);
    if (p == Pattern::None) continue;
    const int64_t devices = e->output()->mesh()->size(c.axis);
    if (devices == 1) continue;  // no communication to hide
    // The user's schedule (a Stream split of the GEMM's output rows) or the options decide.
    std::optional<StreamSplit> user = streamSplitOf(g->output());
    if (user && user->dim != 0) user.reset();
    if (!user && options.algorithm == "none") continue;
    std::string algorithm = options.algorithm == "none" ? "collective" : options.algorithm;
    int64_t chunks = user ? user->chunks : options.chunks > 0 ? options.chunks : devices;
    MF_USER_CHECK(algorithm != "ring" || chunks % devices == 0, ErrorKind::Value,
                  "{}: ring-based overlap needs the number of chunks ({}) to be a multiple of the {} devices on mesh "
                  "axis {}",
                  f.displayName(g->output()), chunks, devices, c.axis);
    f.setAttribute(e, "overlap", algorithm);
    f.setAttribute(e, "chunks", chunks);
  }
}

}  // namespace meshfuse
