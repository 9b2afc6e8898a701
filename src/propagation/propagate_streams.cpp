// propagate-streams (contract in propagate_streams.h).
#include "propagation/propagate_streams.h"

#include <algorithm>
#include <optional>

#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/placement.h"
#include "propagation/sharding_rule.h"

namespace meshfuse {
namespace {

const TensorView* tensorAt(const Expr* e, size_t i) {
  const Val* v = e->inputs()[i];
  return v != nullptr && v->valKind() == ValKind::TensorView ? static_cast<const TensorView*>(v) : nullptr;
}

void requireRowsSplit(const Fusion& f, const TensorView* tv, const StreamSplit& s) {
  MF_USER_CHECK(s.dim == 0, ErrorKind::Unsupported,
                "{}: microbatches must split dim 0 (its Stream-parallel split is on dim {})", f.displayName(tv), s.dim);
}

}  // namespace

void propagateStreams(Fusion& f) {
  std::optional<int64_t> chunks;
  for (const TensorView* in : f.inputs()) {
    std::optional<StreamSplit> s = streamSplitOf(in);
    if (!s) continue;
    requireRowsSplit(f, in, *s);
    MF_USER_CHECK(!chunks || *chunks == s->chunks, ErrorKind::Unsupported,
                  "{} is split into {} microbatches but another input into {}", f.displayName(in), s->chunks, *chunks);
    chunks = s->chunks;
  }
  if (!chunks) return;
  for (Expr* e : f.exprs()) {
    const ShardingRule rule = shardingRuleOf(e);
    TensorView* out = e->output();
    // Which output logical dim the microbatched rows of the operands become.
    std::optional<int64_t> rows;
    const TensorView* source = nullptr;
    for (size_t i = 0; i < e->inputs().size(); ++i) {
      const TensorView* in = tensorAt(e, i);
      if (in == nullptr || !streamSplitOf(in)) continue;
      int64_t ol = rule.operand_maps.at(i).at(0);
      MF_USER_CHECK(ol >= 0 && !out->dims().empty() && out->logical()[ol] == out->dims()[0], ErrorKind::Unsupported,
                    "{}: {} is split into microbatches along dim 0, which {} does not keep as the rows (dim 0) of its "
                    "output {}; microbatched pipelines need ops that process rows independently",
                    e->name(), f.displayName(in), e->name(), f.displayName(out));
      rows = ol;
      source = in;
    }
    if (!rows) continue;
    // The other operands lined up with those rows are split alike (e.g. a residual input).
    for (size_t i = 0; i < e->inputs().size(); ++i) {
      auto* in = const_cast<TensorView*>(tensorAt(e, i));
      if (in == nullptr || streamSplitOf(in) || in->rank() == 0) continue;
      if (rule.operand_maps.at(i).at(0) != *rows || in->dims()[0]->isBroadcast()) continue;
      MF_USER_CHECK(f.isInput(in), ErrorKind::Unsupported,
                    "{}: {} has rows that line up with the microbatched {} but was computed outside the microbatch "
                    "loop",
                    e->name(), f.displayName(in), f.displayName(source));
      applyStreamSplit(in, {0, *chunks});
    }
    if (!streamSplitOf(out)) applyStreamSplit(out, {0, *chunks});
  }
}

}  // namespace meshfuse
