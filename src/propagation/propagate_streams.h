// propagate-streams: carries the microbatch split of the inputs through the program.
//
// Pipeline parallelism splits the input activations into microbatches: the user splits dim 0
// of a fusion input and parallelizes the outer part on Stream (seed: `s*`, a split of the loop
// domain only; the whole batch stays allocated). Every tensor computed from those rows is then
// processed one microbatch at a time, in one Stream-parallel loop (lower-to-host-ir).
//
// requires: propagate-shardings and decompose-reshardings (the sets that move data between
//   stages are in the program).
// guarantees: every tensor whose dim 0 holds rows of a microbatched input has the same Stream
//   split of dim 0, and so do the other operands an op lines up with those rows (a fusion input
//   such as a residual); an op that would mix rows of different microbatches (a reduction over
//   dim 0, a reshape of it) is a clear UnsupportedError.
//
//   before: %inp = input f32[?t, 16] @s0 {split(0, 4), parallelize(0, Stream)}
//           %a0 = linear(%inp, %w0) : f32[?t, 64, r16] @s0 {}
//   after:  %a0 = linear(%inp, %w0) : f32[?t, 64, r16] @s0 {split(0, 4), parallelize(0, Stream)}
#pragma once

namespace meshfuse {
class Fusion;
void propagateStreams(Fusion& fusion);
}  // namespace meshfuse
