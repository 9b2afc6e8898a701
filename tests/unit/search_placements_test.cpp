// The plan search after propagate-shardings (decompose/search_placements.h): the three kinds of
// waste the op-by-op decisions leave (the placement fuzzer's shrunk reproducers), what the
// search may not change (outputs' placements, parameters that stay, the collectives and compute
// of the greedy plan as bounds), and where it does not run.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "lower/pipeline.h"
#include "meshfuse/ir/parser.h"
#include "propagation/sharding.h"
#include "test_helpers.h"

namespace meshfuse {
namespace {

using ::testing::ElementsAre;
using Strings = std::vector<std::string>;

PipelineOptions plan(const std::string& how) {
  PipelineOptions o;
  findCompileOption("plan").set(o, how);
  return o;
}

// Rank 0's collectives as "kind tensor-in bytes-in".
Strings collectivesOf(const std::string& text, const std::string& how = "search", const SymbolBindings& sizes = {}) {
  CompiledProgram p = compile(parseFusion(text, "t.mf"), plan(how));
  Strings out;
  for (const CollectiveInfo& c : collectives(programForRank(p, 0), sizes))
    out.push_back(fmt::format("{} {} {}", commKindName(c.kind), c.source, c.bytes));
  return out;
}

Strings outputShardings(const std::string& text, const std::string& how) {
  CompiledProgram p = compile(parseFusion(text, "t.mf"), plan(how));
  Strings out;
  for (const TensorView* o : p.fusion->outputs()) out.push_back(toString(readSharding(o)));
  return out;
}

// A pending sum read by two consumers: reduced once, before both, not once per consumer.
constexpr const char* kPendingSumTwice = R"(fusion {
  mesh @m0 = [0, 1]
  %t0 = input f32[2, 2, 3, 3, r2] @m0 {parallelize(4, DIDx)}
  %t1 = add(%t0, %t0)
  %t2 = mean(%t0, dims=[3])
  %t3 = relu(%t2)
  output %t1, %t3
})";

TEST(SearchPlacements, APendingSumReadTwiceIsReducedOnce) {
  EXPECT_THAT(collectivesOf(kPendingSumTwice, "greedy"), ElementsAre("allreduce %t2 48", "allreduce %0 144"));
  EXPECT_THAT(collectivesOf(kPendingSumTwice), ElementsAre("allreduce %t0 144"));
  EXPECT_EQ(outputShardings(kPendingSumTwice, "search"), outputShardings(kPendingSumTwice, "greedy"));
}

// A contraction over a sharded dim of a small operand: gathering it (8 bytes a rank) would send
// less than slicing the other operand (free) and all-reducing the larger result (16), but every
// rank would then compute the whole product: the search does not replicate compute to save
// bytes (the placement fuzzer's oracle, which counts bytes only, lists such cases as known).
TEST(SearchPlacements, AContractionIsNotReplicatedToSaveBytes) {
  const char* text = R"(fusion {
  mesh @m0 = [0, 1]
  %t0 = input f32[2, 2] @m0 {split(1, 2), parallelize(1, DIDx)}
  %t1 = input f32[2, 2] @m0 {}
  %t2 = matmul(%t0, %t1)
  output %t2
})";
  EXPECT_THAT(collectivesOf(text, "greedy"), ElementsAre("allreduce %1 16"));
  EXPECT_THAT(collectivesOf(text), ElementsAre("allreduce %1 16"));
}

// neg reads the %t0 that max gathers, as a slice of its columns (free), so that mean sums whole
// columns: its output is one rank's 4 bytes to gather instead of 8 to all-reduce. The output
// stays Replicate(), as the greedy plan places it: the allgather is the set that keeps it so.
constexpr const char* kColumnsOfAGatheredValue = R"(fusion {
  mesh @m0 = [0, 1]
  %t0 = input f32[2, 2] @m0 {split(0, 2), parallelize(0, DIDx)}
  %t1 = max(%t0, dims=[0])
  %t2 = neg(%t0)
  %t3 = mean(%t2, dims=[0])
  %t4 = neg(%t3)
  output %t1, %t4
})";

