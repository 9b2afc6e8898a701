// A TensorView's sharding as one state per mesh axis, the currency of propagation and
// decomposition. It is read from and written to the IR (DID splits) through placement.h.
#pragma once

#include <string>
#include <vector>

#include "meshfuse/ir/placement.h"
#include "meshfuse/ir/val.h"

namespace meshfuse {

class TensorView;
class DeviceMesh;
class Fusion;

// State of one mesh axis: Replicate, Shard(dim) with dim indexing tv->dims() (the
// non-reduction logical dims), or Partial (a pending sum over that axis).
using AxisState = Placement;

struct Sharding {
  int64_t mesh = -1;            // index in the Fusion's mesh table; -1: undecided
  std::vector<AxisState> axes;  // one per mesh axis
  bool decided() const { return mesh >= 0; }
  bool operator==(const Sharding&) const = default;
};

// The sharding `tv` carries in the IR (undecided when it has no mesh).
Sharding readSharding(const TensorView* tv);
// Writes `s` into `tv`'s loop domain (replacing its schedule). A Partial axis splits the
// reduction dim `partial_dims[axis]` (a logical index) when >= 0, else adds a Partial dim.
void writeSharding(TensorView* tv, const Sharding& s, const std::vector<int64_t>& partial_dims = {});

std::string toString(const Sharding& s);  // "[Shard(0), Partial()]"

// The provenance of a tensor the user pinned, e.g. "pinned by the user: %a set to [Shard(1)]"
// (the reason a collective that produces it exists).
Provenance pinnedProvenance(const TensorView* tv);

// After a pass gives `to` the place (and name) of `from`: every provenance that named `from`
// names `to` instead (a reason is about the user's value, not the object that held it).
void redirectProvenance(Fusion& f, const TensorView* from, const TensorView* to);

}  // namespace meshfuse
