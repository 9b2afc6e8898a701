// Values of the fusion IR: TensorViews and scalar constants. Created only through a Fusion.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "meshfuse/ir/dtype.h"
#include "meshfuse/ir/iter_domain.h"

namespace meshfuse {

class Expr;
class Fusion;
class DeviceMesh;

enum class ValKind { TensorView, Scalar };

class Val {
 public:
  virtual ~Val() = default;
  ValKind valKind() const { return kind_; }
  Fusion* fusion() const { return fusion_; }
  DataType dtype() const { return dtype_; }
  Expr* definition() const { return definition_; }
  const std::vector<Expr*>& uses() const { return uses_; }
  // User-given name ("" when unnamed: the printer then names it by position).
  const std::string& name() const { return name_; }

 protected:
  Val(ValKind kind, Fusion* fusion, DataType dtype, std::string name)
      : kind_(kind), fusion_(fusion), dtype_(dtype), name_(std::move(name)) {}
  friend class Fusion;
  ValKind kind_;
  Fusion* fusion_;
  DataType dtype_;
  Expr* definition_ = nullptr;
  std::vector<Expr*> uses_;
  std::string name_;
};

// A constant scalar operand (a Python scalar in `x * 0.5`).
class Scalar : public Val {
 public:
  double value() const { return value_; }

 private:
  friend class Fusion;
  Scalar(Fusion* f, double v, DataType dt) : Val(ValKind::Scalar, f, dt, ""), value_(v) {}
  double value_;
};

// Why a TensorView is sharded the way it is (which input or rule decided it). `text` holds one
// "{}" per entry of `refs`, replaced by the referenced values' display names when rendered:
// positional names (%3) shift as passes insert values, so names are resolved at print time.
struct Provenance {
  std::string text;
  std::vector<const Val*> refs;
  // Joins notes with "; " (e.g. one note per mesh axis).
  static Provenance join(const std::vector<Provenance>& notes);
  // A note without references (its braces are escaped).
  static Provenance literal(std::string_view text);
};

// One recorded loop-domain scheduling step; the printer prints these, the parser replays them.
struct ScheduleStep {
  enum Kind { Split, Merge, Parallelize } kind;
  int64_t axis = 0;
  int64_t factor = 0;                         // Split
  bool inner_split = false;                   // Split
  ParallelType ptype = ParallelType::Serial;  // Parallelize
  bool operator==(const ScheduleStep&) const = default;
};

class TensorView : public Val {
 public:
  // Logical domain: user-visible dims, plus reduction dims left by reducing ops and by Partial.
  const std::vector<IterDomain*>& logical() const { return logical_; }
  // Loop domain: the logical domain after `schedule()` is applied.
  const std::vector<IterDomain*>& loop() const { return loop_; }
  // Allocation domain (derived from the logical domain and the schedule, not stored): the logical
  // domain with the splits applied that lead to a DID-parallelized loop axis, and no others. A
  // DID-split dim is thus allocated at its local extent (the DID axis is one device's index, the
  // remainder is what each device holds); a Stream split (microbatches, overlap chunks) and a
  // merge exist only in the loop domain: the whole dim stays allocated (the seed's `s*`) -- unless
  // a DID split is nested inside the Stream split, which then says which parts are whose.
  // Reduction dims, Partial ones included, appear as in the logical domain.
  std::vector<IterDomain*> allocation() const;
  // What one device allocates: per non-reduction logical dim, the product of the extents of its
  // allocation axes that are not DID-parallelized ([?t, 64] Shard(0) on 4 devices: [?t/4, 64]).
  std::vector<Extent> allocatedShape() const;
  const std::vector<ScheduleStep>& schedule() const { return schedule_; }

  // Non-reduction logical dims: the tensor's global shape as a user sees it.
  std::vector<IterDomain*> dims() const;
  std::vector<Extent> shape() const;
  int64_t rank() const { return static_cast<int64_t>(dims().size()); }
  // The global shape with symbolic sizes bound by `bindings`. Throws ShapeError naming this
  // tensor and the op that defines it when a size is unbound or not an integer, or when the
  // element count or byte size does not fit in an int64.
  std::vector<int64_t> evaluateShape(const SymbolBindings& bindings) const;
  // "%y = reshape(%x, shape=[-1, 3])", or "input %x": where a tensor comes from, for messages.
  std::string describe() const;

  // Device mesh (nullptr: not yet decided). Owned by the Fusion's mesh table.
  const DeviceMesh* mesh() const;
  int64_t meshIndex() const { return mesh_index_; }
  // A TensorView placed by the user (input placements or the schedule API) is pinned:
  // propagation never changes its sharding.
  bool pinned() const { return pinned_; }
  void setPinned(bool p) { pinned_ = p; }
  // The provenance text with current display names ("" when pinned or undecided).
  std::string provenance() const;
  void setProvenance(Provenance p) { provenance_ = std::move(p); }
  const Provenance& provenanceNote() const { return provenance_; }

  // Schedule API (nvFuser-like). Axes index the current loop domain; negative counts from the
  // end. Throw PlacementError/ValueError with the tensor's name on bad arguments.
  TensorView* setDeviceMesh(const DeviceMesh& mesh);
  TensorView* split(int64_t axis, int64_t factor, bool inner_split = false);
  TensorView* merge(int64_t axis);
  TensorView* parallelize(int64_t axis, ParallelType pt);
  // Drops the loop schedule (back to the logical domain), the mesh, the pin and the Partial
  // dims added by addPartialDim, keeping the other logical dims.
  void resetSchedule();
  // Appends a reduction dim of extent `extent` to the logical domain (a Partial placement).
  IterDomain* addPartialDim(int64_t extent);
  int64_t numPartialDims() const { return num_partial_dims_; }
  // Applies one recorded step (split/merge/parallelize); the parser replays schedules with it.
  void applyStep(const ScheduleStep& step);

  // The loop axis parallelized on `pt`, or -1.
  int64_t loopAxisOf(ParallelType pt) const;
  // The logical axis (index into logical()) that loop axis `loop_axis` derives from, or -1
  // when it derives from a merge of several.
  int64_t logicalAxisOf(int64_t loop_axis) const;

 private:
  friend class Fusion;
  TensorView(Fusion* f, DataType dt, std::vector<IterDomain*> logical, std::string name)
      : Val(ValKind::TensorView, f, dt, std::move(name)), logical_(logical), loop_(logical) {}
  int64_t normalizeAxis(int64_t axis, const char* what) const;

  std::vector<IterDomain*> logical_;
  std::vector<IterDomain*> loop_;
  std::vector<ScheduleStep> schedule_;
  int64_t mesh_index_ = -1;
  int64_t num_partial_dims_ = 0;  // the last ones of logical_
  bool pinned_ = false;
  Provenance provenance_;
};

}  // namespace meshfuse
