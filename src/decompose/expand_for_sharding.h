// expand-for-sharding: rewrites the training ops whose sharded form propagation cannot derive
// from a sharding rule alone into ordinary ops whose rules give it (docs/training.md "Sharding").
//
// requires: nothing: it runs before propagate-shardings and reads the placements the user gave
//   the inputs, if any.
// guarantees: the program computes the same values with the same numerics (f32 where the op
//   computes in f32), and
//   - no cross_entropy has reduction="mean": it becomes its "sum" divided by the number of
//     counted targets, both of which a batch-sharded program sums across shards (a mean of
//     shard means would be wrong when shards count different numbers of targets):
//
//       %loss = cross_entropy(%x, %t)            %0 = cross_entropy(%x, %t, reduction="sum")
//                                          =>    %1 = ne(%t, -100)
//                                                %2 = cast(%1, dtype=f32)
//                                                %3 = sum(%2, dims=[0])
//                                                %loss = div(%0, %3)
//
//   - an embedding whose table is a fusion input placed Shard(0) (its rows: the vocabulary) on
//     one mesh axis of n devices becomes the grouped embedding of the table's n row blocks, block
//     k reading the indices shifted by its first row k V/n (rows outside the block read zeros),
//     summed over the blocks. Propagation keeps block k on device k and sums the blocks with an
//     allreduce (Megatron's vocab-parallel embedding), where the plain op would gather the table:
//
//       %y = embedding(%w, %i)                   %0 = reshape(%w, shape=[n, V/n, H])
//       (%w [V, H] Shard(0), n devices)    =>    %1 = cat([%i - 0, %i - V/n, ...] each [1, i...], dim=0)
//                                                %2 = embedding(%0, %1)              [n, i..., H]
//                                                %y = sum(%2, dims=[0])
#pragma once

namespace meshfuse {
class Fusion;
void expandForSharding(Fusion& fusion);
}  // namespace meshfuse