TEST(SearchPlacements, AnOutputKeepsItsPlacementThroughACheaperPlan) {
  EXPECT_THAT(collectivesOf(kColumnsOfAGatheredValue, "greedy"), ElementsAre("allgather %t0 8", "allreduce %2 8"));
  EXPECT_THAT(collectivesOf(kColumnsOfAGatheredValue), ElementsAre("allgather %t0 8", "allgather %2 4"));
  EXPECT_EQ(outputShardings(kColumnsOfAGatheredValue, "search"), outputShardings(kColumnsOfAGatheredValue, "greedy"));
}

// max over a pending sum: a reduce-scatter, max on each rank's rows and an allgather of the
// (smaller) result would send less than an allreduce of the input, but in two collectives: the
// search never adds a collective (nor work) to what the greedy plan has.
TEST(SearchPlacements, APlanOfMoreCollectivesIsNotTaken) {
  const char* text = R"(fusion {
  mesh @m0 = [0, 1]
  %t0 = input f32[6, 8, 4, r2] @m0 {parallelize(3, DIDx)}
  %t1 = max(%t0, dims=[1])
  output %t1
})";
  EXPECT_THAT(collectivesOf(text), ElementsAre("allreduce %t0 768"));
}

// Nor does it replicate compute to save bytes: with the batch split (data parallelism) the
// weight gradients' pending sums are all-reduced, though gathering the small batch would send
// less (each rank would then compute the whole batch).
TEST(SearchPlacements, DataParallelComputeStaysSplit) {
  const char* text = R"(fusion {
  mesh @m0 = [0, 1]
  %x = input f32[8, 8] @m0 {split(0, 2), parallelize(0, DIDx)}
  %dy = input f32[8, 64] @m0 {split(0, 2), parallelize(0, DIDx)}
  %dyt = permute(%dy, dims=[1, 0])
  %dw = matmul(%dyt, %x)
  output %dw
})";
  EXPECT_THAT(collectivesOf(text), ElementsAre("allreduce %0 2048"));
}

// Parameters never move (the documented priority), even where gathering the weight would send
// far less than all-reducing the product.
TEST(SearchPlacements, AParameterStaysWhereMovingItWouldSendLess) {
  const char* text = R"(fusion {
  mesh @m0 = [0, 1]
  %x = input f32[64, 8] @m0 {}
  %w = input f32[4, 8] @m0 {split(1, 2), parallelize(1, DIDx)}
  %y = linear(%x, %w)
  output %y
})";
  EXPECT_THAT(collectivesOf(text, "greedy"), ElementsAre("allreduce %1 1024"));
  EXPECT_THAT(collectivesOf(text), ElementsAre("allreduce %1 1024"));
}

// Symbolic sizes: what a plan sends depends on them, so the greedy plan stands (the same for
// every size, as the executor compiles it once).
TEST(SearchPlacements, SymbolicSizesKeepTheGreedyPlan) {
  const char* text = R"(fusion {
  mesh @m0 = [0, 1]
  %t0 = input f32[?t, 2] @m0 {split(1, 2), parallelize(1, DIDx)}
  %t1 = input f32[2, 2] @m0 {}
  %t2 = matmul(%t0, %t1)
  output %t2
})";
  EXPECT_THAT(collectivesOf(text, "search", {{"t", 4}}), ElementsAre("allreduce %1 32"));
}

// A pending sum whose relu feeds a layer_norm (an output pinned Shard(0)), a permute pinned
// Shard(0) and an add summed to a whole output. Greedy: all-reduce it for relu, layer_norm on
// rows, whose permute is columns, moved back to rows by an all-to-all. Fewer bytes: reduce-
// scatter it, relu on rows, gather those for layer_norm on the whole, and the permute reads a
// slice of columns (free) that is already rows; the add and sum then read the gathered whole.
// Four decisions change together (the placement fuzzer's s1-w2-c144): any fewer cost more.
constexpr const char* kFourDecisionsAtOnce = R"(fusion {
  mesh @m0 = [0, 1]
  %t0 = input f32[2, 2, r2] @m0 {parallelize(2, DIDx)}
  %t1 = relu(%t0)
  %t2 = layer_norm(%t1) : f32[2, 2] @m0 {split(0, 2), parallelize(0, DIDx)}
  %t3 = permute(%t2, dims=[1, 0]) : f32[2, 2] @m0 {split(0, 2), parallelize(0, DIDx)}
  %t4 = add(%t1, %t1)
  %t5 = sum(%t4, dims=[0])
  output %t3, %t5, %t2
})";

