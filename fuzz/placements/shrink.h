// Shrinking a failing placement-fuzzer case: fewer outputs and ops (an op's result becomes a
// Replicate input, or an earlier result becomes the output), simpler placements, no pins, smaller
// sizes, a 1-D mesh instead of 2x2. A candidate is kept when it still fails the same way.
#pragma once

#include <functional>

#include "case_spec.h"

namespace meshfuse::placement_fuzz {

// The smallest case found from `c` for which `fails` holds, trying at most `budget` candidates.
// `fails` is called with the same candidates in the same order on every rank.
CaseSpec shrinkCase(CaseSpec c, const std::function<bool(const CaseSpec&)>& fails, int budget);

// `c` keeping only what `outputs` need; the ops flagged in `as_input` become Replicate inputs.
CaseSpec restructure(const CaseSpec& c, const std::vector<int>& outputs, const std::vector<bool>& as_input);

}  // namespace meshfuse::placement_fuzz
