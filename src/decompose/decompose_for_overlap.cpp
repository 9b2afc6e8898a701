// decompose-for-overlap (contract in decompose_for_overlap.h).
#include "decompose/decompose_for_overlap.h"

#include <algorithm>
#include <set>

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

// ---- chunk counts against the sizes --------------------------------------------------------

// The most rows (dim 0) of `tv` any rank holds once `sizes` bind its extent (the leading
// shards, torch.chunk's largest); nullopt while symbolic.
std::optional<int64_t> largestRows(const TensorView* tv, const SymbolBindings& sizes) {
  const Extent rows = tv->shape().at(0);
  if (!rows.isStatic() && !sizes.count(rows.symbol())) return std::nullopt;
  return localShape(tv, sizes, -1).at(0);
}

// Of two tensors holding the same rows, the one the user named (`a` when both or neither).
const TensorView* userNamed(const TensorView* a, const TensorView* b) {
  return a->name().empty() && !b->name().empty() ? b : a;
}

// One overlapped pair as the user sees it.
struct OverlapPair {
  Pattern pattern = Pattern::None;
  const Expr* set = nullptr;
  const Expr* gemm = nullptr;
  int64_t devices = 1;

  const TensorView* x() const { return static_cast<const TensorView*>(set->input(size_t{0})); }
  const TensorView* y() const { return set->output(); }
  // The tensor whose per-rank rows each rank cuts into chunks: the shard an allgather sends, or
  // the result a reduction produces (its shard, or all of it for an allreduce).
  const TensorView* chunkedRows() const { return pattern == Pattern::AllgatherGemm ? x() : y(); }
  // chunkedRows(), or the GEMM's output when that has the same rows and a name the user gave.
  const TensorView* rowsNamed() const {
    return pattern == Pattern::GemmAllreduce ? userNamed(y(), gemm->output()) : chunkedRows();
  }
};

// Every Stream split in the schedule is honoured or refused, never dropped: on a pipeline's
// inputs it makes microbatches (every tensor then follows that split); elsewhere it chunks the
// rows of a linear or matmul (with a collective beside it, the pair's chunks; alone, a loop of
// smaller GEMMs on the stream pool).
void checkStreamSplits(const Fusion& f, std::optional<int64_t> microbatches) {
  for (const TensorView* tv : f.tensorViews()) {
    std::optional<StreamSplit> s = streamSplitOf(tv);
    if (!s || f.isInput(tv)) continue;  // (inputs: microbatches, checked by checkMicrobatches)
    if (microbatches) {
      MF_USER_CHECK(s->dim == 0 && s->chunks == *microbatches, ErrorKind::Unsupported,
                    "{}: its Stream split ({} chunks of dim {}) differs from the pipeline's {} microbatches of dim 0: "
                    "inside a microbatched pipeline every tensor is processed one microbatch at a time",
                    f.displayName(tv), s->chunks, s->dim, *microbatches);
      continue;
    }
    MF_USER_CHECK(
        s->dim == 0, ErrorKind::Unsupported,
        "{}: a Stream split of dim {} is not supported: stream chunks are blocks of rows (dim 0); split dim 0 "
        "instead",
        f.displayName(tv), s->dim);
    const Expr* def = tv->definition();
    MF_USER_CHECK(isGemm(def) && rowsFollowOperand0(def), ErrorKind::Unsupported,
                  "{}: a Stream split is supported on the rows of a linear or matmul output (its chunks run as a loop "
                  "of smaller GEMMs on the stream pool) and on the inputs of a pipeline (microbatches), not on the "
                  "output of {}",
                  f.displayName(tv), def ? def->name() : "an input");
  }
}

}  // namespace

void decomposeForOverlap(Fusion& f, const OverlapOptions& options, const SymbolBindings& sizes) {
  MF_USER_CHECK(options.chunks >= 0, ErrorKind::Value, "overlap chunks must be >= 0 (0: one per device) but is {}",
                options.chunks);
  MF_USER_CHECK(options.streams >= 1, ErrorKind::Value,
                "overlap streams must be >= 1 (the pool of streams the iterations of chunked loops rotate through) but "
                "is {}",
                options.streams);
  // Microbatched programs (pipelines) already run in a Stream-parallel loop over microbatches.
  std::optional<int64_t> microbatches;
  for (const TensorView* in : f.inputs())
    if (std::optional<StreamSplit> s = streamSplitOf(in)) microbatches = s->chunks;
  MF_USER_CHECK(!microbatches || options.algorithm == OverlapAlgorithm::None, ErrorKind::Unsupported,
                "overlap decomposition (--overlap={}) inside a microbatched pipeline is not supported",
                overlapAlgorithmName(options.algorithm));
  checkStreamSplits(f, microbatches);
  if (microbatches) return;  // any count: microbatches are torch.chunk's blocks of each rank's rows
  for (Expr* e : f.exprs()) {
    if (e->kind() != OpKind::Set || e->attr<std::string>("overlap") != "none") continue;
    Change c = changeOf(e);
    OverlapPair p;
    p.set = e;
    p.pattern = patternOf(f, e, c, &p.gemm);
    if (p.pattern == Pattern::None) continue;
    p.devices = e->output()->mesh()->size(c.axis);
    if (p.devices == 1) continue;  // no communication to hide
    // The user's schedule (a Stream split of the GEMM's output rows) or the options decide.
    std::optional<StreamSplit> user = streamSplitOf(p.gemm->output());  // dim 0 (checkStreamSplits)
    if (!user && options.algorithm == OverlapAlgorithm::None) continue;
    const OverlapAlgorithm algorithm =
        options.algorithm == OverlapAlgorithm::None ? OverlapAlgorithm::Collective : options.algorithm;
    const bool chosen = user || options.chunks > 0;  // else the default: one chunk per device
    int64_t chunks = user ? user->chunks : options.chunks > 0 ? options.chunks : p.devices;
    MF_USER_CHECK(algorithm != OverlapAlgorithm::Ring || chunks % p.devices == 0, ErrorKind::Value,
                  "{}: ring-based overlap needs the number of chunks ({}) to be a multiple of the {} devices on mesh "
                  "axis {}",
                  f.displayName(p.gemm->output()), chunks, p.devices, c.axis);
    // Chunks are torch.chunk's blocks of each rank's rows: any count works, a chunk may be
    // empty. The default (one per device) is not the user's choice: with the sizes known, a
    // collective-based pair gets no more chunks than its largest shard has rows (more would only
    // be empty), and none where that is one row; the collective's provenance says so (dumps and
    // `meshfuse collectives` show it). A ring keeps one block per device.
    if (std::optional<int64_t> rows = largestRows(p.chunkedRows(), sizes);
        rows && !chosen && algorithm != OverlapAlgorithm::Ring && *rows < chunks) {
      const bool overlapped = *rows >= 2;
      Provenance note{overlapped ? fmt::format("overlapped in {} chunks, not the default {} (one per device): {{}} "
                                               "has {} rows per rank",
                                               *rows, chunks, *rows)
                                 : fmt::format("not overlapped: {{}} has {} row{} per rank, too few for chunks", *rows,
                                               *rows == 1 ? "" : "s"),
                      {p.rowsNamed()}};
      e->output()->setProvenance(Provenance::join({e->output()->provenanceNote(), note}));
      if (!overlapped) continue;
      chunks = *rows;
    }
    f.setAttribute(e, "overlap", std::string(overlapAlgorithmName(algorithm)));
    f.setAttribute(e, "chunks", chunks);
  }
}

}  // namespace meshfuse
