// Allocations that cannot succeed (see memory.h).
#include "runtime/memory.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/sysinfo.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <optional>
#include <set>

#include "meshfuse/error.h"
#include "lower/host_ir.h"
#include "meshfuse/ir/extent.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/placement.h"

namespace meshfuse {
namespace {

constexpr int64_t kUnlimited = std::numeric_limits<int64_t>::max();

// A cgroup limit file's value: bytes, or nullopt for "max" / no such file (not in a cgroup with a
// limit, or cgroup v1's "no limit" of nearly 2^63).
std::optional<int64_t> cgroupLimit(const char* path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return std::nullopt;
  try {
    int64_t v = std::stoll(word);
    if (v <= 0 || v >= (int64_t{1} << 60)) return std::nullopt;
    return v;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

MemoryLimit readHostMemoryLimit() {
  MemoryLimit limit{kUnlimited, ""};
  struct sysinfo si {};
  int64_t swap = 0;
  if (sysinfo(&si) == 0) {
    const int64_t unit = si.mem_unit;
    swap = static_cast<int64_t>(si.totalswap) * unit;
    limit = {static_cast<int64_t>(si.totalram) * unit + swap, "host memory (RAM + swap)"};
  }
  std::optional<int64_t> cgroup = cgroupLimit("/sys/fs/cgroup/memory.max");          // cgroup v2
  if (!cgroup) cgroup = cgroupLimit("/sys/fs/cgroup/memory/memory.limit_in_bytes");  // v1
  if (cgroup && *cgroup + swap < limit.bytes)
    limit = {*cgroup + swap, "host memory (the memory cgroup's limit + swap)"};
  struct rlimit rl {};
  if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
      static_cast<uint64_t>(rl.rlim_cur) < static_cast<uint64_t>(limit.bytes))
    limit = {static_cast<int64_t>(rl.rlim_cur), "address space this process may use (ulimit -v)"};
  if (limit.bytes == kUnlimited) return {};
  return limit;
}

std::string ranksOf(const TensorView* tv) {
  if (tv->mesh() == nullptr) return "";
  const std::vector<int64_t>& d = tv->mesh()->devices();
  return fmt::format(" on rank{} {}", d.size() == 1 ? "" : "s", fmt::join(d, ", "));
}

}  // namespace

const MemoryLimit& hostMemoryLimit() {
  static const MemoryLimit limit = readHostMemoryLimit();
  return limit;
}

std::string formatBytes(int64_t bytes) {
  static const char* const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return fmt::format("{} bytes", bytes);
  double v = static_cast<double>(bytes);
  int u = -1;
  while (v >= 1024 && u < 5) v /= 1024, ++u;
  return v == static_cast<double>(static_cast<int64_t>(v)) ? fmt::format("{} {}", static_cast<int64_t>(v), units[u])
                                                           : fmt::format("{:.1f} {}", v, units[u]);
}

void checkAllocation(const std::string& what, DataType dtype, const std::vector<int64_t>& shape,
                     const MemoryLimit& limit) {
  if (std::any_of(shape.begin(), shape.end(), [](int64_t s) { return s < 0; })) return;  // Tensor's to report
  // (Described only when refused: this runs at every allocation.)
  auto tensor = [&] {
    return fmt::format("{}a {} tensor of shape [{}]", what.empty() ? "" : what + ", ", dtypeName(dtype),
                       fmt::join(shape, ", "));
  };
  std::optional<int64_t> numel = checkedNumel(shape, dtypeSize(dtype));
  MF_USER_CHECK(numel.has_value(), ErrorKind::Runtime, "cannot allocate {}: it has more bytes than an int64 can count",
                tensor());
  const int64_t bytes = *numel * dtypeSize(dtype);
  MF_USER_CHECK(limit.bytes <= 0 || bytes <= limit.bytes, ErrorKind::Runtime,
                "cannot allocate {}: {} bytes ({}), more than the {} of {}", tensor(), bytes, formatBytes(bytes),
                formatBytes(limit.bytes), limit.what);
}

void checkProgramAllocations(const HostProgram& program, const SymbolBindings& sizes, const MemoryLimit& limit) {
  if (limit.bytes <= 0) return;
  std::set<std::pair<const TensorView*, int64_t>> seen;  // a loop's buffers, allocated per iteration
  const BufferSizes buffers(program, sizes);
  forEachNode(program.nodes, [&](const HostNode& node) {
    const auto* a = node.as<hir::Allocate>();
    if (a == nullptr || !seen.insert({a->tv, a->slot}).second) return;
    const hir::Allocate& n = *a;
    std::vector<int64_t> shape;
    try {
      // The largest block of any rank (rank -1: coordinate 0 on every mesh axis), in the first
      // iteration of its loop (the largest chunk): every rank checks the same shapes.
      shape = buffers.bufferShape(n.tv, n.slot, -1, {});
    } catch (const std::exception&) {
      return;  // an unbound size: the run reports it, in its own words
    }
    checkAllocation(program.fusion->displayName(n.tv) + ranksOf(n.tv), n.tv->dtype(), shape, limit);
  });
}

}  // namespace meshfuse
