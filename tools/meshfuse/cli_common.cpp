// Helpers shared by the CLI's subcommands.
#include "cli_common.h"

#include <chrono>

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

#include "lower/check_collectives.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/ir/verifier.h"
#include "meshfuse/npy.h"

namespace meshfuse::cli {

std::string readText(const std::string& path) {
  if (path == "-") return std::string(std::istreambuf_iterator<char>(std::cin), {});
  std::error_code ec;
  MF_USER_CHECK(!std::filesystem::is_directory(path, ec), ErrorKind::Runtime,
                "cannot read {}: it is a directory, not a .mf file", path);
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  MF_USER_CHECK(in.good(), ErrorKind::Runtime, "cannot open {}: {}", path,
                errno != 0 ? std::strerror(errno) : "unknown reason");
  std::stringstream ss;
  ss << in.rdbuf();
  MF_USER_CHECK(!in.bad(), ErrorKind::Runtime, "cannot read {}", path);
  return ss.str();
}

std::string displayPath(const std::string& path) { return path == "-" ? "<stdin>" : path; }

std::vector<std::string> splitInput(const std::string& text, bool split) {
  if (!split) return {text};
  std::vector<std::string> pieces(1);
  std::vector<bool> has_code(1, false);
  int64_t line_no = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line); ++line_no) {
    if (line == "# -----" || line.starts_with("# ----- ")) {
      pieces.emplace_back(static_cast<size_t>(line_no + 1), '\n');  // keep later line numbers
      has_code.push_back(false);
      continue;
    }
    size_t first = line.find_first_not_of(" \t\r");
    has_code.back() = has_code.back() || (first != std::string::npos && line[first] != '#');
    pieces.back() += line + "\n";
  }
  std::vector<std::string> cases;
  for (size_t i = 0; i < pieces.size(); ++i)
    if (has_code[i]) cases.push_back(std::move(pieces[i]));
  return cases;
}

SymbolBindings parseSizes(const std::vector<std::string>& args) {
  SymbolBindings sizes;
  for (const std::string& a : args) {
    size_t eq = a.find('=');
    MF_USER_CHECK(eq != std::string::npos && eq > 0, ErrorKind::Value, "--size {}: expected NAME=N, e.g. t=128", a);
    try {
      sizes[a.substr(0, eq)] = std::stoll(a.substr(eq + 1));
    } catch (const std::exception&) {
      userError(ErrorKind::Value, "--size {}: '{}' is not an integer", a, a.substr(eq + 1));
    }
  }
  return sizes;
}

SymbolBindings completeBindings(const Fusion& f, SymbolBindings b, bool warn) {
  std::set<std::string> known;
  for (const TensorView* tv : f.inputs())
    for (const Extent& e : tv->shape())
      if (!e.isStatic()) known.insert("?" + e.symbol());
  for (const auto& [name, value] : b)
    MF_USER_CHECK(known.count("?" + name), ErrorKind::Value, "--size {}={}: the fusion has no size ?{} ({})", name,
                  value, name,
                  known.empty() ? std::string("it has no symbolic sizes")
                                : fmt::format("its symbolic sizes: {}", fmt::join(known, ", ")));
  for (const TensorView* tv : f.inputs())
    for (const Extent& e : tv->shape()) {
      if (e.isStatic() || b.count(e.symbol())) continue;
      b[e.symbol()] = 8;
      if (warn)
        std::cerr << fmt::format("note: size ?{} is not given; using 8 (set it with --size {}=N)\n", e.symbol(),
                                 e.symbol());
    }
  return b;
}

std::vector<Tensor> makeInputs(const Fusion& f, const std::vector<std::string>& npy_files, const SymbolBindings& sizes,
                               uint64_t seed) {
  std::vector<Tensor> inputs;
  if (!npy_files.empty()) {
    MF_USER_CHECK(npy_files.size() == f.inputs().size(), ErrorKind::Value,
                  "--inputs: the fusion takes {} inputs but {} files were given", f.inputs().size(), npy_files.size());
    for (size_t i = 0; i < npy_files.size(); ++i) {
      Tensor t = readNpy(npy_files[i]);
      DataType want = f.inputs()[i]->dtype();
      if (t.dtype() != want && isFloatingPoint(t.dtype()) && isFloatingPoint(want))
        t = Tensor::fromValues(want, t.shape(), t.toValues());
      inputs.push_back(std::move(t));
    }
    return inputs;
  }
  for (size_t i = 0; i < f.inputs().size(); ++i) {
    const TensorView* tv = f.inputs()[i];
    inputs.push_back(Tensor::random(tv->dtype(), tv->evaluateShape(sizes), seed + i));
  }
  return inputs;
}

