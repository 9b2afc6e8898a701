// The names of the options' enumerations and the table of compile options (options.h): the one
// place that turns the text the front ends take into PipelineOptions.
#include "meshfuse/options.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <utility>

#include "meshfuse/error.h"

namespace meshfuse {
namespace {

template <typename E>
using Names = std::vector<std::pair<E, const char*>>;

const Names<ContextParallel>& contextParallelNames() {
  static const Names<ContextParallel> names = {
      {ContextParallel::Auto, "auto"},
      {ContextParallel::Ulysses, "ulysses"},
      {ContextParallel::Ring, "ring"},
      {ContextParallel::Gather, "gather"}};
  return names;
}

const Names<OverlapAlgorithm>& overlapAlgorithmNames() {
  static const Names<OverlapAlgorithm> names = {
      {OverlapAlgorithm::None, "none"}, {OverlapAlgorithm::Collective, "collective"}, {OverlapAlgorithm::Ring, "ring"}};
  return names;
}

std::vector<std::string> choicesOf(const auto& names) {
  std::vector<std::string> out;
  for (const auto& [value, name] : names) out.push_back(name);
  return out;
}

// "a, b or c"
std::string alternatives(const std::vector<std::string>& choices) {
  std::string s;
  for (size_t i = 0; i < choices.size(); ++i) s += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
  return s;
}

template <typename E>
E parseName(const Names<E>& names, const std::string& text, const char* what) {
  for (const auto& [value, name] : names)
    if (text == name) return value;
  userError(ErrorKind::Value, "{} '{}': expected {}", what, text, alternatives(choicesOf(names)));
}

template <typename E>
const char* nameOf(const Names<E>& names, E value) {
  for (const auto& [v, name] : names)
    if (v == value) return name;
  return "?";
}

// A count option: a whole number >= `least`.
int64_t parseCount(const std::string& option, const std::string& text, int64_t least) {
  int64_t value = 0;
  size_t used = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  MF_USER_CHECK(used > 0 && used == text.size() && value >= least, ErrorKind::Value,
                "{} '{}': expected a whole number >= {}", option, text, least);
  return value;
}

bool parseFlag(const std::string& option, const std::string& text) {
  if (text == "true" || text == "1") return true;
  if (text == "false" || text == "0") return false;
  userError(ErrorKind::Value, "{} '{}': expected true or false", option, text);
}

std::vector<CompileOption> makeCompileOptions() {
  using T = CompileOption::Type;
  return {
      {"overlap",
       "pipeline every allgather+GEMM, GEMM+reduce-scatter and GEMM+allreduce in chunks: none (only pairs whose "
       "GEMM the definition's schedule chunks), collective or ring",
       T::Choice, choicesOf(overlapAlgorithmNames()),
       [](const PipelineOptions& o) { return std::string(overlapAlgorithmName(o.overlap.algorithm)); },
       [](PipelineOptions& o, const std::string& v) { o.overlap.algorithm = parseOverlapAlgorithm(v); }},
      {"chunks", "chunks per overlapped pair (0: one per device on the collective's mesh axis)", T::Count, {},
       [](const PipelineOptions& o) { return std::to_string(o.overlap.chunks); },
       [](PipelineOptions& o, const std::string& v) { o.overlap.chunks = parseCount("chunks", v, 0); }},
      {"streams", "streams the chunks of collective-based overlap rotate through", T::Count, {},
       [](const PipelineOptions& o) { return std::to_string(o.overlap.streams); },
       [](PipelineOptions& o, const std::string& v) { o.overlap.streams = parseCount("streams", v, 1); }},
      {"ring_groups",
       "ring attention runs one ring per group of (batch, head) pairs, one after the other: 0 (as many as keep the "
       "blocks in flight within half a block of k and v, at most 4) or a count (1: whole blocks, n - 1 send/recvs "
       "per tensor)",
       T::Count, {}, [](const PipelineOptions& o) { return std::to_string(o.overlap.ring_groups); },
       [](PipelineOptions& o, const std::string& v) { o.overlap.ring_groups = parseCount("ring_groups", v, 0); }},
      {"fsdp",
       "fully sharded data parallelism: all-gather sharded parameters where they are used (prefetched one layer "
       "ahead) instead of moving the activations",
       T::Flag, {}, [](const PipelineOptions& o) { return std::string(o.propagation.gather_parameters ? "true" : "false"); },
       [](PipelineOptions& o, const std::string& v) { o.propagation.gather_parameters = parseFlag("fsdp", v); }},
      {"plan",
       "how propagation places the intermediates: search (decide op by op, then search those decisions for a plan "
       "that sends fewer bytes, on programs of static sizes and at most 64 ops) or greedy (op by op only)",
       T::Choice, {"search", "greedy"},
       [](const PipelineOptions& o) { return std::string(o.propagation.search ? "search" : "greedy"); },
       [](PipelineOptions& o, const std::string& v) {
         MF_USER_CHECK(v == "search" || v == "greedy", ErrorKind::Value, "plan '{}': expected search or greedy", v);
         o.propagation.search = v == "search";
       }},
      {"cp",
       "context parallelism for attention whose key/value sequence arrives sharded: auto (per mesh axis, Ulysses "
       "where the heads divide, else ring where q is split alike, else gather), ulysses (all-to-all to a split of "
       "the heads), ring (k and v rotate by send/recv while each rank attends its query rows) or gather (all-gather "
       "k and v); a forced choice that cannot apply is an error",
       T::Choice, choicesOf(contextParallelNames()),
       [](const PipelineOptions& o) { return std::string(contextParallelName(o.propagation.context_parallel)); },
       [](PipelineOptions& o, const std::string& v) { o.propagation.context_parallel = parseContextParallel(v); }},
  };
}

}  // namespace

ContextParallel parseContextParallel(const std::string& name) {
  return parseName(contextParallelNames(), name, "context parallelism");
}
const char* contextParallelName(ContextParallel cp) { return nameOf(contextParallelNames(), cp); }

OverlapAlgorithm parseOverlapAlgorithm(const std::string& name) {
  return parseName(overlapAlgorithmNames(), name, "overlap algorithm");
}
const char* overlapAlgorithmName(OverlapAlgorithm algorithm) { return nameOf(overlapAlgorithmNames(), algorithm); }

const std::vector<CompileOption>& compileOptions() {
  static const std::vector<CompileOption> table = makeCompileOptions();
  return table;
}

const CompileOption& findCompileOption(const std::string& name) {
  std::vector<std::string> names;
  for (const CompileOption& o : compileOptions()) {
    if (o.name == name) return o;
    names.push_back(o.name);
  }
  userError(ErrorKind::Value, "unknown compile option '{}' (the options: {})", name, fmt::join(names, ", "));
}

}  // namespace meshfuse
