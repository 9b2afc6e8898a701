// DTensor placements <-> IterDomains: the one rule everything relies on (DESIGN.md).
//
//   Shard(d) on mesh axis i (size n): logical dim d is split outer by n and the outer
//                                     IterDomain is parallelized DID[i].
//   Replicate() on mesh axis i:       no IterDomain is parallelized on DID[i].
//   Partial() on mesh axis i:         a reduction IterDomain parallelized on DID[i] (`r{d}`).
//
// Several Shard(d) on one dim split it in mesh-axis order (axis 0 outermost), as torch does.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "meshfuse/ir/extent.h"

namespace meshfuse {

class TensorView;
class DeviceMesh;

struct Placement {
  enum Kind { Shard, Replicate, Partial } kind = Replicate;
  int64_t dim = 0;  // Shard only
  static Placement shard(int64_t d) { return {Shard, d}; }
  static Placement replicate() { return {Replicate, 0}; }
  static Placement partial() { return {Partial, 0}; }
  std::string toString() const;  // "Shard(0)", "Replicate()", "Partial()"
  bool operator==(const Placement&) const = default;
};

std::string placementsToString(const std::vector<Placement>& ps);  // "[Shard(0), Replicate()]"

// Puts `tv` on `mesh` with `placements` (one per mesh axis, negative Shard dims allowed),
// replacing its loop schedule (a Stream split is kept, after the DID splits); pins it. Throws
// PlacementError naming the tensor when the number of placements differs from the mesh rank or
// a Shard dim is out of range. A dim the mesh axis does not divide is sharded unevenly
// (localBlock).
void applyPlacements(TensorView* tv, const DeviceMesh& mesh, const std::vector<Placement>& placements);

// The placements `tv`'s loop domain expresses, one per axis of its mesh. Throws
// PlacementError when the schedule is not expressible as placements (e.g. DID on a merge).
std::vector<Placement> placementsOf(const TensorView* tv);

// A Stream-parallel split (microbatches, overlap chunks): the dims() index it splits and the
// number of chunks (the extent of the Stream axis), or nullopt.
struct StreamSplit {
  int64_t dim;
  int64_t chunks;
};
std::optional<StreamSplit> streamSplitOf(const TensorView* tv);
// Splits what remains of dim `s.dim` after the DID splits outer by `s.chunks` and parallelizes
// the outer part on Stream. Throws ValueError naming the tensor when `s.dim` is not one of its
// dims, and UnsupportedError when its schedule merged that dim into another.
void applyStreamSplit(TensorView* tv, const StreamSplit& s);

// The block of the global tensor that `rank` holds: per non-reduction logical dim, its offset
// and size. Each DID split cuts what the splits outside it left as torch.chunk does (leading
// ranks ceil(n / D), trailing ones less, possibly nothing), several mesh axes on one dim nested
// in mesh-axis order, as torch's DTensor does. A rank outside the mesh, or rank -1, gets the
// block of coordinate 0 on every axis, which is the largest. Symbolic sizes are evaluated under
// `bindings` (ShapeError when unbound). TensorView::allocatedShape() is the printed
// counterpart ("?t/4": the leading ranks' ceil).
std::vector<Span> localBlock(const TensorView* tv, const SymbolBindings& bindings, int64_t rank);
// localBlock() of the global shape `shape` (evaluated already: a full tensor's).
std::vector<Span> localBlockOf(const TensorView* tv, const std::vector<int64_t>& shape, int64_t rank);
// The sizes of localBlock().
std::vector<int64_t> localShape(const TensorView* tv, const SymbolBindings& bindings, int64_t rank);
// Number of devices each non-reduction logical dim is split across.
std::vector<int64_t> shardFactors(const TensorView* tv);

}  // namespace meshfuse
