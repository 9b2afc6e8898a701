// The host-IR verifier: every program the pipeline makes passes it; a program corrupted by hand
// is caught, one test per rule, by its message.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "meshfuse/error.h"
#include "lower/host_ir_verifier.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/parser.h"
#include "lower/pipeline.h"

namespace meshfuse {
namespace {

std::string readFile(const std::string& path) {
  std::ifstream in(std::string(MESHFUSE_SOURCE_DIR) + "/" + path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

CompiledProgram compileFile(const std::string& path, PipelineOptions o = {}) {
  return compile(parseFusion(readFile(path), path), o);
}

// The verifier's message ("" and a failure when it accepts the program).
std::string violation(const HostProgram& p, HostVerifyOptions o = {}) {
  try {
    verifyHostIr(p, o);
  } catch (const InternalError& e) {
    std::string m = e.what();
    return m.substr(m.find("host IR verifier:"));  // (after InternalError's "this is a bug" prefix)
  }
  ADD_FAILURE() << "the verifier accepted:\n" << p.toString();
  return "";
}

// The first node of kind T (in pre-order), and its position in `nodes` when it is at top level.
template <typename T>
T* find(std::vector<HostNode>& nodes, std::ptrdiff_t* at = nullptr) {
  T* found = nullptr;
  forEachNode(nodes, [&](HostNode& n) {
    if (!found && (found = n.as<T>()) && at) *at = &n - nodes.data();
  });
  return found;
}

TEST(HostIrVerifier, AcceptsEveryRankOfTheExamples) {
  for (const char* path : {"examples/tp_mlp.mf", "examples/decoder_layer.mf", "examples/sp_mlp.mf",
                           "examples/fsdp_mlp.mf", "examples/pipeline_mlp.mf"}) {
    CompiledProgram c = compileFile(path);
    EXPECT_NO_THROW(verifyHostIr(c.host)) << path;
    for (int64_t m = 0; m < c.fusion->numMeshes(); ++m)
      for (int64_t r : c.fusion->mesh(m).devices())
        EXPECT_NO_THROW(verifyHostIr(programForRank(c, r), {.streams_assigned = true})) << path << " rank " << r;
  }
}

TEST(HostIrVerifier, UseBeforeAllocate) {
  HostProgram p = programForRank(compileFile("examples/tp_mlp.mf"), 0);
  std::ptrdiff_t at = -1;
  ASSERT_TRUE(find<hir::Allocate>(p.nodes, &at));
  p.nodes.erase(p.nodes.begin() + at);  // `allocate %up` goes
  EXPECT_EQ(violation(p),
            "host IR verifier: `gemm #0 %up = linear(%inp, %up_w, bias=%up_b)` uses %up, which is not allocated "
            "before it");
}

TEST(HostIrVerifier, UseAfterDeallocate) {
  HostProgram p = programForRank(compileFile("examples/tp_mlp.mf"), 0);
  std::ptrdiff_t at = -1;
  hir::LaunchKernel* launch = find<hir::LaunchKernel>(p.nodes, &at);
  ASSERT_TRUE(launch);
  hir::Deallocate free_up{{p.segment(*launch).inputs.at(0)}};
  p.nodes.insert(p.nodes.begin() + at, free_up);
  std::string m = violation(p);
  EXPECT_NE(m.find("host IR verifier: `launch #1 %act = gelu(%up, approximate=\"tanh\")` uses %up after its "
                   "deallocate"),
            std::string::npos)
      << m;
}

TEST(HostIrVerifier, WaitWithoutItsCommunication) {
  HostProgram p = programForRank(compileFile("examples/tp_mlp.mf"), 0);
  hir::Wait* wait = find<hir::Wait>(p.nodes);
  ASSERT_TRUE(wait);
  wait->handle = 7;
  EXPECT_EQ(violation(p),
            "host IR verifier: `wait h7` waits for h7, which no communication issued before it in this iteration "
            "(or which was waited for already)");
}

TEST(HostIrVerifier, EventWaitedForBeforeItIsRecorded) {
  PipelineOptions o;
  o.propagation.gather_parameters = true;  // FSDP: prefetched gathers, ordered by events
  HostProgram p = programForRank(compileFile("examples/fsdp_mlp.mf", o), 0);
  hir::RecordEvent* record = find<hir::RecordEvent>(p.nodes);
  ASSERT_TRUE(record);
  const int64_t event = record->event;
  record->event = 99;
  EXPECT_EQ(violation(p), fmt::format("host IR verifier: `wait_event e{0}[0]` waits for instance 0 of event e{0}, "
                                      "which is not recorded before it",
                                      event));
}

TEST(HostIrVerifier, StreamPoolLeftForTheBackend) {
  PipelineOptions o;
  o.overlap.algorithm = parseOverlapAlgorithm("collective");
  o.overlap.chunks = 2;
  o.overlap.streams = 2;
  o.sizes = {{"t", 64}};
  CompiledProgram c = compileFile("examples/sp_mlp.mf", o);
  HostProgram p = c.host;
  runHostPasses(p, {"specialize-for-rank"}, o, 0);  // assign-streams not run
  EXPECT_NO_THROW(verifyHostIr(p));
  EXPECT_EQ(violation(p, {.streams_assigned = true}),
            "host IR verifier: `for i in [0, 2) on 2 streams {` is still marked for a stream pool: assign-streams "
            "must place its iterations before the program runs");
}

TEST(HostIrVerifier, LoopCarriedValueInABufferOfOneIteration) {
  PipelineOptions o;
  o.overlap.algorithm = parseOverlapAlgorithm("collective");
  o.overlap.chunks = 2;
  o.sizes = {{"t", 64}};
  HostProgram p = programForRank(compileFile("examples/sp_mlp.mf", o), 0);
  hir::ForLoop* loop = find<hir::ForLoop>(p.nodes);
  ASSERT_TRUE(loop);
  // The loop's first use of a per-iteration buffer moves ahead of its allocate: its value would
  // have to come from the previous iteration's buffer.
  auto& body = loop->body;
  auto alloc = std::find_if(body.begin(), body.end(), [](const HostNode& n) { return n.is<hir::Allocate>(); });
  ASSERT_TRUE(alloc != body.end());
  HostNode a = *alloc;
  body.erase(alloc);
  body.push_back(a);
  std::string m = violation(p);
  EXPECT_NE(m.find("before the loop body allocates it: a value carried from one iteration to the next needs a buffer "
                   "allocated before the loop (in iteration i = 0)"),
            std::string::npos)
      << m;
}

TEST(HostIrVerifier, BlockIndexOverMoreLoopsThanEncloseIt) {
  HostProgram p = programForRank(compileFile("examples/tp_mlp.mf"), 0);
  hir::Communication* comm = find<hir::Communication>(p.nodes);
  ASSERT_TRUE(comm);
  comm->in.blocks = 2;
  comm->in.loop_coeffs = {1};
  std::string m = violation(p);
  EXPECT_NE(m.find("indexes %0[i of 2] by 1 loop variables inside 0 loops"), std::string::npos) << m;
}

// Passes run out of order are refused by their preconditions, naming the pass that comes first.
TEST(HostPasses, PreconditionsNameThePassThatComesFirst) {
  CompiledProgram c = compileFile("examples/tp_mlp.mf");
  HostProgram p = c.host;
  try {
    runHostPasses(p, {"assign-streams"}, {}, 0);
    ADD_FAILURE() << "assign-streams ran on the collective program";
  } catch (const UserError& e) {
    EXPECT_EQ(e.message(), "assign-streams needs specialize-for-rank first: its input is the collective program of "
                           "all ranks");
  }
  HostProgram r = programForRank(c, 0);
  try {
    runHostPasses(r, {"assign-streams"}, {}, 0);
    ADD_FAILURE() << "assign-streams ran after insert-deallocations";
  } catch (const UserError& e) {
    EXPECT_EQ(e.message(), "assign-streams must run before insert-deallocations: it moves allocations (found a "
                           "deallocate)");
  }
  try {
    findHostPass("no-such-pass");
    ADD_FAILURE();
  } catch (const UserError& e) {
    EXPECT_EQ(e.message(), "unknown host pass 'no-such-pass' (known host passes: lower-to-host-ir, "
                           "specialize-for-rank, assign-streams, insert-deallocations)");
  }
}

TEST(HostPasses, DumpAndTimingAfterEachPass) {
  CompiledProgram c = compileFile("examples/tp_mlp.mf");
  std::ostringstream dump, timing;
  PipelineOptions o;
  o.dump = &dump;
  o.timing = &timing;
  HostProgram p = programForRank(c, 1, o);
  for (const char* pass : {"specialize-for-rank", "assign-streams", "insert-deallocations"}) {
    EXPECT_NE(dump.str().find(fmt::format("# ----- host IR after {}\nfusion {{", pass)), std::string::npos) << pass;
    EXPECT_NE(timing.str().find(fmt::format("pass {}", pass)), std::string::npos) << pass;
  }
  EXPECT_NE(dump.str().find(p.toString()), std::string::npos);  // the last dump is the result
}

}  // namespace
}  // namespace meshfuse
