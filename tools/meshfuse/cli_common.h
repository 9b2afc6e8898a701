// Helpers shared by the CLI's subcommands.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "lower/host_ir.h"
#include "meshfuse/ir/fusion.h"
#include "lower/pipeline.h"
#include "driver/backends.h"
#include "runtime/backend.h"
#include "meshfuse/communicator.h"
#include "meshfuse/tensor.h"

namespace meshfuse::cli {

std::string readText(const std::string& path);
// The texts of FILE's cases: the whole file, or with `split` the pieces between separator lines:
// "# -----", optionally followed by a space and a comment ("# ----- IR after propagate-shardings",
// as --dump-after-each writes), like MLIR's --split-input-file. Pieces with nothing but blank and
// comment lines (before a leading separator) are dropped. Each piece keeps its line numbers
// (earlier lines become blank), so errors point into the original file.
std::vector<std::string> splitInput(const std::string& text, bool split);
// The name parse errors use for `path`.
std::string displayPath(const std::string& path);
// "t=128" arguments of --size.
SymbolBindings parseSizes(const std::vector<std::string>& args);
// Binds every symbolic input size: from `sizes`, else 8 (with a note on stderr when `warn`).
// A size the fusion does not have is a ValueError naming the sizes it has.
SymbolBindings completeBindings(const Fusion& f, SymbolBindings sizes, bool warn);
// Full (global) inputs: seeded random (input i uses seed + i), or read from .npy files.
std::vector<Tensor> makeInputs(const Fusion& f, const std::vector<std::string>& npy_files, const SymbolBindings& sizes,
                               uint64_t seed);
// Creates --save-outputs' directory (RuntimeError naming it and the system's reason on failure).
void createOutputDirectory(const std::string& dir);
// "mean .. std .. min .. max .. sum .." of a tensor.
std::string summary(const Tensor& t);

struct ShardedRunOptions {
  std::vector<std::string> npy_inputs;
  SymbolBindings sizes;
  uint64_t seed = 0;
  bool check = false;
  bool print_hostir = false;
  std::string save_dir;
  std::string trace_file;       // --trace: Chrome/Perfetto timeline of every rank
  std::string device = "auto";  // --device
  PipelineOptions pipeline;     // --overlap, --chunks, --streams
  int64_t fail_on_rank = -1;    // --inject-failure-on-rank: this rank throws before running
};
// What runSharded runs on (tests replace it): the control communicator (host memory: outputs
// gathered on rank 0, timelines, the exit code), the backend for --device, and the data
// communicator that moves that backend's buffers (null: the control one serves).
struct RunEnvironment {
  std::function<std::unique_ptr<Communicator>()> control;
  std::function<std::unique_ptr<Backend>(const std::string& device)> backend;
  std::function<std::unique_ptr<Communicator>(const Backend&)> data;
};
// makeDefaultCommunicator(), makeBackend(device), and for a CUDA backend makeCudaCommunicator over
// a second world communicator.
RunEnvironment defaultRunEnvironment();

// Runs `definition` on this process's rank of the world its meshes need (one rank when it has no
// mesh) on `options.device`; rank 0 gathers the outputs and, with `check`, compares them with the
// reference executor (compareWithReference). Returns the exit code.
int runSharded(const Fusion& definition, const ShardedRunOptions& options);
int runSharded(const Fusion& definition, const ShardedRunOptions& options, const RunEnvironment& env);

// The ranks the meshes of `program` name (just 0 for a fusion without meshes).
std::set<int64_t> meshRanks(const CompiledProgram& program);
// --rank RANK must be one of meshRanks (or -1 where `all_allowed`: every rank); ValueError naming
// the ranks there are otherwise.
void checkRankOption(const CompiledProgram& program, int64_t rank, bool all_allowed);

// "allreduce  %4 -> %5  mesh axis 0  team [0, 1]  4096 bytes  (why)"; an allgather or reduce-scatter of
// blocks of different sizes adds what padding them costs on NCCL: "768 bytes (1024 padded, NCCL)".
std::string formatCollective(const CollectiveInfo& c);
// Every rank's collectives (or only `ranks`') without running, for `meshfuse collectives`.
// check-collectives over every rank's program: one line saying what was proved and its cost;
// a mismatch throws (an internal error naming both ranks and nodes).
std::string verifyCollectives(const CompiledProgram& program, const SymbolBindings& sizes);
std::string collectiveReport(const CompiledProgram& program, const std::vector<int64_t>& ranks,
                             const SymbolBindings& sizes);

}  // namespace meshfuse::cli
