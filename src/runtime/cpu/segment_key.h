// The compile-cache key of a segment launch: a 128-bit hash of everything a kernel is
// specialized for — op kinds, attributes, dtypes, scalar operands, how values flow between the
// segment's ops, and the local shape of every value — and of nothing else (not the Fusion or
// Segment objects' addresses). Two structurally equal segments (the same layer twice, or a new
// Fusion compiled from the same text) share compiled code.
#pragma once

#include <cstdint>
#include <functional>

#include "runtime/backend.h"

namespace meshfuse::cpu {

struct SegmentKey {
  uint64_t a = 0, b = 0;
  bool operator==(const SegmentKey&) const = default;
};

struct SegmentKeyHash {
  size_t operator()(const SegmentKey& k) const { return static_cast<size_t>(k.a); }
};

SegmentKey segmentKey(const Segment& seg, const ShapeFn& shape_of);

}  // namespace meshfuse::cpu
