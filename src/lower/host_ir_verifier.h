// The host-IR verifier, run after every host pass (as the fusion verifier runs after every
// fusion pass). A violation is an InternalError "host IR verifier: ..." naming the node: only a
// pass can cause one (opt-host reports a parsed file's violations as a ValueError).
//
// The program is checked by running it symbolically, loops unrolled (trip counts are constants),
// so that each rule holds for every iteration as the evaluator runs it:
//   1. every buffer a node touches is allocated before (fusion inputs are; on a specialized
//      program, tensors on meshes without this rank are other ranks' and not checked);
//   2. no node touches a buffer after its deallocate (until it is allocated again);
//   3. every `wait hN` matches a communication that issued hN in the same iteration and was not
//      waited for yet (the evaluator keys handles by iteration);
//   4. every `wait_event` / `host_wait` of a non-negative instance waits for an instance
//      recorded before it;
//   5. with `streams_assigned` (after assign-streams, before the backend runs the program): no
//      loop is still marked `on k streams`;
//   6. loop-carried buffers are well formed: block and event indices use only enclosing loops'
//      variables, and a buffer allocated inside a loop body is not read in an iteration before
//      that iteration allocates it (a value carried from one iteration to the next must live
//      in a buffer allocated outside the loop).
#pragma once

#include "lower/host_ir.h"

namespace meshfuse {

struct HostVerifyOptions {
  bool streams_assigned = false;  // rule 5
};

void verifyHostIr(const HostProgram& program, const HostVerifyOptions& options = {});

}  // namespace meshfuse
