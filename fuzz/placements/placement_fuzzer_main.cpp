// meshfuse_placement_fuzzer: random programs x placements x meshes under mpirun (docs/testing.md,
// "Placement fuzzer"). Every rank generates the same cases (mesh = the whole world: 1-D, or 2x2
// on four ranks), runs them and agrees on each verdict; rank 0 prints. A failure is printed
// (program, placements, both plans), shrunk and written as a .mf reproducer.
//
//   mpirun -np N meshfuse_placement_fuzzer --cases 200 --seed 1 [--first I] [--max-ops 5] [--out DIR]
//                                          [--known FILE] [--no-shrink] [--uneven PERCENT]
//   mpirun -np N meshfuse_placement_fuzzer --replay DIR/<case>.mf
//   meshfuse_placement_fuzzer --help
#define OMPI_SKIP_MPICXX 1
#include <fmt/format.h>
#include <mpi.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "case_spec.h"
#include "meshfuse/ir/printer.h"
#include "run_case.h"
#include "shrink.h"

namespace meshfuse::placement_fuzz {
namespace {

struct Args {
  int64_t cases = 100;
  int64_t first = 0;  // index of the first case (to rerun one: --first I --cases 1)
  uint64_t seed = 1;
  int max_ops = 5;
  std::string out = "placement-fuzz-failures";
  std::string known;   // a file of "<case name> <reason>" lines: failures the run expects
  std::string replay;  // a reproducer to run instead
  bool shrink = true;
  int uneven = 0;  // percent of shard draws that may split a dim unevenly
};

// The options (CLI11: --help lists them). Rank 0 alone prints help or a usage error; every rank
// gets the same answer, so all leave together.
void addOptions(CLI::App& app, Args& a) {
  app.add_option("--cases", a.cases, "how many cases to run")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--seed", a.seed, "the generator's seed (CI runs seed 1, and seed 2 with --uneven 40)")
      ->capture_default_str();
  app.add_option("--first", a.first, "the index of the first case (to rerun one: --first I --cases 1)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--max-ops", a.max_ops, "the most ops a program draws")->check(CLI::Range(1, 12))->capture_default_str();
  app.add_option("--out", a.out, "the folder failures' .mf reproducers are written to")->capture_default_str();
  app.add_option("--known", a.known, "a file of '<case> <reason>' lines: failures the run expects (XFAIL)")
      ->check(CLI::ExistingFile);
  app.add_option("--replay", a.replay, "run the case of a reproducer (its '# case: ' line) instead")
      ->check(CLI::ExistingFile);
  app.add_flag("!--no-shrink", a.shrink, "print a failure as found, without shrinking it");
  app.add_option("--uneven", a.uneven, "percent of shard draws that split a dim unevenly (torch.chunk's blocks)")
      ->check(CLI::Range(0, 100))
      ->capture_default_str();
}

std::map<std::string, std::string> readKnown(const std::string& path) {
  std::map<std::string, std::string> known;
  if (path.empty()) return known;
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("cannot read " + path);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.find(' ');
    known[line.substr(0, sp)] = sp == std::string::npos ? "" : line.substr(sp + 1);
  }
  return known;
}

// The first check letter of a failure ("(a)", "(b)", "(c)" or the rejection): the shrinker keeps
// a candidate only when it fails the same way.
std::string failureClass(const CaseResult& r) { return r.detail.substr(0, r.detail.find(' ')); }

std::string writeReproducer(const Args& a, const CaseSpec& c, const CaseResult& r, int64_t world) {
  std::filesystem::create_directories(a.out);
  const std::string path = fmt::format("{}/{}.mf", a.out, c.name);
  std::ofstream f(path);
  f << fmt::format("# placement-fuzz reproducer {} ({} ranks)\n", c.name, world);
  std::istringstream failure(r.detail);
  for (std::string line; std::getline(failure, line);) f << "# failure: " << line << "\n";
  f << fmt::format("# all checks:    mpirun -np {} build/fuzz/placements/meshfuse_placement_fuzzer --replay {}\n", world, path);
  f << fmt::format("# numerics only: mpirun -np {} build/meshfuse run {} --check\n", world, path);
  f << "# case: " << serializeCase(c) << "\n";
  f << printFusion(*placedDefinition(c));
  return path;
}

struct Tally {
  int64_t run = 0, passed = 0, refused = 0, failed = 0, expected = 0, unexpected_pass = 0, oracle_checked = 0;
  // Passing cases that send more than the bytes-only minimum: each such plan of fewer bytes has
  // more collectives or more work per rank than meshfuse's (oracle.h), which the priority ranks
  // first; counted, not failed.
  int64_t above_bytes_only = 0;
  std::map<std::string, int64_t> refusals;  // first line of each refusal message
};

// Runs one case; on an unexpected failure prints it, shrinks it and writes the reproducer.
void fuzzOne(const Args& a, const CaseSpec& c, Communicator& world, const std::map<std::string, std::string>& known,
             Tally& t) {
  const bool rank0 = world.rank() == 0;
  CaseResult r = runCase(c, world);
  ++t.run;
  t.oracle_checked += r.oracle.applicable ? 1 : 0;
  const auto k = known.find(c.name);
  if (r.status == CaseResult::Refused) {
    ++t.refused;
    ++t.refusals[r.detail.substr(0, std::min<size_t>(r.detail.find('\n'), 120))];
    if (rank0) std::cout << fmt::format("REFUSED {}: {}\n", c.name, r.detail);
  }
  if (r.status != CaseResult::Fail) {
    ++t.passed;
    t.above_bytes_only += r.oracle.bytes_only_min_times_n >= 0 && r.plan_wire_times_n > r.oracle.bytes_only_min_times_n;
    if (k != known.end()) {
      ++t.unexpected_pass;
      if (rank0) std::cout << fmt::format("XPASS {}: passes now; delete its line from the known failures\n", c.name);
    }
    return;
  }
  if (k != known.end()) {
    ++t.expected;
    if (rank0) std::cout << fmt::format("XFAIL {} (known: {})\n", c.name, k->second);
    return;
  }
  ++t.failed;
  if (rank0) std::cout << "FAIL\n" << report(c, r) << std::flush;
  CaseSpec small = c;
  CaseResult small_r = r;
  if (a.shrink) {
    const std::string cls = failureClass(r);
    small = shrinkCase(
        c,
        [&](const CaseSpec& s) {
          CaseResult sr = runCase(s, world);
          if (sr.status != CaseResult::Fail || failureClass(sr) != cls) return false;
          small_r = sr;
          return true;
        },
        /*budget=*/300);
    if (rank0) std::cout << "shrunk to\n" << report(small, small_r);
  }
  if (!rank0) return;
  try {
    std::cout << "reproducer: " << writeReproducer(a, small, small_r, world.size()) << "\n" << std::flush;
  } catch (const std::exception& e) {
    std::cout << "no reproducer written: " << e.what() << "\n" << std::flush;
  }
}

int replay(const Args& a, Communicator& world) {
  std::ifstream in(a.replay);
  if (!in) throw std::invalid_argument("cannot read " + a.replay);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# case: ", 0) != 0) continue;
    CaseSpec c = parseCase(line.substr(8));
    CaseResult r = runCase(c, world);
    if (world.rank() == 0)
      std::cout << (r.status == CaseResult::Fail ? "FAIL\n" + report(c, r) : fmt::format("{}: no failure ({})\n", c.name, r.detail));
    return r.status == CaseResult::Fail ? 1 : 0;
  }
  throw std::invalid_argument(a.replay + " has no '# case: ' line");
}

