// `meshfuse opt-host`: run host passes on a host-IR file (docs/host-ir.md "Text form").
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace meshfuse::cli {

struct OptHostOptions {
  std::string file;
  std::vector<std::string> passes;
  int64_t rank = -1;  // specialize-for-rank's rank
  int64_t streams = 1;
  bool dump_each = false, timing = false, split = false;
};

// Adds the subcommand to `app`; its options are written to `o`.
CLI::App* addOptHost(CLI::App& app, OptHostOptions& o);
// Runs it: 0, or 1 after printing a user error (2 for an internal error), as the other commands.
int runOptHost(const OptHostOptions& o);

}  // namespace meshfuse::cli
