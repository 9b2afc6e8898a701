// Context parallelism: the choice per mesh axis (contract in context_parallel.h; the option's
// names are in src/ir/options.cpp).
#include "propagation/context_parallel.h"

#include <fmt/format.h>

#include "meshfuse/error.h"
#include "meshfuse/ir/fusion.h"

namespace meshfuse {

namespace {

// Attention's operands are [batch, heads, seq, e]: query, key, value (then, for gradients, more).
constexpr int64_t kHeads = 1, kSeq = 2;
constexpr size_t kQuery = 0, kKey = 1, kValue = 2;

class Chooser {
 public:
  Chooser(const Fusion& f, const Expr* e, const OperandStates& ops, const DeviceMesh& mesh, ContextParallel option)
      : f_(f), e_(e), ops_(ops), mesh_(mesh), option_(option) {}

  std::optional<CpChoice> on(int64_t a) const {
    if (!keysSplit(a)) return std::nullopt;
    const int64_t n = mesh_.size(a);
    if (ulyssesAxes()[a]) {
      return CpChoice{CpStrategy::Ulysses,
                      fmt::format("Ulysses: {} runs on whole sequences for 1/{} of the heads, as its key and value "
                                  "sequence arrives split on mesh axis {} (all-to-alls move the fewest bytes)",
                                  e_->name(), n, a)};
    }
    const std::optional<size_t> unsplit = notSequenceSplit(a);
    const bool even = sequenceDivides(a);
    if (option_ == ContextParallel::Ring && (!ringOp() || unsplit || !even)) ringDoesNotApply(a, unsplit);
    if (keysRotate(option_) && ringOp() && !unsplit && even) {
      return CpChoice{CpStrategy::Ring,
                      fmt::format("ring attention: each rank keeps its query rows while k and v rotate around mesh "
                                  "axis {} ({} send/recv steps, at most a block in flight){}",
                                  a, n - 1, ulyssesWhyNot(a))};
    }
    return CpChoice{CpStrategy::Gather, fmt::format("k and v all-gathered along mesh axis {}{}", a,
                                                    option_ == ContextParallel::Gather ? " (--cp=gather)" : "")};
  }

 private:
  // The attention ops whose blocks can rotate: sdpa and sdpa_lse (k and v rotate), and an
  // sdpa_grad with its lse and delta (ops.def: the blocks of the side its rows are not).
  bool ringOp() const {
    return e_->kind() == OpKind::Sdpa || e_->kind() == OpKind::SdpaLse ||
           (e_->kind() == OpKind::SdpaGrad && e_->input("lse") != nullptr);
  }
  bool splitOnSeq(size_t i, int64_t a) const {
    return i < ops_.size() && ops_[i] && (*ops_[i])[a] == Placement::shard(kSeq);
  }
  // The keys' or values' sequence is split on axis `a`: every query row needs what other ranks hold.
  bool keysSplit(int64_t a) const { return splitOnSeq(kKey, a) || splitOnSeq(kValue, a); }
  const TensorView* operand(size_t i) const {
    const Val* v = i < e_->inputs().size() ? e_->inputs()[i] : nullptr;
    return v != nullptr && v->valKind() == ValKind::TensorView ? static_cast<const TensorView*>(v) : nullptr;
  }

  // The heads already split by axes the sequence is not split on (tensor parallelism).
  int64_t headsSplitElsewhere() const {
    int64_t split = 1;
    for (int64_t b = 0; b < mesh_.rank(); ++b) {
      if (keysSplit(b)) continue;
      bool heads = false;
      for (size_t i = 0; i < ops_.size(); ++i) heads |= ops_[i] && (*ops_[i])[b] == Placement::shard(kHeads);
      if (heads) split *= mesh_.size(b);
    }
    return split;
  }
  bool headsDivide(int64_t devices) const {
    for (size_t i = 0; i < e_->inputs().size(); ++i)
      if (const TensorView* t = operand(i); t != nullptr && t->rank() > kHeads &&
                                            !t->dims()[kHeads]->extent().divisible(devices))
        return false;
    return true;
  }
  // The axes that take Ulysses: those the keys are split on, inner first, while the heads divide
  // (asked for, every such axis: heads it does not divide are split as torch.chunk splits them).
  std::vector<bool> ulyssesAxes() const {
    std::vector<bool> out(mesh_.rank(), false);
    if (option_ != ContextParallel::Auto && option_ != ContextParallel::Ulysses) return out;
    const bool asked = option_ == ContextParallel::Ulysses;
    int64_t split = headsSplitElsewhere();
    for (int64_t b = mesh_.rank() - 1; b >= 0; --b) {
      if (!keysSplit(b) || (!asked && !headsDivide(split * mesh_.size(b)))) continue;
      out[b] = true;
      split *= mesh_.size(b);
    }
    return out;
  }
  std::string ulyssesWhyNot(int64_t a) const {
    if (option_ != ContextParallel::Auto) return " (--cp=ring)";
    return fmt::format("; Ulysses cannot split the heads ({}) {} more ways", heads(), mesh_.size(a));
  }
  std::string heads() const { return operand(kQuery)->dims()[kHeads]->extent().toString(); }

