// Reading and writing NumPy .npy files (format 1.0/2.0, C order, little-endian), so the CLI can
// exchange tensors with numpy. numpy has no bfloat16: bf16 tensors are written as f32 and an
// f32 file may be read into a bf16 input (rounded to nearest even).
#pragma once

#include <string>

#include "meshfuse/tensor.h"

namespace meshfuse {

// Throws RuntimeError naming the file on I/O failure or an unsupported layout/dtype.
Tensor readNpy(const std::string& path);
void writeNpy(const std::string& path, const Tensor& t);

}  // namespace meshfuse
