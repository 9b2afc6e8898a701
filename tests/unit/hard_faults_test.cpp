// Hard faults without MPI: allocations that cannot succeed (memory.h) are refused with the tensor,
// its dtype, shape and bytes; how the ranks' disagreement on their inputs is worded
// (input_agreement.h). The multi-rank cases are in tests/mpi/errors_test.cpp and tests/scripts.
#include <gmock/gmock-matchers.h>
#include <gtest/gtest.h>

#include "meshfuse/ir/parser.h"
#include "lower/pipeline.h"
#include "driver/backends.h"
#include "runtime/backend.h"
#include "runtime/memory.h"
#include "driver/input_agreement.h"
#include "test_helpers.h"

namespace meshfuse {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using testing_helpers::userErrorMessage;

const MemoryLimit kOneGiB{int64_t{1} << 30, "test memory"};

TEST(HardFaults, FormatBytes) {
  EXPECT_EQ(formatBytes(512), "512 bytes");
  EXPECT_EQ(formatBytes(2048), "2 KiB");
  EXPECT_EQ(formatBytes(int64_t{3} << 29), "1.5 GiB");
  EXPECT_EQ(formatBytes(int64_t{64} << 40), "64 TiB");
}

TEST(HardFaults, TheHostLimitIsKnownHere) {
  const MemoryLimit host = hostMemoryLimit();
  EXPECT_GT(host.bytes, int64_t{1} << 20);
  EXPECT_THAT(host.what, HasSubstr("memory"));
}

TEST(HardFaults, AnAllocationLargerThanTheLimitNamesTheTensor) {
  checkAllocation("%x", DataType::Float, {1024, 1024}, kOneGiB);  // 4 MiB: fine
  EXPECT_EQ(userErrorMessage(ErrorKind::Runtime,
                             [] {
                               checkAllocation("%x on ranks 0, 1", DataType::BFloat16, {int64_t{1} << 40, 16}, kOneGiB);
                             }),
            "cannot allocate %x on ranks 0, 1, a bf16 tensor of shape [1099511627776, 16]: 35184372088832 bytes "
            "(32 TiB), more than the 1 GiB of test memory");
  EXPECT_EQ(userErrorMessage(ErrorKind::Runtime,
                             [] {
                               checkAllocation("", DataType::Float, {int64_t{1} << 62, 8}, kOneGiB);
                             }),
            "cannot allocate a f32 tensor of shape [4611686018427387904, 8]: it has more bytes than an int64 can "
            "count");
  checkAllocation("%y", DataType::Float, {int64_t{1} << 40}, {});  // an unknown limit refuses nothing
}

// The allocators refuse a tensor larger than the machine before they try (no std::bad_alloc, no
// OOM kill later), with its dtype, shape and bytes. 2^44 f32 (64 TiB) is under the 128 TiB a
// process can address, so the machine's memory is what refuses it.
TEST(HardFaults, AllocatorsRefuseTensorsLargerThanTheMachine) {
  const std::string want =
      "cannot allocate a f32 tensor of shape [17592186044416]: 70368744177664 bytes (64 TiB), "
      "more than the ";
  EXPECT_THAT(userErrorMessage(ErrorKind::Runtime, [] { Tensor::empty(DataType::Float, {int64_t{1} << 44}); }),
              StartsWith(want));
  for (auto make : {makeCpuBackend, makeReferenceBackend}) {
    std::unique_ptr<Backend> backend = make();
    EXPECT_THAT(userErrorMessage(ErrorKind::Runtime, [&] { backend->allocate(DataType::Float, {int64_t{1} << 44}); }),
                StartsWith(want))
        << backend->name();
    EXPECT_EQ(backend->allocate(DataType::Float, {4, 4}).numel(), 16) << "small tensors still allocate";
  }
}

// The program check names the first buffer that does not fit, with the ranks of its mesh; buffers
// whose shapes it cannot compute are left to the run.
TEST(HardFaults, ProgramBuffersAreCheckedForTheRunSizes) {
  CompiledProgram p = compile(parseFusion(R"(fusion {
  mesh @m = [0, 1]
  %a = input f32[?t, 1] @m {split(0, 2), parallelize(0, DIDx)}
  %b = input f32[1, ?u] @m {}
  %c = matmul(%a, %b)
  %d = relu(%c)
  output %d
}
)",
                                          "outer.mf"));
  checkProgramAllocations(p.host, {{"t", 1024}, {"u", 1024}}, kOneGiB);
  EXPECT_EQ(userErrorMessage(ErrorKind::Runtime,
                             [&] {
                               checkProgramAllocations(p.host, {{"t", 1 << 20}, {"u", 1 << 20}}, kOneGiB);
                             }),
            "cannot allocate %c on ranks 0, 1, a f32 tensor of shape [524288, 1048576]: 2199023255552 bytes (2 TiB), "
            "more than the 1 GiB of test memory");
  checkProgramAllocations(p.host, {{"t", 1 << 20}}, kOneGiB);  // ?u unbound: the run reports that
  // 3 rows over 2 ranks: torch.chunk's 2 + 1; the largest block (every rank checks the same) is
  // what is refused.
  EXPECT_EQ(userErrorMessage(ErrorKind::Runtime,
                             [&] { checkProgramAllocations(p.host, {{"t", 3}, {"u", 1 << 30}}, kOneGiB); }),
            "cannot allocate %c on ranks 0, 1, a f32 tensor of shape [2, 1073741824]: 8589934592 bytes (8 GiB), more "
            "than the 1 GiB of test memory");
}

