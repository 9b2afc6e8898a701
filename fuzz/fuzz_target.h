// What every meshfuse fuzz target (fuzz/*_fuzzer.cpp) treats as a finding, in one place.
//
// A fuzz input is user input: meshfuse may reject it with a UserError (DESIGN.md "Errors"), and
// that is a pass. A finding is anything else that escapes: an InternalError (an MF_CHECK failed:
// a bug by definition), any other exception (user input must never surface as a raw std::
// exception), or a broken invariant that a target checks itself (findingIf). A finding prints
// what happened and aborts, so that libFuzzer saves the input (crash-<sha1>) and a replay
// (fuzz/regressions/, replay_main.cpp) fails; crashes, sanitizer reports and hangs (-timeout)
// are findings without any help from here.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "meshfuse/error.h"

namespace meshfuse::fuzz {

[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "\n==== meshfuse fuzz finding ====\n%s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

inline void findingIf(bool broken, const std::string& what) {
  if (broken) finding(what);
}

// With MESHFUSE_FUZZ_TRACE=1 in the environment, a target says what each input became (the
// program it decoded, the user error that rejected it): for reading a regression input.
inline bool tracing() {
  static const bool on = [] {
    const char* v = std::getenv("MESHFUSE_FUZZ_TRACE");
    return v != nullptr && std::string(v) == "1";
  }();
  return on;
}
inline void trace(const std::string& what) {
  if (tracing()) std::fprintf(stderr, "%s\n", what.c_str());
}

// Runs `body`; a UserError ends the input quietly, anything else is a finding.
template <typename F>
void runInput(F&& body) {
  try {
    body();
    trace("(accepted)");
  } catch (const UserError& e) {
    // Rejected with a typed, located user error: the expected outcome for bad input.
    trace(std::string("(user error) ") + errorKindName(e.kind()) + ": " + e.message());
  } catch (const InternalError& e) {
    finding(std::string("internal error on user input: ") + e.what());
  } catch (const std::exception& e) {
    finding(std::string("an exception that is not a meshfuse::UserError escaped: ") + e.what());
  } catch (...) {
    finding("a non-std exception escaped");
  }
}

}  // namespace meshfuse::fuzz
