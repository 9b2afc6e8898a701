// The CLI's flags for the compile options (meshfuse/options.h's table): one flag per option.
#pragma once

#include <CLI/CLI.hpp>

#include "meshfuse/options.h"

namespace meshfuse::cli {

// Adds --overlap, --chunks, --streams, --fsdp, --cp (every entry of compileOptions()) to `sub`;
// each sets its field of `pipeline` through the table's parser, so a bad value is the same
// ValueError as in Python.
void addCompileOptions(CLI::App& sub, PipelineOptions& pipeline);

}  // namespace meshfuse::cli
