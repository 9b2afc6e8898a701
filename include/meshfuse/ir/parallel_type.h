// How a loop IterDomain is executed: serially, across devices (DIDx/y/z), or across streams.
#pragma once

#include <optional>
#include <string_view>

namespace meshfuse {

#define MESHFUSE_PARALLEL_TYPES(X) \
  X(Serial, "Serial")              \
  X(DIDx, "DIDx")                  \
  X(DIDy, "DIDy")                  \
  X(DIDz, "DIDz")                  \
  X(Stream, "Stream")

enum class ParallelType {
#define MESHFUSE_X(e, s) e,
  MESHFUSE_PARALLEL_TYPES(MESHFUSE_X)
#undef MESHFUSE_X
};

std::string_view parallelTypeName(ParallelType pt);
std::optional<ParallelType> parseParallelType(std::string_view s);
inline bool isDeviceDim(ParallelType pt) {
  return pt == ParallelType::DIDx || pt == ParallelType::DIDy || pt == ParallelType::DIDz;
}
inline constexpr ParallelType kDeviceParallelTypes[] = {ParallelType::DIDx, ParallelType::DIDy,
                                                        ParallelType::DIDz};

}  // namespace meshfuse
