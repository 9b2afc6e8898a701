// MultiDeviceExecutor::prepare / run(program, inputs): a handle to a compiled program that a
// front end keeps per call signature. It runs the program it names, and falls back to the cache
// lookup for inputs it was not compiled for, so a stale handle is never wrong.
#include <gtest/gtest.h>

#include "meshfuse/executor.h"
#include "meshfuse/ir/parser.h"
#include "test_helpers.h"

namespace meshfuse {
namespace {

std::unique_ptr<Fusion> doubler() {
  return parseFusion(R"(fusion {
  %x = input f32[?n] {}
  %y = add(%x, %x) : f32[?n] {}
  output %y
}
)");
}

ShardedTensor filled(std::vector<float> values) {
  Tensor t(DataType::Float, {static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), static_cast<float*>(t.data()));
  return {t, DeviceMesh({0}), {Placement::replicate()}};
}

std::vector<float> valuesOf(const ShardedTensor& s) {
  const float* p = static_cast<const float*>(s.local.data());
  return {p, p + s.local.numel()};
}

TEST(ExecutorHandle, RunsThePreparedProgramWithoutAnotherCacheEntry) {
  std::unique_ptr<Communicator> self = makeSelfCommunicator();
  MultiDeviceExecutor exec(doubler(), *self);
  MultiDeviceExecutor::Program& program = exec.prepare({filled({1, 2, 3})});
  EXPECT_EQ(exec.cacheSize(), 1);
  for (int k = 0; k < 3; ++k) {
    std::vector<ShardedTensor> out = exec.run(program, {filled({1, 2, float(k)})});
    EXPECT_EQ(valuesOf(out.at(0)), (std::vector<float>{2, 4, float(2 * k)}));
  }
  // Another size: the program does not depend on it, so the same handle serves it.
  EXPECT_EQ(valuesOf(exec.run(program, {filled({5})}).at(0)), std::vector<float>{10});
  EXPECT_EQ(exec.cacheSize(), 1);
}

TEST(ExecutorHandle, InputsItWasNotCompiledForFallBackToTheLookup) {
  std::unique_ptr<Communicator> self = makeSelfCommunicator();
  MultiDeviceExecutor exec(doubler(), *self);
  MultiDeviceExecutor::Program& replicated = exec.prepare({filled({1, 2})});
  ShardedTensor sharded = filled({1, 2});
  sharded.placements = {Placement::shard(0)};
  // Shard(0) on one device is another layout: another program, found by the lookup.
  EXPECT_EQ(valuesOf(exec.run(replicated, {sharded}).at(0)), (std::vector<float>{2, 4}));
  EXPECT_EQ(exec.cacheSize(), 2);
}

}  // namespace
}  // namespace meshfuse
