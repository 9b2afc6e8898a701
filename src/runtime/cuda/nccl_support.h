// What the rest of the CUDA runtime needs to know about NCCL without including nccl.h.
#pragma once

#include <string>

namespace meshfuse::cuda {

std::string ncclVersionString();  // "2.28.3"

}  // namespace meshfuse::cuda
