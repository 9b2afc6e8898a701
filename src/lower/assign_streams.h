// assign-streams (contract in assign_streams.cpp): independent loop iterations on a pool of
// streams; parameter all-gathers on a communication stream, prefetched one ahead of their use.
#pragma once

#include "lower/host_ir.h"

namespace meshfuse {
void assignStreams(HostProgram& program);
}  // namespace meshfuse