TEST(SearchPlacements, SeveralDecisionsChangeAtOnce) {
  EXPECT_THAT(collectivesOf(kFourDecisionsAtOnce, "greedy"), ElementsAre("allreduce %t0 16", "all_to_all %2 8"));
  EXPECT_THAT(collectivesOf(kFourDecisionsAtOnce), ElementsAre("reduce_scatter %t0 16", "allgather %t1 8"));
  EXPECT_EQ(outputShardings(kFourDecisionsAtOnce, "search"), outputShardings(kFourDecisionsAtOnce, "greedy"));
}

// A program with attention is searched around it (the placement fuzzer's s1-w2-c64): the
// column-parallel %t7 moves to the rows the residual add needs before the second linear (24
// bytes) instead of that linear's pending sum being reduce-scattered (72). The attention keeps
// its placements (context parallelism chooses them: its Ulysses and ring lists are the Python
// CFG tests').
TEST(SearchPlacements, AProgramWithAttentionIsSearchedAroundIt) {
  const char* text = R"(fusion {
  mesh @m0 = [0, 1]
  %t0 = input f32[3, 2, 2, 3] @m0 {}
  %t1 = input f32[3, 2, 2, 3] @m0 {}
  %t2 = input f32[2, 3] @m0 {split(0, 2), parallelize(0, DIDx)}
  %t3 = input f32[3, 2] @m0 {}
  %t4 = input f32[3, 2, 3] @m0 {split(1, 2), parallelize(1, DIDx)}
  %t5 = input f32[3, 2, 3] @m0 {}
  %t6 = sdpa(%t0, %t0, %t1)
  %t7 = linear(%t5, %t2)
  %t8 = linear(%t7, %t3)
  %t9 = add(%t8, %t4)
  output %t6, %t9
})";
  EXPECT_THAT(collectivesOf(text, "greedy"), ElementsAre("reduce_scatter %1 72"));
  EXPECT_THAT(collectivesOf(text), ElementsAre("all_to_all %t7 24"));
}

// A matmul's weight gathered is a parameter move though decomposition reads it through a set
// (the search once named parameters on each decomposed plan, where the rule no longer calls the
// set's result a weight, and took a plan of one collective less that gathers %t1: s11-w2-c134).
TEST(SearchPlacements, AMatmulWeightReadThroughASetIsStillAParameter) {
  const char* text = R"(fusion {
  mesh @m0 = [0, 1]
  %t0 = input f32[4, 6] @m0 {split(0, 2), parallelize(0, DIDx)}
  %t1 = input f32[6, 6] @m0 {split(1, 2), parallelize(1, DIDx)}
  %t2 = input f32[3, 6] @m0 {split(1, 2), parallelize(1, DIDx)}
  %t3 = matmul(%t0, %t1)
  %t4 = rms_norm(%t3)
  %t5 = linear(%t4, %t2)
  %t6 = add(%t5, %t5)
  output %t6
})";
  EXPECT_THAT(collectivesOf(text), ElementsAre("allgather %t0 48", "all_to_all %t3 48", "all_to_all %t4 48",
                                               "reduce_scatter %3 48"));
}

