// The world a program runs in must hold every rank any of its meshes names: the inputs' meshes
// and the meshes the definition pins tensors to (a pipeline stage reached through a `set`).
#include <gmock/gmock-matchers.h>
#include <gtest/gtest.h>

#include "meshfuse/executor.h"
#include "meshfuse/ir/parser.h"
#include "test_helpers.h"

namespace meshfuse {
namespace {

using testing_helpers::userErrorMessage;

TEST(WorldSize, AMeshOnlyTheDefinitionNamesCountsToo) {
  // Inputs on [0]; the set moves the value to the stage [1], which a world of one rank lacks.
  std::unique_ptr<Fusion> def = parseFusion(R"(fusion {
  mesh @a = [0]
  mesh @b = [1]
  %x = input f32[4] @a {}
  %y = set(%x) : f32[4] @b {}
  output %y
}
)");
  std::unique_ptr<Communicator> self = makeSelfCommunicator();
  MultiDeviceExecutor exec(std::move(def), *self);
  std::vector<ShardedTensor> inputs = {{Tensor(DataType::Float, {4}), DeviceMesh({0}), {Placement::replicate()}}};
  EXPECT_EQ(userErrorMessage(ErrorKind::Mesh, [&] { exec.plan(inputs); }),
            "mesh @b [1] of the fusion names device 1 but the world has 1 ranks (launch with mpirun -np 2)");
  // An input's mesh beyond the world names the input.
  std::vector<ShardedTensor> far = {{Tensor(), DeviceMesh({2, 3}), {Placement::replicate()}}};
  EXPECT_EQ(userErrorMessage(ErrorKind::Mesh, [&] { exec.plan(far); }),
            "input 0: mesh [2, 3] names device 2 but the world has 1 ranks (launch with mpirun -np 4)");
}

}  // namespace
}  // namespace meshfuse
