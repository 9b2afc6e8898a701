// DeviceMesh and the mesh-axis <-> DID mapping (the only place it is defined).
#include "meshfuse/ir/device_mesh.h"

#include <algorithm>
#include <set>

#include "meshfuse/error.h"

namespace meshfuse {

std::string_view parallelTypeName(ParallelType pt) {
  switch (pt) {
#define MESHFUSE_X(e, s) \
  case ParallelType::e: return s;
    MESHFUSE_PARALLEL_TYPES(MESHFUSE_X)
#undef MESHFUSE_X
  }
  MF_CHECK(false, "unknown parallel type");
}

std::optional<ParallelType> parseParallelType(std::string_view s) {
#define MESHFUSE_X(e, str) \
  if (s == str) return ParallelType::e;
  MESHFUSE_PARALLEL_TYPES(MESHFUSE_X)
#undef MESHFUSE_X
  return std::nullopt;
}

DeviceMesh::DeviceMesh(std::vector<int64_t> devices, std::vector<int64_t> shape)
    : devices_(std::move(devices)), shape_(std::move(shape)) {
  MF_USER_CHECK(!devices_.empty(), ErrorKind::Mesh, "malformed mesh: a mesh needs at least one device");
  if (shape_.empty()) shape_ = {static_cast<int64_t>(devices_.size())};
  MF_USER_CHECK(static_cast<int64_t>(shape_.size()) <= kMaxRank, ErrorKind::Mesh,
                "malformed mesh: rank {} mesh, but at most 3 mesh axes (DIDz, DIDy, DIDx) are supported",
                shape_.size());
  int64_t n = 1;
  for (int64_t s : shape_) {
    MF_USER_CHECK(s > 0, ErrorKind::Mesh, "malformed mesh: axis size {} must be positive", s);
    n *= s;
  }
  MF_USER_CHECK(n == static_cast<int64_t>(devices_.size()), ErrorKind::Mesh,
                "malformed mesh: shape [{}] holds {} devices but {} device ids were given", fmt::join(shape_, ", "), n,
                devices_.size());
  std::set<int64_t> seen;
  for (int64_t d : devices_) {
    MF_USER_CHECK(d >= 0, ErrorKind::Mesh, "malformed mesh: device id {} is negative", d);
    MF_USER_CHECK(seen.insert(d).second, ErrorKind::Mesh, "malformed mesh: device id {} appears twice", d);
  }
}

int64_t DeviceMesh::size(int64_t axis) const {
  MF_USER_CHECK(axis >= 0 && axis < rank(), ErrorKind::Mesh, "mesh axis {} is out of range for a rank-{} mesh {}", axis,
                rank(), toString());
  return shape_[axis];
}

bool DeviceMesh::contains(int64_t device) const {
  return std::find(devices_.begin(), devices_.end(), device) != devices_.end();
}

std::vector<int64_t> DeviceMesh::coordinates(int64_t device) const {
  auto it = std::find(devices_.begin(), devices_.end(), device);
  MF_USER_CHECK(it != devices_.end(), ErrorKind::Mesh, "device {} is not in mesh {}", device, toString());
  int64_t linear = it - devices_.begin();
  std::vector<int64_t> coords(shape_.size());
  for (int64_t a = rank() - 1; a >= 0; --a) {
    coords[a] = linear % shape_[a];
    linear /= shape_[a];
  }
  return coords;
}

std::vector<int64_t> DeviceMesh::team(int64_t device, int64_t axis) const {
  std::vector<int64_t> c = coordinates(device);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < size(axis); ++i) {
    c[axis] = i;
    int64_t linear = 0;
    for (int64_t a = 0; a < rank(); ++a) linear = linear * shape_[a] + c[a];
    out.push_back(devices_[linear]);
  }
  return out;
}

int64_t DeviceMesh::indexAlong(int64_t device, int64_t axis) const { return coordinates(device).at(axis); }

ParallelType DeviceMesh::parallelTypeOfAxis(int64_t axis) const {
  MF_USER_CHECK(axis >= 0 && axis < rank(), ErrorKind::Placement, "mesh axis {} is out of range for a rank-{} mesh",
                axis, rank());
  return kDeviceParallelTypes[rank() - 1 - axis];  // last axis is DIDx
}

int64_t DeviceMesh::axisOfParallelType(ParallelType pt) const {
  for (int64_t a = 0; a < rank(); ++a)
    if (parallelTypeOfAxis(a) == pt) return a;
  userError(ErrorKind::Placement, "{} is beyond the axes of rank-{} mesh {} (which has {})", parallelTypeName(pt),
            rank(), toString(),
            rank() == 1   ? "DIDx"
            : rank() == 2 ? "DIDy, DIDx"
                          : "DIDz, DIDy, DIDx");
}

bool DeviceMesh::hasAxisFor(ParallelType pt) const {
  for (int64_t a = 0; a < rank(); ++a)
    if (parallelTypeOfAxis(a) == pt) return true;
  return false;
}

std::string DeviceMesh::toString() const {
  // Nested list, innermost axis last: a [2, 2] mesh prints as [[0, 1], [2, 3]].
  std::vector<int64_t> block(shape_.size(), 1);  // devices in one block of each axis
  for (int64_t a = rank() - 1, b = 1; a >= 0; --a) block[a] = (b *= shape_[a]);
  std::string out;
  for (size_t i = 0; i < devices_.size(); ++i) {
    int64_t pos = static_cast<int64_t>(i);
    for (int64_t a = 0; a < rank(); ++a)
      if (pos % block[a] == 0) out += "[";
    out += std::to_string(devices_[i]);
    for (int64_t a = 0; a < rank(); ++a)
      if ((pos + 1) % block[a] == 0) out += "]";
    if (i + 1 < devices_.size()) out += ", ";
  }
  return out;
}

}  // namespace meshfuse