void createOutputDirectory(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  MF_USER_CHECK(!ec, ErrorKind::Runtime, "--save-outputs {}: cannot create the directory: {}", dir, ec.message());
}

std::string summary(const Tensor& t) {
  std::vector<double> v = t.toValues();
  double sum = 0, sq = 0, lo = INFINITY, hi = -INFINITY;
  for (double x : v) sum += x, sq += x * x, lo = std::min(lo, x), hi = std::max(hi, x);
  double n = std::max<double>(1, static_cast<double>(v.size()));
  double mean = sum / n;
  return fmt::format("mean {:.6g}  std {:.6g}  min {:.6g}  max {:.6g}  sum {:.8g}", mean,
                     std::sqrt(std::max(0.0, sq / n - mean * mean)), lo, hi, sum);
}

std::string formatCollective(const CollectiveInfo& c) {
  // Blocks of different sizes (uneven shards): what padding them to the largest costs on NCCL.
  const std::string padded = c.padded_bytes > 0 ? fmt::format(" ({} padded, NCCL)", c.padded_bytes) : "";
  return fmt::format("{:<15} {} -> {}  mesh axis {}  team [{}]{}  {} bytes{}  ({})", commKindName(c.kind), c.source,
                     c.tensor, c.mesh_axis, fmt::join(c.team, ", "),
                     c.root >= 0 ? fmt::format("  root {}", c.root) : "", c.bytes, padded, c.provenance);
}

std::set<int64_t> meshRanks(const CompiledProgram& program) {
  std::set<int64_t> all;
  for (int64_t m = 0; m < program.fusion->numMeshes(); ++m)
    for (int64_t d : program.fusion->mesh(m).devices()) all.insert(d);
  if (all.empty()) all.insert(0);
  return all;
}

void checkRankOption(const CompiledProgram& program, int64_t rank, bool all_allowed) {
  std::set<int64_t> all = meshRanks(program);
  MF_USER_CHECK(all.count(rank) || (all_allowed && rank == -1), ErrorKind::Value,
                "--rank {}: no mesh of the fusion holds rank {} (its ranks: {}{})", rank, rank, fmt::join(all, ", "),
                all_allowed ? "; -1: all of them" : "");
}

std::string collectiveReport(const CompiledProgram& program, const std::vector<int64_t>& ranks,
                             const SymbolBindings& sizes) {
  std::set<int64_t> all = meshRanks(program);
  for (int64_t r : ranks) checkRankOption(program, r, /*all_allowed=*/false);
  std::string out;
  for (int64_t r : all) {
    if (!ranks.empty() && std::find(ranks.begin(), ranks.end(), r) == ranks.end()) continue;
    HostProgram p = programForRank(program, r);
    std::vector<CollectiveInfo> cs = collectives(p, sizes);
    out += fmt::format("rank {}: {} collective{}, peak memory {} bytes\n", r, cs.size(), cs.size() == 1 ? "" : "s",
                       peakMemoryBytes(p, sizes));
    for (const CollectiveInfo& c : cs) out += "  " + formatCollective(c) + "\n";
    for (const AttentionBlocks& a : attentionBlocks(p, sizes))
      out += fmt::format("  ring attention {}: {} steps{}, {} block pairs of {} rows attended, {} skipped\n", a.tensor,
                         a.steps, a.head_groups > 1 ? fmt::format(" in each of {} head groups", a.head_groups) : "",
                         a.attended, a.chunk, a.skipped);
  }
  return out;
}

std::string verifyCollectives(const CompiledProgram& program, const SymbolBindings& sizes) {
  auto start = std::chrono::steady_clock::now();
  CommunicationPlan plan = checkCollectives(program, sizes);
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count();
  std::set<int64_t> ranks = meshRanks(program);
  size_t n = 0;
  for (int64_t r : ranks) n += plan.of(r).size();
  return fmt::format(
      "verified: the {} rank{}' {} communication{} match (per team: order, kind, size, dtype, reduce op, root; "
      "every send has its recv; no deadlock) in {} us\n",
      ranks.size(), ranks.size() == 1 ? "" : "s", n, n == 1 ? "" : "s", us);
}

}  // namespace meshfuse::cli
