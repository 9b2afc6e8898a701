// Choosing a backend by name, as the front ends' --device / device= options do. The reference
// backend lives here because it runs the reference executor (src/driver/reference_executor.cpp).
#pragma once

#include <memory>
#include <string>

#include "runtime/backend.h"

namespace meshfuse {

// The reference executor's loops, one op at a time: obviously correct, slow. Tests' oracle.
std::unique_ptr<Backend> makeReferenceBackend();
// "cpu", "cuda", "reference", or "auto" (cuda when a device is present, else cpu); ValueError
// otherwise.
std::unique_ptr<Backend> makeBackend(const std::string& device);

}  // namespace meshfuse