int fuzz(const Args& a, Communicator& world) {
  const auto known = readKnown(a.known);
  const bool rank0 = world.rank() == 0;
  const auto start = std::chrono::steady_clock::now();
  Tally t;
  for (int64_t i = 0; i < a.cases; ++i) {
    fuzzOne(a, generateCase(a.seed, a.first + i, world.size(), a.max_ops, a.uneven), world, known, t);
    if (rank0 && ((i + 1) % 50 == 0 || i + 1 == a.cases))
      std::cout << fmt::format("[{} ranks] {}/{} cases, {} failed, {} known, {} refused, {} oracle-checked, "
                               "{} above the bytes-only minimum (fewer collectives or less work), {:.0f} s\n",
                               world.size(), i + 1, a.cases, t.failed, t.expected, t.refused, t.oracle_checked,
                               t.above_bytes_only,
                               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count())
                << std::flush;
  }
  if (rank0)
    for (const auto& [msg, n] : t.refusals) std::cout << fmt::format("refused {}x: {}\n", n, msg);
  return t.failed + t.unexpected_pass > 0 ? 1 : 0;
}

}  // namespace
}  // namespace meshfuse::placement_fuzz

int main(int argc, char** argv) {
  using namespace meshfuse::placement_fuzz;
  meshfuse::initializeMpi();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Args a;
  CLI::App app{
      "meshfuse_placement_fuzzer: random programs x placements x meshes, run under mpirun (the mesh is the whole "
      "world: 1-D, or 2x2 on four ranks) and checked against the reference executor, the collectives report and "
      "the optimal-plan oracle (docs/testing.md, \"Placement fuzzer\").\n"
      "  mpirun -np 2 meshfuse_placement_fuzzer --cases 200 --seed 1\n"
      "  mpirun -np 2 meshfuse_placement_fuzzer --replay placement-fuzz-failures/s1-w2-c12.mf"};
  addOptions(app, a);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = rank == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 2);
    MPI_Finalize();
    return rc == 0 ? 0 : 2;
  }
  int rc = 0;
  try {
    std::unique_ptr<meshfuse::Communicator> world = meshfuse::makeMpiCommunicator();
    rc = a.replay.empty() ? fuzz(a, *world) : replay(a, *world);
  } catch (const std::exception& e) {
    std::cerr << "meshfuse_placement_fuzzer: " << e.what() << "\n";
    rc = 2;
  }
  MPI_Finalize();
  return rc;
}
