// check-collectives: every rank's program of a compiled fusion matches; hand-corrupted per-rank
// programs are caught, one test per rule, by their message (names both ranks and both nodes).
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <fstream>
#include <sstream>

#include "lower/check_collectives.h"
#include "meshfuse/error.h"
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

struct Compiled {
  CompiledProgram program;
  std::vector<HostProgram> ranks;
  SymbolBindings sizes;
};

Compiled compileFile(const std::string& path, SymbolBindings sizes) {
  Compiled c;
  c.sizes = sizes;
  PipelineOptions o;
  o.sizes = sizes;
  c.program = compile(parseFusion(readFile(path), path), o);
  std::set<int64_t> ranks;
  for (int64_t m = 0; m < c.program.fusion->numMeshes(); ++m)
    for (int64_t d : c.program.fusion->mesh(m).devices()) ranks.insert(d);
  for (int64_t r : ranks) c.ranks.push_back(programForRank(c.program, r));
  return c;
}

// The message of the InternalError check-collectives throws ("" and a failure when it passes).
std::string mismatch(const Compiled& c) {
  try {
    checkCollectives(c.ranks, c.sizes);
  } catch (const InternalError& e) {
    return e.what();
  }
  ADD_FAILURE() << "check-collectives accepted corrupted programs";
  return "";
}

// Pointers to the top-level communication nodes of a program, in order (loops not entered).
// The communication of `n` when it is one of `kind` (any kind: nullopt), else nullptr.
hir::Communication* commOf(HostNode& n, std::optional<CommKind> kind = std::nullopt) {
  auto* c = n.as<hir::Communication>();
  return c != nullptr && (!kind || c->kind == *kind) ? c : nullptr;
}

std::vector<hir::Communication*> comms(HostProgram& p, CommKind kind) {
  std::vector<hir::Communication*> out;
  for (HostNode& n : p.nodes)
    if (hir::Communication* c = commOf(n, kind)) out.push_back(c);
  return out;
}

TEST(CheckCollectives, EveryExampleMatchesOnEveryRank) {
  const std::vector<std::pair<std::string, SymbolBindings>> files = {
      {"examples/tp_mlp.mf", {{"t", 128}}},         {"examples/decoder_layer.mf", {}},
      {"examples/sp_mlp.mf", {{"t", 64}}},          {"examples/fsdp_mlp.mf", {{"t", 64}}},
      {"examples/pipeline_mlp.mf", {{"t", 64}}},    {"tests/lit/hostir/collectives_data_on_rank0.mf", {}},
      {"tests/lit/hostir/gather_to_stage.mf", {}},
  };
  for (const auto& [path, sizes] : files) {
    Compiled c = compileFile(path, sizes);
    CommunicationPlan plan = checkCollectives(c.ranks, c.sizes);
    size_t n = 0;
    for (const HostProgram& p : c.ranks) n += plan.of(p.rank).size();
    EXPECT_GT(n, 0u) << path << ": no communication planned";
  }
}

TEST(CheckCollectives, OverlapRingAndMicrobatchLoopsMatch) {
  for (const char* algo : {"collective", "ring"}) {
    Compiled c;
    c.sizes = {{"t", 64}};
    PipelineOptions o;
    o.sizes = c.sizes;
    o.overlap.algorithm = parseOverlapAlgorithm(algo);
    o.overlap.chunks = 2;
    c.program = compile(parseFusion(readFile("examples/sp_mlp.mf"), "sp_mlp.mf"), o);
    for (int64_t r : {0, 1}) c.ranks.push_back(programForRank(c.program, r));
    EXPECT_NO_THROW(checkCollectives(c.ranks, c.sizes));
  }
}

TEST(CheckCollectives, SwappedOrderIsCaught) {
  Compiled c = compileFile("examples/sp_mlp.mf", {{"t", 64}});  // allgather, then reduce_scatter
  HostProgram& r1 = c.ranks[1];
  std::vector<hir::Communication*> ag = comms(r1, CommKind::Allgather), rs = comms(r1, CommKind::ReduceScatter);
  ASSERT_TRUE(!ag.empty() && !rs.empty());
  std::swap(ag[0]->kind, rs[0]->kind);  // rank 1 issues a reduce-scatter where its peers allgather
  std::string m = mismatch(c);
  EXPECT_NE(m.find("team [0, 1]: collective #0 differs: rank 0 issues `comm h"), std::string::npos) << m;
  EXPECT_NE(m.find("(allgather of "), std::string::npos) << m;
  EXPECT_NE(m.find("but rank 1 issues `comm h"), std::string::npos) << m;
  EXPECT_NE(m.find("(reduce_scatter of "), std::string::npos) << m;
  EXPECT_NE(m.find("The programs involved:\nhostir rank 0 {"), std::string::npos) << m;  // the IR dumped
}