// Attention that context parallelism placed keeps what it reads (here Ulysses: the heads'
// split), not where its operands come from: the softmax before it runs on the heads' split
// its result moves to anyway, one all-to-all (s11-w4-c170). The op-by-op plan gathers %t0 for
// softmax, and Ulysses slices its keys from that copy (an all-to-all off the sequence split shares
// conversions: s12-w4-u40-c31): one collective too, of more bytes.
TEST(SearchPlacements, ContextParallelAttentionKeepsWhatItReadsNotWhereItComesFrom) {
  const char* text = R"(fusion {
  mesh @m0 = [0, 1, 2, 3]
  %t0 = input f32[3, 4, 4, 3] @m0 {split(2, 4), parallelize(2, DIDx)}
  %t1 = input f32[3, 4, 4, 3] @m0 {}
  %t2 = softmax(%t0, dim=2)
  %t3 = sdpa(%t2, %t0, %t1)
  output %t3
})";
  EXPECT_THAT(collectivesOf(text, "greedy"), ElementsAre("allgather %0 144"));
  EXPECT_THAT(collectivesOf(text), ElementsAre("all_to_all %t0 144"));
  EXPECT_EQ(outputShardings(text, "search"), outputShardings(text, "greedy"));
}

// Attention whose operands arrive split along head_dim, not the sequence, is no context
// parallelism: the search places it like any op (on a split of the batch here), and k, needed
// whole by mul, is gathered once for both (s11-w3-c276).
TEST(SearchPlacements, AttentionThatContextParallelismDidNotPlaceIsSearchedLikeAnyOp) {
  const char* text = R"(fusion {
  mesh @m0 = [0, 1, 2]
  %t0 = input f32[2, 3, 2, 3] @m0 {split(3, 3), parallelize(3, DIDx)}
  %t1 = input f32[2, 3, 2, 3] @m0 {split(3, 3), parallelize(3, DIDx)}
  %t2 = input f32[2, 3, 2, 3] @m0 {}
  %t3 = sdpa(%t0, %t1, %t2)
  %t4 = mul(%t1, %t2)
  %t5 = rms_norm(%t4)
  output %t3, %t5
})";
  EXPECT_THAT(collectivesOf(text, "greedy"), ElementsAre("allgather %0 48", "allgather %3 48", "allgather %7 48"));
  EXPECT_THAT(collectivesOf(text), ElementsAre("all_to_all %t0 48", "allgather %1 48", "allgather %6 72"));
}

// Keys and values sequence-split, 5 heads on 2 ranks: context parallelism takes ring attention
// (k and v rotate, one batch row after the other: 2 head groups of 2 send/recvs of 100 bytes).
// Under --cp=auto the search moves %t0 to the batch's even split instead, before the mul and add
// that make q, k and v, and the output back: one all-to-all each way, half the bytes, each rank
// attending whole sequences for one of the two batch rows (the placement fuzzer's
// s2-w2-u40-c144). A forced --cp=ring stands.
TEST(SearchPlacements, AutoContextParallelismGivesWayToAnEvenBatchSplit) {
  const char* text = R"(fusion {
  mesh @m0 = [0, 1]
  %t0 = input f32[2, 5, 2, 5] @m0 {split(2, 2), parallelize(2, DIDx)}
  %t1 = input f32[2, 5, 2, 5] @m0 {}
  %t2 = mul(%t0, %t0)
  %t3 = add(%t2, %t1)
  %t4 = sdpa(%t3, %t2, %t3)
  output %t4
})";
  EXPECT_THAT(collectivesOf(text, "greedy"),
              ElementsAre("send_recv %t2 100", "send_recv %t3 100", "send_recv %t2 100", "send_recv %t3 100"));
  EXPECT_THAT(collectivesOf(text), ElementsAre("all_to_all %t0 200", "all_to_all %2 200"));
  PipelineOptions ring = plan("search");
  findCompileOption("cp").set(ring, "ring");
  CompiledProgram p = compile(parseFusion(text, "t.mf"), ring);
  Strings kinds;
  for (const CollectiveInfo& c : collectives(programForRank(p, 0), {})) kinds.push_back(commKindName(c.kind));
  EXPECT_THAT(kinds, ElementsAre("send_recv", "send_recv", "send_recv", "send_recv"));
}