  // The first of q, k and v that is not split along the sequence on axis `a`.
  std::optional<size_t> notSequenceSplit(int64_t a) const {
    for (size_t i : {kQuery, kKey, kValue})  // (sdpa_lse has no value)
      if (operand(i) != nullptr && !splitOnSeq(i, a)) return i;
    return std::nullopt;
  }

  // Ring attention rotates blocks of one size: the sequence must divide among the axis's devices
  // (torch.chunk's uneven blocks are gathered instead).
  bool sequenceDivides(int64_t a) const {
    const TensorView* q = operand(kQuery);
    int64_t split = mesh_.size(a);
    for (int64_t b = 0; b < mesh_.rank(); ++b)
      if (b != a && splitOnSeq(kQuery, b)) split *= mesh_.size(b);
    return q != nullptr && q->rank() > kSeq && q->dims()[kSeq]->extent().divisible(split);
  }

  std::string where(int64_t a) const {
    return fmt::format("mesh axis {} ({} devices) of mesh {}", a, mesh_.size(a), mesh_.toString());
  }

  [[noreturn]] void ringDoesNotApply(int64_t a, std::optional<size_t> unsplit) const {
    const std::string op = f_.displayName(e_->output());
    if (!ringOp())
      userError(ErrorKind::Unsupported,
                "context parallelism \"ring\" for {}: ring attention applies to sdpa, sdpa_lse and to sdpa_grad with "
                "its lse and delta operands (what autodiff emits), not to this {}; use \"auto\", \"ulysses\" or "
                "\"gather\"",
                op, e_->name());
    if (!unsplit) {
      const TensorView* q = operand(kQuery);
      userError(ErrorKind::Unsupported,
                "context parallelism \"ring\" for {}: ring attention rotates blocks of one size, but the sequence of "
                "{} ({}) does not divide among the {} devices of {}; use \"auto\", \"ulysses\" or \"gather\"",
                op, f_.displayName(q), q->dims()[kSeq]->extent().toString(), mesh_.size(a), where(a));
    }
    const TensorView* t = operand(*unsplit);
    userError(ErrorKind::Unsupported,
              "context parallelism \"ring\" for {}: ring attention needs q, k and v all split along the sequence "
              "(dim 2) on {}, but {} ({}{}) is {} there; use \"auto\", \"ulysses\" or \"gather\"",
              op, where(a), f_.displayName(t), dtypeName(t->dtype()), fmt::format("[{}]", fmt::join(shapeOf(t), ", ")),
              ops_[*unsplit] ? (*ops_[*unsplit])[a].toString() : std::string("undecided"));
  }
  static std::vector<std::string> shapeOf(const TensorView* t) {
    std::vector<std::string> out;
    for (const Extent& x : t->shape()) out.push_back(x.toString());
    return out;
  }

  const Fusion& f_;
  const Expr* e_;
  const OperandStates& ops_;
  const DeviceMesh& mesh_;
  ContextParallel option_;
};

}  // namespace

std::optional<CpChoice> chooseContextParallel(const Fusion& f, const Expr* e, const OperandStates& operands,
                                              const DeviceMesh& mesh, int64_t a, ContextParallel option) {
  if (e->info().category != OpCategory::Attention) return std::nullopt;
  return Chooser(f, e, operands, mesh, option).on(a);
}

}  // namespace meshfuse
