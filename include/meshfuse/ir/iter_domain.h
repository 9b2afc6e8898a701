// IterDomain: one axis of a TensorView, and the split/merge transforms between domains.
//
// A TensorView's logical domain lists the user-visible dims (plus reduction dims for ops that
// reduce). Its loop domain is derived from the logical domain by `split`/`merge`; a loop axis
// may be parallelized on a device-mesh axis (DIDx/y/z) or on streams.
#pragma once

#include <string>
#include <vector>

#include "meshfuse/ir/extent.h"
#include "meshfuse/ir/parallel_type.h"

namespace meshfuse {

enum class IterType { Iteration, Reduction, Broadcast };

class IterDomain;

// in -> [outer, inner]. Outer split: outer has extent `factor`. Inner split: inner does.
// Merge: [outer, inner] -> out.
struct IdTransform {
  enum Kind { Split, Merge } kind;
  std::vector<IterDomain*> inputs;
  std::vector<IterDomain*> outputs;
  int64_t factor = 0;        // Split only
  bool inner_split = false;  // Split only
};

class IterDomain {
 public:
  IterDomain(Extent extent, IterType type) : extent_(std::move(extent)), type_(type) {}

  const Extent& extent() const { return extent_; }
  IterType iterType() const { return type_; }
  bool isReduction() const { return type_ == IterType::Reduction; }
  bool isBroadcast() const { return type_ == IterType::Broadcast; }
  ParallelType parallelType() const { return ptype_; }
  bool isDeviceDim() const { return meshfuse::isDeviceDim(ptype_); }
  void parallelize(ParallelType pt) { ptype_ = pt; }
  const IdTransform* definition() const { return definition_; }
  void setDefinition(const IdTransform* t) { definition_ = t; }

  // "64", "?t", "r64", "1" (broadcast), with "DIDx{4}"-style suffix when parallelized.
  std::string toString() const;

 private:
  Extent extent_;
  IterType type_;
  ParallelType ptype_ = ParallelType::Serial;
  const IdTransform* definition_ = nullptr;
};

}  // namespace meshfuse