// Keys split along a sequence of 2 tokens, 7 heads, on 4 ranks: neither ring attention nor
// Ulysses divides, so context parallelism gathers k and v, and every rank attends everything. The
// search may then place attention anywhere within its bounds: on the heads (2, 2, 2, 1), q and k
// sliced from the copy gathered for exp, the pending values reduce-scattered to the heads: 2142
// bytes over all ranks instead of 3528, 3 collectives either way (the placement fuzzer's
// s12-w4-u40-c31).
TEST(SearchPlacements, AttentionWhoseKeysContextParallelismGatheredIsSearchedLikeAnyOp) {
  const char* text = R"(fusion {
  mesh @m0 = [0, 1, 2, 3]
  %t0 = input f32[2, 7, 2, 3] @m0 {split(2, 4), parallelize(2, DIDx)}
  %t1 = input f32[2, 7, 2, 3, r4] @m0 {parallelize(4, DIDx)}
  %t2 = exp(%t0)
  %t3 = sum(%t0, dims=[0]) : f32[r2, 7, 2, 3] @m0 {}
  %t4 = sdpa(%t0, %t0, %t1)
  %t5 = sum(%t4, dims=[0])
  output %t2, %t3, %t5
})";
  EXPECT_THAT(collectivesOf(text, "greedy"), ElementsAre("allgather %1 84", "allgather %3 168", "allreduce %t1 336"));
  EXPECT_THAT(collectivesOf(text), ElementsAre("allgather %0 168", "reduce_scatter %5 336", "all_to_all %8 48"));
  EXPECT_EQ(outputShardings(text, "search"), outputShardings(text, "greedy"));
}

// On a 2x2 mesh a plan may route a conversion by fewest bytes, a collective more than its route
// of fewest collectives, where the plan saves collectives elsewhere (the placement fuzzer's
// s2-w4-u40-c332, shrunk): %t0's pending sums are reduce-scattered along dim 1, which neither
// side splits, before they travel (an all-to-all, a reduce-scatter and an allgather), and both
// sums and the reshape read the result. The program says so (`reshard by bytes`), and
// decomposition follows it. Rank 0 sends 60 bytes in 4 collectives, against 80 in 6.
TEST(SearchPlacements, AConversionMayTakeACollectiveMoreThatThePlanSavesElsewhere) {
  const char* text = R"(fusion {
  mesh @m0 = [[0, 1], [2, 3]]
  %t0 = input f32[2, 5, r2] @m0 {parallelize(2, DIDy), split(0, 2), parallelize(0, DIDx)}
  %t1 = sum(%t0, dims=[1]) : f32[2, r5]
  %t2 = layer_norm(%t1) : f32[2]
  %t3 = reshape(%t0, shape=[10]) : f32[10] @m0 {split(0, 2), parallelize(0, DIDy)}
  %t4 = sum(%t0, dims=[1]) : f32[2, r5]
  %t5 = neg(%t4) : f32[2] @m0 {split(0, 2), parallelize(0, DIDy), split(1, 2), parallelize(1, DIDx)}
  output %t2, %t3, %t5
})";
  EXPECT_THAT(collectivesOf(text, "greedy"),
              ElementsAre("allreduce %t1 4", "allgather %0 4", "allgather %2 20", "reduce_scatter %3 40",
                          "allgather %4 4", "reduce_scatter %5 8"));
  EXPECT_THAT(collectivesOf(text),
              ElementsAre("all_to_all %t0 20", "reduce_scatter %0 24", "allgather %2 12", "allgather %t1 4"));
  CompiledProgram searched = compile(parseFusion(text, "t.mf"), plan("search"));
  EXPECT_TRUE(searched.fusion->reshardByBytes());
  EXPECT_FALSE(compile(parseFusion(text, "t.mf"), plan("greedy")).fusion->reshardByBytes());
  EXPECT_EQ(outputShardings(text, "search"), outputShardings(text, "greedy"));
}

TEST(SearchPlacements, ThePlanOptionNamesItsValues) {
  EXPECT_THAT(testing_helpers::userErrorMessage(ErrorKind::Value, [] { plan("exhaustive"); }),
              ::testing::HasSubstr("plan 'exhaustive': expected search or greedy"));
}

}  // namespace
}  // namespace meshfuse
