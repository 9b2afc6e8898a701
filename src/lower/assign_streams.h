// assign-streams (contract in assign_streams.cpp): parameter all-gathers on a communication
// stream, prefetched one ahead of their use.
#pragma once

#include "meshfuse/host_ir.h"

namespace meshfuse {
void assignStreams(HostProgram& program);
}  // namespace meshfuse
