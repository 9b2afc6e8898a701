// MESHFUSE_PERF_MAP=1: the CPU backend names its JIT-compiled kernels for Linux perf in
// /tmp/perf-<pid>.map, one line per kernel, "START SIZE NAME" in hex, the range being code this
// process runs (an executable mapping in /proc/self/maps).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "meshfuse/communicator.h"
#include "meshfuse/executor.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ops.h"

namespace meshfuse {
namespace {

struct Range {
  uint64_t begin, end;
  std::string name;
};

// "START SIZE NAME" lines (perf map) or "BEGIN-END PERMS ..." lines (/proc/self/maps, executable
// ones only), as ranges.
std::vector<Range> perfMap(const std::string& path) {
  std::vector<Range> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string start, size, name;
    fields >> start >> size >> name;
    const uint64_t b = std::stoull(start, nullptr, 16);
    out.push_back({b, b + std::stoull(size, nullptr, 16), name});
  }
  return out;
}

std::vector<Range> executableMappings() {
  std::vector<Range> out;
  std::ifstream in("/proc/self/maps");
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string range, perms;
    fields >> range >> perms;
    if (perms.size() < 3 || perms[2] != 'x') continue;
    const size_t dash = range.find('-');
    out.push_back({std::stoull(range.substr(0, dash), nullptr, 16), std::stoull(range.substr(dash + 1), nullptr, 16), ""});
  }
  return out;
}

TEST(PerfMap, NamesEveryCpuKernelAfterItsOpsWhereItRuns) {
  const std::string path = "/tmp/perf-" + std::to_string(::getpid()) + ".map";
  std::remove(path.c_str());
  ::setenv("MESHFUSE_PERF_MAP", "1", 1);  // read when the backend creates its JIT
  auto f = std::make_unique<Fusion>();
  TensorView* x = f->defineTensor({16, 32}, DataType::Float, "x");
  f->addOutput(ops::gelu(ops::add(x, 1.0), "tanh"));
  std::unique_ptr<Communicator> self = makeSelfCommunicator();
  MultiDeviceExecutor exec(std::move(f), *self);
  exec.run({{Tensor::random(DataType::Float, {16, 32}, 1), DeviceMesh({0}), {Placement::replicate()}}});
  ::unsetenv("MESHFUSE_PERF_MAP");
  const std::vector<Range> kernels = perfMap(path), code = executableMappings();
  ASSERT_EQ(kernels.size(), 1u) << path;
  EXPECT_EQ(kernels[0].name.rfind("meshfuse:mf_0_add_gelu", 0), 0u) << kernels[0].name;
  EXPECT_LT(kernels[0].begin, kernels[0].end);
  bool inside = false;
  for (const Range& m : code) inside |= m.begin <= kernels[0].begin && kernels[0].end <= m.end;
  EXPECT_TRUE(inside) << std::hex << kernels[0].begin << "-" << kernels[0].end << " is not executable code";
  std::remove(path.c_str());
}

TEST(PerfMap, AnythingButZeroOrOneIsAnError) {
  ::setenv("MESHFUSE_PERF_MAP", "yes", 1);
  auto f = std::make_unique<Fusion>();
  TensorView* x = f->defineTensor({4}, DataType::Float, "x");
  f->addOutput(ops::exp(x));
  std::unique_ptr<Communicator> self = makeSelfCommunicator();
  MultiDeviceExecutor exec(std::move(f), *self);
  try {
    exec.run({{Tensor::random(DataType::Float, {4}, 1), DeviceMesh({0}), {Placement::replicate()}}});
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("MESHFUSE_PERF_MAP=yes: expected 0 or 1"), std::string::npos) << e.what();
  }
  ::unsetenv("MESHFUSE_PERF_MAP");
}

}  // namespace
}  // namespace meshfuse
