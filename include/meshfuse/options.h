// Options of the passes (explicit structs: no pass reads the environment; STYLE.md #12).
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "meshfuse/ir/extent.h"

namespace meshfuse {

// propagate-shardings.
// How attention whose key and value sequence arrives sharded is parallelized (docs/parallelisms.md
// "Context parallelism"; the choice: src/propagation/context_parallel.h).
//   Auto:    per mesh axis, Ulysses where the heads divide (it moves the fewest bytes), else ring
//            attention where the query's sequence is split alike (k and v rotate: memory stays
//            O(seq/n)), else the keys and values are gathered;
//   Ulysses: all-to-all to a split of the heads; heads the mesh does not divide are split as
//            torch.chunk splits them (blocks of different sizes);
//   Ring:    k and v rotate around the ring by send/recv while each rank attends its query rows;
//            an error where q, k and v are not all split along the sequence on that axis;
//   Gather:  all-gather k and v (every rank holds the whole key and value sequence).
enum class ContextParallel { Auto, Ulysses, Ring, Gather };
// "auto" | "ulysses" | "ring" | "gather" (the CLI's --cp, Python's cp=); a ValueError names them.
ContextParallel parseContextParallel(const std::string& name);
const char* contextParallelName(ContextParallel cp);

struct PropagationOptions {
  // Fully sharded data parallelism: parameters are all-gathered where they are used and the
  // activations keep their sharding (by default parameters stay and activations move).
  bool gather_parameters = false;
  ContextParallel context_parallel = ContextParallel::Auto;
  // After the op-by-op decisions, search them for a plan that sends fewer bytes
  // (decompose/search_placements.h); off: the greedy plan.
  bool search = true;
};

// decompose-for-overlap: how every allgather+GEMM, GEMM+reduce-scatter and GEMM+allreduce pair
// is pipelined.
//   None:       only the pairs whose GEMM the user's schedule chunks (collective-based);
//   Collective: each pair in chunks, a smaller collective per chunk beside the GEMM of the last;
//   Ring:       the blocks travel around the ring by send/recv beside the GEMMs.
enum class OverlapAlgorithm { None, Collective, Ring };
// "none" | "collective" | "ring" (the CLI's --overlap, Python's overlap=, the IR's overlap=
// attribute); a ValueError names the others.
OverlapAlgorithm parseOverlapAlgorithm(const std::string& name);
const char* overlapAlgorithmName(OverlapAlgorithm algorithm);

// decompose-for-overlap and the streams of its loops.
struct OverlapOptions {
  OverlapAlgorithm algorithm = OverlapAlgorithm::None;
  int64_t chunks = 0;   // 0: as many as devices on the collective's mesh axis
  int64_t streams = 2;  // the stream pool collective-based iterations rotate through
  // Ring attention's head groups, one ring each (lower_ring_attention.h): 0 picks as many as keep
  // its rotation buffers within half a block of the rotating tensors; 1 rotates whole blocks.
  int64_t ring_groups = 0;
};

// Everything compile() (src/lower/pipeline.h) needs: the options of each pass, plus how to
// verify, dump and time them.
struct PipelineOptions {
  PropagationOptions propagation;  // propagate-shardings (e.g. FSDP: gather parameters)
  OverlapOptions overlap;          // decompose-for-overlap and the stream pool of its loops
  // Symbolic sizes known at compile time (empty: bound at run time). Chunked loops (overlap,
  // microbatches) are checked against them, and default chunk counts chosen to divide them.
  SymbolBindings sizes;
  bool verify = true;              // run the verifier after every pass
  std::ostream* dump = nullptr;    // when set, print the IR after each pass here, each headed
                                   // by "# ----- IR after <pass>" (readable with --split-input-file)
  std::ostream* timing = nullptr;  // when set, print each pass's wall time here
};

// The compile options a user sets, listed once: the CLI makes its flags (--overlap ...) and
// Python's FusionDefinitionWrapper its keyword arguments (overlap= ...) from this table, so no
// front end maps options by hand and a new option reaches both. (src/ir/options.cpp)
struct CompileOption {
  enum class Type { Choice, Count, Flag };
  std::string name;                  // --NAME on the CLI, NAME= in Python
  std::string help;                  // one line
  Type type;
  std::vector<std::string> choices;  // Choice: the values it takes
  // The value in `o` as text ("ring", "4", "true"); of a default PipelineOptions: the default.
  std::function<std::string(const PipelineOptions& o)> get;
  // Sets it from text; a ValueError names the option, the value and what it takes.
  std::function<void(PipelineOptions& o, const std::string& value)> set;
};
const std::vector<CompileOption>& compileOptions();
// The option called `name`; a ValueError lists the options.
const CompileOption& findCompileOption(const std::string& name);

}  // namespace meshfuse
