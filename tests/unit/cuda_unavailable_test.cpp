// The public CUDA entry points where no GPU can be used: a machine without one, or a build
// without the CUDA backend (MESHFUSE_CUDA=OFF or AUTO without the toolkit). Both report
// "no CUDA device: <reason>" as a RuntimeError, and "auto" falls back to the CPU.
#include <gtest/gtest.h>

#include "driver/backends.h"
#include "runtime/backend.h"
#include "meshfuse/communicator.h"
#include "runtime/cuda.h"
#include "test_helpers.h"

namespace meshfuse {
namespace {

using testing_helpers::userErrorMessage;

TEST(CudaNoDevice, BackendCreationSaysWhy) {
  if (cudaDeviceAvailable()) GTEST_SKIP() << "a CUDA device is present: " << cudaDeviceDescription();
  std::string msg = userErrorMessage(ErrorKind::Runtime, [] { makeCudaBackend(); });
  EXPECT_NE(msg.find("no CUDA device: "), std::string::npos) << msg;
  EXPECT_NE(msg.find("--device=cpu"), std::string::npos) << msg;
  EXPECT_EQ(cudaDeviceDescription().rfind("no CUDA device: ", 0), 0u) << cudaDeviceDescription();
  EXPECT_EQ(makeBackend("auto")->device(), Device::Cpu);
  userErrorMessage(ErrorKind::Runtime, [] { makeBackend("cuda"); });
  userErrorMessage(ErrorKind::Runtime, [] { makeNcclCommunicator(makeSelfCommunicator()); });
  userErrorMessage(ErrorKind::Runtime, [] { makeHostStagedCommunicator(makeSelfCommunicator()); });
  userErrorMessage(ErrorKind::Runtime, [] { makeCudaCommunicator(makeSelfCommunicator()); });
#if !MESHFUSE_HAVE_CUDA
  // A build without the backend says so, not something about drivers.
  EXPECT_NE(msg.find("meshfuse was built without CUDA"), std::string::npos) << msg;
  EXPECT_NE(cudaDeviceDescription().find("meshfuse was built without CUDA"), std::string::npos);
#endif
}

}  // namespace
}  // namespace meshfuse
