// The host-IR text form: every program of the examples and of tests/lit/hostir (the collective
// program and every rank's) prints, parses and prints again identically, and runs the same
// passes after parsing; malformed text is a ParseError naming the line.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
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

// The pipeline options of a lit file's first RUN line (--overlap, --chunks, --streams, --fsdp,
// --size).
PipelineOptions runLineOptions(const std::string& text) {
  PipelineOptions o;
  std::smatch m;
  std::string run = text.substr(0, text.find('\n', text.find("RUN:")));
  if (std::regex_search(run, m, std::regex("--overlap=(\\w+)"))) o.overlap.algorithm = parseOverlapAlgorithm(m[1]);
  if (std::regex_search(run, m, std::regex("--chunks=(\\d+)"))) o.overlap.chunks = std::stoll(m[1]);
  if (std::regex_search(run, m, std::regex("--streams=(\\d+)"))) o.overlap.streams = std::stoll(m[1]);
  if (std::regex_search(run, m, std::regex("--size (\\w+)=(\\d+)"))) o.sizes[m[1]] = std::stoll(m[2]);
  o.propagation.gather_parameters = run.find("--fsdp") != std::string::npos;
  return o;
}

// Prints, parses and prints again; the parsed program also passes the verifier.
void expectRoundTrip(const HostProgram& p, const std::string& what) {
  std::string text = printHostModule(p);
  HostProgram parsed;
  try {
    parsed = parseHostModule(text, what);
  } catch (const UserError& e) {
    ADD_FAILURE() << what << ": " << e.message() << "\n" << text;
    return;
  }
  EXPECT_EQ(printHostModule(parsed), text) << what;
  EXPECT_NO_THROW(verifyHostIr(parsed)) << what;
}

void roundTripAllRanks(const std::string& path, const PipelineOptions& o) {
  CompiledProgram c = compile(parseFusion(readFile(path), path), o);
  expectRoundTrip(c.host, path + " (collective)");
  for (int64_t m = 0; m < c.fusion->numMeshes(); ++m)
    for (int64_t r : c.fusion->mesh(m).devices()) expectRoundTrip(programForRank(c, r), path + " rank " + std::to_string(r));
}

TEST(HostIrText, EveryLitHostirCaseRoundTrips) {
  const std::string dir = std::string(MESHFUSE_SOURCE_DIR) + "/tests/lit/hostir";
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".mf") continue;
    std::string path = "tests/lit/hostir/" + entry.path().filename().string();
    roundTripAllRanks(path, runLineOptions(readFile(path)));
    ++files;
  }
  EXPECT_GE(files, 24);
}

TEST(HostIrText, EveryExampleRoundTrips) {
  for (const char* path : {"examples/tp_mlp.mf", "examples/decoder_layer.mf", "examples/sp_mlp.mf",
                           "examples/fsdp_mlp.mf", "examples/pipeline_mlp.mf", "examples/mlp_block.mf",
                           "examples/ring_attention.mf"})  // (mirror, along dim, attention steps' rows and keys)
    roundTripAllRanks(path, {});
  for (const char* algo : {"collective", "ring"}) {
    PipelineOptions o;
    o.overlap.algorithm = parseOverlapAlgorithm(algo);
    o.overlap.chunks = 4;
    o.overlap.streams = 2;
    o.sizes = {{"t", 64}};
    roundTripAllRanks("examples/sp_mlp.mf", o);
    roundTripAllRanks("examples/tp_mlp.mf", o);
  }
}

// The passes after parsing do what they do on the program in memory.
TEST(HostIrText, PassesOnAParsedProgramMatchThePipeline) {
  CompiledProgram c = compile(parseFusion(readFile("examples/fsdp_mlp.mf"), "fsdp_mlp.mf"),
                              {.propagation = {.gather_parameters = true}});
  HostProgram parsed = parseHostModule(printHostModule(c.host), "collective");
  runHostPasses(parsed, {"specialize-for-rank", "assign-streams", "insert-deallocations"}, {}, 1);
  EXPECT_EQ(parsed.toString(), programForRank(c, 1).toString());
}

std::string parseError(const std::string& text) {
  try {
    parseHostModule(text, "t.mf");
  } catch (const UserError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Parse);
    return e.message();
  }
  ADD_FAILURE() << "parsed:\n" << text;
  return "";
}

TEST(HostIrText, MalformedTextIsAParseErrorNamingTheLine) {
  CompiledProgram c = compile(parseFusion(readFile("examples/tp_mlp.mf"), "tp_mlp.mf"));
  const std::string good = printHostModule(programForRank(c, 0));
  const size_t fusion_lines = std::count(good.begin(), good.begin() + good.find("hostir"), '\n');
  auto with = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    t.replace(t.find(from), from.size(), to);
    return t;
  };
  const std::string l3 = "t.mf:" + std::to_string(fusion_lines + 3) + ": ";
  EXPECT_EQ(parseError(with("allocate %up", "allocate %nope")),
            l3 + "unknown tensor %nope in `allocate %nope : f32[?t, 64]`");
  EXPECT_EQ(parseError(with("allocate %up : f32[?t, 64]", "allocate %up : f32[?t, 65]")),
            l3 + "the node reads as `allocate %up : f32[?t, 64]`, which is not what is written in `allocate %up : "
                 "f32[?t, 65]`");
  EXPECT_EQ(parseError(with("allocate %up", "frobnicate %up")),
            l3 + "unknown host node 'frobnicate' in `frobnicate %up : f32[?t, 64]`");
  EXPECT_EQ(parseError(with("gemm #0", "gemm #42")).substr(l3.size()),
            "segment #42 does not exist (the fusion has 5 segments) in `gemm #42 %up = linear(%inp, %up_w, "
            "bias=%up_b)`");
  EXPECT_EQ(parseError(good.substr(0, good.find("hostir"))),
            "t.mf: no host program (a line `hostir {` or `hostir rank R {` after the fusion)");
  std::string m = parseError(with("  outputs %out\n", ""));
  EXPECT_NE(m.find(": the host program reads back as `outputs %out` here, not `}`"), std::string::npos) << m;
  m = parseError(with("  outputs %out\n}\n", ""));
  EXPECT_EQ(m, "t.mf: the host program ends inside a loop or without its outputs line");
}

// Head groups that do not split a tensor's [batch, heads] are a parse error, not a failure when
// the program runs (the ring of tests/lit/hostir/ring_attention_head_groups.mf: 2 heads).
TEST(HostIrText, HeadGroupsThatDoNotSplitAreAParseError) {
  PipelineOptions options;
  findCompileOption("cp").set(options, "ring");
  CompiledProgram c =
      compile(parseFusion(readFile("tests/lit/hostir/ring_attention_head_groups.mf"), "groups.mf"), options);
  const std::string good = printHostModule(programForRank(c, 0));
  auto with = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    t.replace(t.find(from), from.size(), to);
    return t;
  };
  EXPECT_THAT(parseError(with("(one head group of 2)", "(one head group of 3)")),
              ::testing::HasSubstr("3 head groups of %k: its 2 (batch, head) pairs ([batch 1, heads 2]) do not split "
                                   "into 3 groups of whole heads of one batch entry or whole batch entries in "
                                   "`allocate %k~4 : f32[1, 1, 4, 4] (one head group of 3)`"));
  EXPECT_THAT(parseError(with("%k[i of 2 heads]", "%k[i of 4 heads]")),
              ::testing::HasSubstr("4 head groups of %k: its 2 (batch, head) pairs"));
}

}  // namespace
}  // namespace meshfuse