TEST(CheckCollectives, WrongSizeIsCaught) {
  Compiled c = compileFile("examples/tp_mlp.mf", {{"t", 128}});  // one allreduce of [128, 64]
  hir::Communication* ar = comms(c.ranks[2], CommKind::Allreduce).at(0);
  ar->in.blocks = 2;  // rank 2 reduces half the buffer
  std::string m = mismatch(c);
  EXPECT_NE(m.find("team [0, 1, 2, 3]: collective #0 differs: rank 0 issues"), std::string::npos) << m;
  EXPECT_NE(m.find("(allreduce of 8192 f32, sum) but rank 2 issues"), std::string::npos) << m;
  EXPECT_NE(m.find("(allreduce of 4096 f32, sum)"), std::string::npos) << m;
}

TEST(CheckCollectives, WrongRootIsCaught) {
  Compiled c = compileFile("tests/lit/hostir/collectives_data_on_rank0.mf", {});
  // A rooted collective on a team of several ranks; give one member another root.
  bool corrupted = false;
  for (HostProgram& p : c.ranks) {
    if (p.rank != 3) continue;
    for (HostNode& node : p.nodes)
      if (hir::Communication* n = commOf(node); !corrupted && n && n->root >= 0 && n->team.size() > 1) {
        n->root = n->team.back() == n->root ? n->team.front() : n->team.back();
        corrupted = true;
      }
  }
  ASSERT_TRUE(corrupted);
  std::string m = mismatch(c);
  EXPECT_NE(m.find("differs: rank "), std::string::npos) << m;
  EXPECT_NE(m.find("but rank 3 issues"), std::string::npos) << m;
  EXPECT_NE(m.find(", root "), std::string::npos) << m;
}

TEST(CheckCollectives, ReduceOpMismatchIsCaught) {
  Compiled c = compileFile("examples/tp_mlp.mf", {{"t", 128}});
  comms(c.ranks[1], CommKind::Allreduce).at(0)->reduce_op = ReduceOp::Max;
  std::string m = mismatch(c);
  EXPECT_NE(m.find("(allreduce of 8192 f32, sum) but rank 1 issues"), std::string::npos) << m;
  EXPECT_NE(m.find("(allreduce of 8192 f32, max)"), std::string::npos) << m;
}

