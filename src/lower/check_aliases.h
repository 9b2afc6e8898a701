// check-aliases: may each in-place update (Fusion::aliasOutputToInput) be written into its
// input's buffer by the segmented program?
//
// requires: segments of the decomposed fusion (segmentFusion).
// guarantees (else UnsupportedError naming the output, the input and the reason): the output is
// written by one generated kernel made only of elementwise ops, which reads the input at the
// element it writes and is the only segment that reads the input. Each element is then read
// before it is overwritten, whatever the kernel's loop order or stream, so the runtime can hand
// the kernel the input's buffer as the output's (no copy, no allocation).
//
//   %m2 = add(mul(%m, 0.9), %g)   output %m2   alias %m2 into %m     accepted: one kernel
//   %s = sum(%m, dims=[0])        ... alias %m2 into %m             rejected: a reduction reads %m
#pragma once

#include <vector>

#include "lower/segment.h"

namespace meshfuse {

class Fusion;

void checkAliases(const Fusion& fusion, const std::vector<Segment>& segments);

}  // namespace meshfuse
