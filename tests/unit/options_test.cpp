// The compile-option table (meshfuse/options.h): the one place the CLI and Python read options
// from. Every option round-trips its default and its values through get/set, and bad values are
// ValueErrors naming the option, the value and what it takes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "meshfuse/error.h"
#include "meshfuse/options.h"
#include "test_helpers.h"

namespace meshfuse {
namespace {

using ::testing::HasSubstr;
using testing_helpers::userErrorMessage;

TEST(CompileOptions, NamesAreUniqueAndDescribed) {
  std::set<std::string> names;
  for (const CompileOption& o : compileOptions()) {
    EXPECT_TRUE(names.insert(o.name).second) << o.name;
    EXPECT_FALSE(o.help.empty()) << o.name;
    EXPECT_EQ(o.type == CompileOption::Type::Choice, !o.choices.empty()) << o.name;
  }
  EXPECT_EQ(names, (std::set<std::string>{"overlap", "chunks", "streams", "ring_groups", "fsdp", "plan", "cp"}));
}

TEST(CompileOptions, DefaultsAreThoseOfPipelineOptions) {
  const PipelineOptions defaults;
  EXPECT_EQ(findCompileOption("overlap").get(defaults), "none");
  EXPECT_EQ(findCompileOption("chunks").get(defaults), "0");
  EXPECT_EQ(findCompileOption("streams").get(defaults), std::to_string(defaults.overlap.streams));
  EXPECT_EQ(findCompileOption("fsdp").get(defaults), "false");
  EXPECT_EQ(findCompileOption("cp").get(defaults), "auto");
}

TEST(CompileOptions, SetThenGetRoundTripsEveryValue) {
  for (const CompileOption& o : compileOptions()) {
    std::vector<std::string> values = o.choices;
    if (o.type == CompileOption::Type::Count) values = {"1", "3"};
    if (o.type == CompileOption::Type::Flag) values = {"true", "false"};
    for (const std::string& v : values) {
      PipelineOptions p;
      o.set(p, v);
      EXPECT_EQ(o.get(p), v) << o.name;
    }
  }
}

TEST(CompileOptions, SetReachesTheTypedField) {
  PipelineOptions p;
  findCompileOption("overlap").set(p, "ring");
  findCompileOption("chunks").set(p, "4");
  findCompileOption("fsdp").set(p, "1");
  EXPECT_EQ(p.overlap.algorithm, OverlapAlgorithm::Ring);
  EXPECT_EQ(p.overlap.chunks, 4);
  EXPECT_TRUE(p.propagation.gather_parameters);
}

TEST(CompileOptions, BadValuesNameTheOptionAndWhatItTakes) {
  PipelineOptions p;
  EXPECT_THAT(userErrorMessage(ErrorKind::Value, [&] { findCompileOption("overlap").set(p, "zigzag"); }), HasSubstr("overlap algorithm 'zigzag': expected none, collective or ring"));
  EXPECT_THAT(userErrorMessage(ErrorKind::Value, [&] { findCompileOption("chunks").set(p, "x"); }), HasSubstr("chunks 'x': expected a whole number >= 0"));
  EXPECT_THAT(userErrorMessage(ErrorKind::Value, [&] { findCompileOption("chunks").set(p, "2x"); }), HasSubstr("chunks '2x'"));
  EXPECT_THAT(userErrorMessage(ErrorKind::Value, [&] { findCompileOption("streams").set(p, "0"); }), HasSubstr("streams '0': expected a whole number >= 1"));
  EXPECT_THAT(userErrorMessage(ErrorKind::Value, [&] { findCompileOption("fsdp").set(p, "yes"); }), HasSubstr("fsdp 'yes': expected true or false"));
  EXPECT_THAT(userErrorMessage(ErrorKind::Value, [&] { findCompileOption("bogus"); }), HasSubstr("unknown compile option 'bogus' (the options: overlap, chunks, streams, ring_groups, fsdp, plan, cp)"));
}

TEST(CompileOptions, EnumNamesRoundTrip) {
  for (OverlapAlgorithm a : {OverlapAlgorithm::None, OverlapAlgorithm::Collective, OverlapAlgorithm::Ring})
    EXPECT_EQ(parseOverlapAlgorithm(overlapAlgorithmName(a)), a);
  for (ContextParallel c : {ContextParallel::Auto, ContextParallel::Ulysses, ContextParallel::Ring, ContextParallel::Gather})
    EXPECT_EQ(parseContextParallel(contextParallelName(c)), c);
}

}  // namespace
}  // namespace meshfuse
