// An N-d array of device ids (ranks), as torch.distributed.DeviceMesh.
//
// Mesh axis <-> DID parallel type (the ONE place this mapping lives): the LAST mesh axis is
// DIDx (innermost, fastest varying), the one before it DIDy, the one before that DIDz. So a
// [128, 8] mesh has DIDy = 128 (nodes) and DIDx = 8 (GPUs per node), as in the seed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshfuse/ir/parallel_type.h"

namespace meshfuse {

class DeviceMesh {
 public:
  // Mesh axes have the parallel types DIDz, DIDy, DIDx: at most three.
  static constexpr int64_t kMaxRank = 3;

  DeviceMesh() = default;
  // `shape` empty means 1-D over `devices`. Throws MeshError on a malformed mesh
  // (product of shape != number of devices, negative or duplicate ids, rank > 3).
  explicit DeviceMesh(std::vector<int64_t> devices, std::vector<int64_t> shape = {});

  const std::vector<int64_t>& devices() const { return devices_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size() const { return static_cast<int64_t>(devices_.size()); }
  int64_t size(int64_t axis) const;
  bool contains(int64_t device) const;
  // Coordinates of `device` in the mesh; throws MeshError when absent.
  std::vector<int64_t> coordinates(int64_t device) const;
  // The devices that differ from `device` only along `axis`, in axis order (a collective's team).
  std::vector<int64_t> team(int64_t device, int64_t axis) const;
  // Index of `device` along `axis` (its shard index for a DID on that axis).
  int64_t indexAlong(int64_t device, int64_t axis) const;

  // Mesh axis <-> parallel type. Throws PlacementError when the type has no axis in this mesh.
  ParallelType parallelTypeOfAxis(int64_t axis) const;
  int64_t axisOfParallelType(ParallelType pt) const;
  bool hasAxisFor(ParallelType pt) const;

  std::string toString() const;  // nested list form: [[0, 1], [2, 3]]
  bool operator==(const DeviceMesh& o) const { return shape_ == o.shape_ && devices_ == o.devices_; }
  bool operator!=(const DeviceMesh& o) const { return !(*this == o); }

 private:
  std::vector<int64_t> devices_;
  std::vector<int64_t> shape_;
};

}  // namespace meshfuse
