// Fusion::clone: a structural copy indistinguishable from the original (same text, names,
// schedules, pins, provenance) and independent of it; and the passes give the same program on a
// copy as on the original.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "lower/pipeline.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/ir/printer.h"
#include "meshfuse/ops.h"

namespace meshfuse {
namespace {

std::unique_ptr<Fusion> parseFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return parseFusion(s.str(), path.string());
}

std::vector<std::filesystem::path> examples() {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::directory_iterator(std::string(MESHFUSE_SOURCE_DIR) + "/examples"))
    if (e.path().extension() == ".mf") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// Every tensor's display name and provenance, in order.
std::string provenances(const Fusion& f) {
  std::string s;
  for (const TensorView* tv : f.tensorViews()) s += f.displayName(tv) + ": " + tv->provenance() + "\n";
  return s;
}

TEST(FusionClone, EveryExamplePrintsIdentically) {
  std::vector<std::filesystem::path> files = examples();
  ASSERT_GE(files.size(), 5u);
  for (const auto& path : files) {
    std::unique_ptr<Fusion> f = parseFile(path);
    EXPECT_EQ(printFusion(*f->clone()), printFusion(*f)) << path;
  }
}

// After propagation and decomposition a fusion holds meshes, schedules (splits, DID axes),
// Partial dims, pins and provenance: the copy has them all, and compiles to the same program.
TEST(FusionClone, CompiledFusionsKeepScheduleAndProvenance) {
  for (const auto& path : examples()) {
    CompiledProgram c = compile(parseFile(path), {}, /*keep_stages=*/false);
    std::unique_ptr<Fusion> copy = c.fusion->clone();
    EXPECT_EQ(printFusion(*copy), printFusion(*c.fusion)) << path;
    EXPECT_EQ(provenances(*copy), provenances(*c.fusion)) << path;
    for (size_t i = 0; i < copy->tensorViews().size(); ++i) {
      const TensorView* a = c.fusion->tensorViews()[i];
      const TensorView* b = copy->tensorViews()[i];
      EXPECT_EQ(a->pinned(), b->pinned()) << path << " " << c.fusion->displayName(a);
      EXPECT_EQ(a->schedule(), b->schedule()) << path << " " << c.fusion->displayName(a);
      EXPECT_EQ(b->fusion(), copy.get());
    }
  }
  for (const auto& path : examples()) {
    std::unique_ptr<Fusion> f = parseFile(path);
    CompiledProgram from_copy = compile(f->clone());
    CompiledProgram from_original = compile(std::move(f));
    EXPECT_EQ(from_copy.host.toString(), from_original.host.toString()) << path;
  }
}

TEST(FusionClone, TheCopyIsIndependent) {
  Fusion f;
  TensorView* x = f.defineTensor({-1, 8}, DataType::Float, "x");
  TensorView* w = f.defineTensor({4, 8}, DataType::Float, "w");
  TensorView* y = ops::linear(x, w);
  f.addOutput(ops::relu(y));
  f.addOutput(ops::exp(x));
  f.aliasOutputToInput(1, 0);  // exp(x) is written into x's buffer
  const std::string before = printFusion(f);
  std::unique_ptr<Fusion> copy = f.clone();
  EXPECT_EQ(copy->outputAliases(), f.outputAliases());
  copy->rename(copy->findTensor("x"), "renamed");
  copy->addOutput(ops::exp(copy->findTensor("w")));
  EXPECT_EQ(printFusion(f), before);
  EXPECT_NE(printFusion(*copy), before);
  // x's uses (linear and exp) are the copy's ops, not the original's.
  ASSERT_EQ(copy->findTensor("renamed")->uses().size(), 2u);
  for (const Expr* use : copy->findTensor("renamed")->uses()) EXPECT_EQ(use->output()->fusion(), copy.get());
}

}  // namespace
}  // namespace meshfuse