TEST(CheckCollectives, MissingCollectiveIsCaught) {
  Compiled c = compileFile("examples/tp_mlp.mf", {{"t", 128}});
  HostProgram& r3 = c.ranks[3];
  const int64_t h = comms(r3, CommKind::Allreduce).at(0)->handle;
  std::erase_if(r3.nodes, [&](const HostNode& n) {
    const auto* c = n.as<hir::Communication>();
    const auto* w = n.as<hir::Wait>();
    return (c != nullptr && c->handle == h) || (w != nullptr && w->handle == h);
  });
  std::string m = mismatch(c);
  EXPECT_NE(m.find("team [0, 1, 2, 3]: rank 0 issues 1 collectives but rank 3 issues 0: rank 0's collective #0 "
                   "`comm h"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("has no counterpart on rank 3"), std::string::npos) << m;
}

// A pipeline: stage 0 sends each microbatch's activations to stage 1.
TEST(CheckCollectives, SendWithoutRecvIsCaught) {
  Compiled c = compileFile("examples/pipeline_mlp.mf", {{"t", 64}});
  HostProgram& r1 = c.ranks[1];
  // Rank 1 stops receiving from rank 0: drop the receiving side of its stage-boundary nodes.
  int dropped = 0;
  forEachNode(r1.nodes, [&](HostNode& node) {
    if (hir::Communication* n = commOf(node, CommKind::SendRecv); n && n->recv_from == 0) {
      n->recv_from = -1;
      ++dropped;
    }
  });
  ASSERT_GT(dropped, 0);
  std::string m = mismatch(c);
  EXPECT_NE(m.find("rank 0's `comm h"), std::string::npos) << m;
  EXPECT_NE(m.find("sends to rank 1 (tag "), std::string::npos) << m;
  EXPECT_NE(m.find("but rank 1 never receives it"), std::string::npos) << m;
}

// Stage 0 sends block 0 of 2 of its activations' rows instead of its microbatch buffer: a block
// names rows of the whole tensor, so the microbatch buffer of iterations 0 and 1 holds it, that of
// iteration 2 none of it.
TEST(CheckCollectives, SendRecvSizeMismatchIsCaught) {
  Compiled c = compileFile("examples/pipeline_mlp.mf", {{"t", 64}});
  forEachNode(c.ranks[0].nodes, [&](HostNode& node) {
    if (hir::Communication* n = commOf(node, CommKind::SendRecv); n && n->send_to == 1) n->in.blocks *= 2;
  });
  std::string m = mismatch(c);
  EXPECT_NE(m.find("(iteration 2) sends 0 f32 to rank 1, but rank 1's `comm h"), std::string::npos) << m;
  EXPECT_NE(m.find("receives 256 f32"), std::string::npos) << m;
}

TEST(CheckCollectives, WaitForAnUnissuedHandleIsCaught) {
  Compiled c = compileFile("examples/tp_mlp.mf", {{"t", 128}});
  HostProgram& r0 = c.ranks[0];
  auto it = std::find_if(r0.nodes.begin(), r0.nodes.end(), [](const HostNode& n) {
    return n.is<hir::Communication>();
  });
  ASSERT_NE(it, r0.nodes.end());
  commOf(*it)->handle += 100;  // issued as h100+, waited for as the original handle
  std::string m = mismatch(c);
  EXPECT_NE(m.find("rank 0's `wait h"), std::string::npos) << m;
  EXPECT_NE(m.find("which it has not issued"), std::string::npos) << m;
}

// Two ranks exchange point to point, but each waits for its receive before it issues its send.
TEST(CheckCollectives, RecvBeforeSendRingDeadlockIsCaught) {
  Compiled c = compileFile("examples/pipeline_mlp.mf", {{"t", 64}});
  // A template send/recv node (stage 0 -> stage 1) and its tensors, rebuilt as two programs.
  const hir::Communication* sr = nullptr;
  forEachNode(c.ranks[0].nodes, [&](HostNode& n) {
    if (sr == nullptr) sr = commOf(n, CommKind::SendRecv);
  });
  ASSERT_NE(sr, nullptr);
  auto exchange = [&](int64_t rank, int64_t peer) {
    HostProgram p;
    p.fusion = c.program.fusion;
    p.segments = c.program.host.segments;
    p.rank = rank;
    hir::Communication recv = *sr, send = *sr;
    recv.in = recv.out = BlockRef::of(sr->in.tv);
    send.in = send.out = BlockRef::of(sr->in.tv);
    recv.send_to = -1, recv.recv_from = peer, recv.handle = rank == 0 ? 0 : 1;
    send.recv_from = -1, send.send_to = peer, send.handle = rank == 0 ? 1 : 0;
    p.nodes = {recv, hir::Wait{recv.handle}, send, hir::Wait{send.handle}};
    return p;
  };
  c.ranks = {exchange(0, 1), exchange(1, 0)};
  std::string m = mismatch(c);
  EXPECT_NE(m.find("the programs deadlock"), std::string::npos) << m;
  EXPECT_NE(m.find("rank 0 waits at `wait h0` for `comm h0 send_recv"), std::string::npos) << m;
  EXPECT_NE(m.find("which needs rank 1's `comm h0 send_recv"), std::string::npos) << m;
  EXPECT_NE(m.find("rank 1 waits at `wait h1`"), std::string::npos) << m;
  // The same exchange with the sends issued first is accepted (MPI's non-blocking sends).
  std::swap(c.ranks[0].nodes[0], c.ranks[0].nodes[2]);
  std::swap(c.ranks[0].nodes[1], c.ranks[0].nodes[3]);
  EXPECT_NO_THROW(checkCollectives(c.ranks, c.sizes));
}

TEST(CheckCollectives, DescribeWaitNamesThePeersThatHaveNotArrived) {
  Compiled c = compileFile("examples/tp_mlp.mf", {{"t", 128}});
  CommunicationPlan plan = checkCollectives(c.ranks, c.sizes);
  // Rank 0 waits in its first communication; ranks 1 and 2 issued theirs, rank 3 none.
  std::string s = plan.describeWait(0, 0, {{0, 1}, {1, 1}, {2, 1}, {3, 0}});
  EXPECT_NE(s.find("blocked in `comm h"), std::string::npos) << s;
  EXPECT_NE(s.find(", collective #0 of team [0, 1, 2, 3]; not arrived: rank 3 should be at `comm h"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("(has issued no communication yet)"), std::string::npos) << s;
  EXPECT_EQ(s.find("rank 1 should be"), std::string::npos) << s;
  std::string unknown = plan.describeWait(0, 0, {});
  EXPECT_NE(unknown.find("rank 1 should be at `comm h"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("(position unknown)"), std::string::npos) << unknown;
}

}  // namespace
}  // namespace meshfuse