AgreementFields fields(const std::string& dtype, const std::string& shape) {
  return {{"number of inputs", "1"}, {"input 0 (%x) dtype", dtype}, {"input 0 (%x) global shape", shape}};
}

TEST(HardFaults, DisagreementsNameTheFieldAndWhichRanksHadWhat) {
  EXPECT_EQ(describeDisagreement({{0, fields("f32", "[8, 4]")}, {1, fields("f32", "[8, 4]")}}), "");
  EXPECT_EQ(describeDisagreement({{0, fields("f32", "[8, 4]")},
                                  {1, fields("f32", "[8, 4]")},
                                  {2, fields("f32", "[8, 4]")},
                                  {3, fields("bf16", "[16, 4]")}}),
            "the ranks disagree: input 0 (%x) dtype is bf16 on rank 3 but f32 on ranks 0, 1, 2; input 0 (%x) global "
            "shape is [16, 4] on rank 3 but [8, 4] on ranks 0, 1, 2");
  // Two against two: the value of the lowest rank is the usual one.
  EXPECT_EQ(describeDisagreement({{0, fields("f16", "[8, 4]")},
                                  {1, fields("f32", "[8, 4]")},
                                  {2, fields("f16", "[8, 4]")},
                                  {3, fields("f32", "[8, 4]")}}),
            "the ranks disagree: input 0 (%x) dtype is f32 on ranks 1, 3 but f16 on ranks 0, 2");
}

TEST(HardFaults, AnUnknownValueAgreesAndAFailureIsTheNews) {
  // A rank outside the input's mesh, given no global shape, does not know it.
  EXPECT_EQ(describeDisagreement({{0, fields("f32", "[8, 4]")}, {1, fields("f32", "?")}, {2, fields("f32", "[8, 4]")}}),
            "");
  EXPECT_EQ(describeDisagreement({{0, fields("f32", "[8, 4]")}, {1, fields("f32", "?")}, {2, fields("f32", "[4, 4]")}}),
            "the ranks disagree: input 0 (%x) global shape is [4, 4] on rank 2 but [8, 4] on rank 0");
  EXPECT_EQ(
      describeDisagreement(
          {{0, fields("f32", "[8, 4]")}, {1, {{"error", "ValueError: input 0: bad"}}}, {2, fields("bf16", "[8, 4]")}}),
      "rank 1 failed: ValueError: input 0: bad");
  // A field one rank lacks (it was given fewer inputs).
  AgreementFields fewer = {{"number of inputs", "0"}};
  EXPECT_EQ(describeDisagreement({{0, fields("f32", "[8, 4]")}, {1, fewer}, {2, fields("f32", "[8, 4]")}}),
            "the ranks disagree: number of inputs is 0 on rank 1 but 1 on ranks 0, 2; input 0 (%x) dtype is "
            "(missing) on rank 1 but f32 on ranks 0, 2; input 0 (%x) global shape is (missing) on rank 1 but [8, 4] "
            "on ranks 0, 2");
}

}  // namespace
}  // namespace meshfuse
