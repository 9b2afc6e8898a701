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

// This rank's number of rows (dim 0) of `tv` once `sizes` bind its extent; nullopt while
// symbolic (or unevenly sharded: that is reported where shapes are bound).
std::optional<int64_t> localRows(const TensorView* tv, const SymbolBindings& sizes) {
  const Extent rows = tv->shape().at(0);
  if (!rows.isStatic() && !sizes.count(rows.symbol())) return std::nullopt;
  const int64_t global = rows.evaluate(sizes), shards = shardFactors(tv).at(0);
  if (global % shards != 0) return std::nullopt;
  return global / shards;
}

// Of two tensors holding the same rows, the one the user named (`a` when both or neither).
const TensorView* userNamed(const TensorView* a, const TensorView* b) {
  return a->name().empty() && !b->name().empty() ? b : a;
}

// Up to `max` values v > 1 with ok(v), in increasing order, within [2, limit].
template <typename Ok>
std::string someValid(int64_t limit, Ok ok, int max = 6) {
  std::vector<int64_t> found;
  for (int64_t v = 2; v <= limit && static_cast<int>(found.size()) < max; ++v)
    if (ok(v)) found.push_back(v);
  return found.empty() ? std::string("none above 1 (leave this pair undecomposed at these sizes)")
                       : fmt::format("{}", fmt::join(found, ", "));
}

// One overlapped pair as the user sees it, and what its chunk count must divide.
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
  // Rows of chunkedRows() per chunk: `s` chunks, except a ring over blocks: s / n per block.
  int64_t unit(OverlapAlgorithm algorithm, int64_t s) const {
    return algorithm == OverlapAlgorithm::Ring && pattern != Pattern::GemmAllreduce ? s / devices : s;
  }
  bool fits(OverlapAlgorithm algorithm, int64_t s, int64_t rows) const {
    return (algorithm != OverlapAlgorithm::Ring || s % devices == 0) && rows % unit(algorithm, s) == 0;
  }
  // "linear %up": the GEMM the gathered rows feed, or the one the reduced result comes from,
  // named by whichever of its output and the collective's output the user named.
  std::string op(const Fusion& f) const {
    const TensorView* named = pattern == Pattern::AllgatherGemm ? gemm->output() : userNamed(y(), gemm->output());
    return fmt::format("{} {}", gemm->name(), f.displayName(named));
  }
  // chunkedRows(), or the GEMM's output when that has the same rows and a name the user gave.
  const TensorView* rowsNamed() const {
    return pattern == Pattern::GemmAllreduce ? userNamed(y(), gemm->output()) : chunkedRows();
  }
  const char* collective() const {
    return pattern == Pattern::AllgatherGemm       ? "allgather"
           : pattern == Pattern::GemmReduceScatter ? "reduce-scatter"
                                                   : "allreduce";
  }
};

// A user-chosen chunk count that does not split the rows: one clear error, the same on every
// rank (sizes are global), before anything runs. `schedule`: the count comes from a Stream split
// of `p.gemm`'s output (else from the overlap option).
[[noreturn]] void unevenChunks(const Fusion& f, const OverlapPair& p, OverlapAlgorithm algorithm, int64_t s,
                               int64_t rows, bool schedule) {
  const std::string gemm_out = f.displayName(p.gemm->output());
  const std::string origin = schedule ? fmt::format("the Stream split split(0, {}) in the schedule of {}", s, gemm_out)
                                      : fmt::format("the overlap option --chunks={}", s);
  const std::string fix = schedule ? fmt::format("split the rows of {} into N stream chunks", gemm_out)
                                   : std::string("use --chunks=N (OverlapOptions::chunks)");
  const std::string which =
      algorithm != OverlapAlgorithm::Ring ? fmt::format("N dividing {}", rows)
      : p.pattern == Pattern::GemmAllreduce
          ? fmt::format("N a multiple of the {} devices dividing {}", p.devices, rows)
          : fmt::format("N a multiple of the {} devices and N/{} dividing {}", p.devices, p.devices, rows);
  userError(ErrorKind::Value,
            "{}: {}-based overlap of its {} in {} chunks ({}) needs the {} rows of {} per rank (dim 0) to split into "
            "{} equal chunks; {} with {}: {}",
            p.op(f), overlapAlgorithmName(algorithm), p.collective(), s, origin, rows, f.displayName(p.rowsNamed()), p.unit(algorithm, s),
            fix, which, someValid(p.devices * rows, [&](int64_t v) { return p.fits(algorithm, v, rows); }));
}

