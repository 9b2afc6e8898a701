// `meshfuse opt-host --pass=NAME[,NAME...] FILE`: the host passes one at a time, on text.
//
// FILE is a host-IR file (printHostModule's form: the decomposed fusion, then `hostir ... {}`),
// or, for lower-to-host-ir, a decomposed fusion alone. The input program is verified first (a
// violation in a file is the user's: a ValueError), each pass is verified after it runs, and the
// result is printed in the same form, so that passes chain through files.
#include "opt_host.h"

#include <iostream>

#include "cli_common.h"
#include "meshfuse/error.h"
#include "lower/host_ir_verifier.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/ir/verifier.h"
#include "lower/pipeline.h"

namespace meshfuse::cli {
namespace {

bool holdsHostProgram(const std::string& text) {
  for (size_t o = 0; o < text.size(); o = text.find('\n', o) + 1) {
    size_t b = text.find_first_not_of(" \t", o);
    if (b != std::string::npos && text.compare(b, 6, "hostir") == 0) return true;
    if (text.find('\n', o) == std::string::npos) break;
  }
  return false;
}

// Verifies the program read from the file (the verifier's InternalError is a pass's bug; here
// the file's author made the mistake).
void verifyInput(const HostProgram& p, bool streams_assigned) {
  try {
    verifyHostIr(p, {.streams_assigned = streams_assigned});
  } catch (const InternalError& e) {
    std::string m = e.what();  // (without InternalError's "this is a bug" prefix: the file is wrong)
    userError(ErrorKind::Value, "the host program read is not valid: {}", m.substr(m.find("host IR verifier")));
  }
}

void runOne(const std::string& text, const OptHostOptions& o) {
  HostProgram p;
  if (holdsHostProgram(text)) {
    p = parseHostModule(text, displayPath(o.file));
    verifyInput(p, /*streams_assigned=*/false);
  } else {
    std::unique_ptr<Fusion> fusion = parseFusion(text, displayPath(o.file));
    verify(*fusion);
    p.fusion = std::shared_ptr<Fusion>(std::move(fusion));
  }
  PipelineOptions options;
  options.overlap.streams = o.streams;
  if (o.dump_each) options.dump = &std::cout;
  if (o.timing) options.timing = &std::cerr;
  runHostPasses(p, o.passes, options, o.rank);
  if (!o.dump_each) std::cout << printHostModule(p);
}

}  // namespace

CLI::App* addOptHost(CLI::App& app, OptHostOptions& o) {
  auto* sub = app.add_subcommand("opt-host", "Run host passes on a host-IR FILE and print the result");
  sub->add_option("FILE", o.file, "the host-IR file (a decomposed fusion, then its host program; '-': stdin)")
      ->required();
  std::string help = "host passes to run, in order (comma-separated):";
  for (const HostPass& p : hostPasses()) help += "\n  " + p.name + ": " + p.description;
  sub->add_option("--pass", o.passes, help + "\n(none: read, verify and print the program)")->delimiter(',');
  sub->add_option("--rank", o.rank, "the rank specialize-for-rank keeps");
  sub->add_option("--streams", o.streams, "lower-to-host-ir: the stream pool of independent loop iterations")
      ->capture_default_str();
  sub->add_flag("--dump-after-each", o.dump_each,
                "print the host IR after every pass, each headed by a line '# ----- host IR after PASS' (so the "
                "output reads back with --split-input-file)");
  sub->add_flag("--timing", o.timing, "print each pass's wall time to stderr");
  sub->add_flag("--split-input-file", o.split, "FILE holds several cases separated by lines '# -----'");
  return sub;
}

int runOptHost(const OptHostOptions& o) {
  std::vector<std::string> pieces;
  int status = 0;
  try {
    pieces = splitInput(readText(o.file), o.split);
  } catch (const UserError& e) {
    std::cerr << "meshfuse: " << errorKindName(e.kind()) << ": " << e.message() << "\n";
    return 1;
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (i > 0) std::cout << "# -----\n";
    try {
      runOne(pieces[i], o);
    } catch (const UserError& e) {
      std::cout << std::flush;
      std::cerr << "meshfuse: " << errorKindName(e.kind()) << ": " << e.message() << "\n";
      status = 1;
    } catch (const InternalError& e) {
      std::cout << std::flush;
      std::cerr << e.what() << "\n";
      return 2;
    }
  }
  return status;
}

}  // namespace meshfuse::cli