void checkMicrobatches(const Fusion& f, const SymbolBindings& sizes) {
  for (const TensorView* in : f.inputs()) {
    std::optional<StreamSplit> s = streamSplitOf(in);
    if (!s) continue;
    std::optional<int64_t> rows = localRows(in, sizes);
    if (!rows || *rows % s->chunks == 0) continue;
    userError(ErrorKind::Value,
              "{} is split into {} microbatches (split(0, {}), parallelize(0, Stream) in its schedule) but has {} rows "
              "per rank (dim 0), which do not split into {} equal microbatches; give it a number of rows divisible by "
              "{}, or split it into a number of microbatches that divides {} ({})",
              f.displayName(in), s->chunks, s->chunks, *rows, s->chunks, s->chunks, *rows,
              someValid(*rows, [&](int64_t v) { return *rows % v == 0; }));
  }
}

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

// The stream chunks of a GEMM that no collective is paired with split its rows evenly, once
// `sizes` bind them.
void checkStreamChunkedRows(const Fusion& f, const Expr* gemm, const SymbolBindings& sizes) {
  const TensorView* out = gemm->output();
  const int64_t chunks = streamSplitOf(out)->chunks;
  std::optional<int64_t> rows = localRows(out, sizes);
  if (!rows || *rows % chunks == 0) return;
  userError(ErrorKind::Value,
            "{} {}: its Stream split split(0, {}) needs the {} rows of {} per rank (dim 0) to split into {} equal "
            "chunks; split its rows into N stream chunks with N dividing {}: {}",
            gemm->name(), f.displayName(out), chunks, *rows, f.displayName(out), chunks, *rows,
            someValid(*rows, [&](int64_t v) { return *rows % v == 0; }));
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
  if (microbatches) {
    checkMicrobatches(f, sizes);
    return;
  }
  std::set<const Expr*> paired;  // GEMMs whose chunks a marked collective's loop runs
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
    // With the sizes known, every chunk must hold the same number of rows. A chunk count the
    // user chose that does not divide is an error; the default becomes the largest count below
    // it that divides (a ring's: a multiple of the devices), or the pair is left undecomposed,
    // and the collective's provenance says so (dumps and `meshfuse collectives` show it).
    if (std::optional<int64_t> rows = localRows(p.chunkedRows(), sizes); rows && !p.fits(algorithm, chunks, *rows)) {
      if (chosen) unevenChunks(f, p, algorithm, chunks, *rows, user.has_value());
      int64_t fitting = chunks;
      while (fitting > 1 && !p.fits(algorithm, fitting, *rows)) --fitting;
      const bool overlapped = fitting > 1 && p.fits(algorithm, fitting, *rows);
      Provenance note{overlapped
                          ? fmt::format("overlapped in {} chunks, not the default {} (one per device): {{}} has "
                                        "{} rows per rank",
                                        fitting, chunks, *rows)
                          : fmt::format("not overlapped: no {}-based chunk count from 2 to the default {} splits "
                                        "the {} rows of {{}} per rank",
                                        overlapAlgorithmName(algorithm), chunks, *rows),
                      {p.rowsNamed()}};
      e->output()->setProvenance(Provenance::join({e->output()->provenanceNote(), note}));
      if (!overlapped) continue;
      chunks = fitting;
    }
    f.setAttribute(e, "overlap", std::string(overlapAlgorithmName(algorithm)));
    f.setAttribute(e, "chunks", chunks);
    paired.insert(p.gemm);
  }
  for (const Expr* e : f.exprs())
    if (isGemm(e) && streamSplitOf(e->output()) && !paired.count(e)) checkStreamChunkedRows(f, e, sizes);
}

bool chunkingDependsOnSizes(const Fusion& f, const OverlapOptions& options) {
  bool symbolic = false, chunked = options.algorithm != OverlapAlgorithm::None;
  for (const TensorView* in : f.inputs())
    for (const Extent& e : in->shape()) symbolic |= !e.isStatic();
  for (const TensorView* tv : f.tensorViews()) chunked |= streamSplitOf(tv).has_value();
  return symbolic && chunked;
}

}  // namespace meshfuse
