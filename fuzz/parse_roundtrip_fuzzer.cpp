// Fuzz target `parse_roundtrip`: the .mf parser on arbitrary text (what the CLI reads).
// The input is .mf text. Parse and verify it as `meshfuse print` does; if that succeeds, the
// printed form must parse and verify again and print identically (print -> parse -> print is the
// identity, DESIGN.md "Textual form"). A UserError from the first parse/verify is a pass; a
// printed fusion that does not reparse, or reparses differently, is a finding (fuzz_target.h).
// Seeds: every case of tests/lit and examples (*.mf); dictionary: generated from ops.def.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_target.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/ir/printer.h"
#include "meshfuse/ir/verifier.h"

namespace mf = meshfuse;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  mf::fuzz::runInput([&] {
    std::unique_ptr<mf::Fusion> fusion = mf::parseFusion(text, "fuzz.mf");
    mf::verify(*fusion);
    const std::string printed = mf::printFusion(*fusion);
    std::string reprinted;
    try {
      std::unique_ptr<mf::Fusion> again = mf::parseFusion(printed, "printed.mf");
      mf::verify(*again);
      reprinted = mf::printFusion(*again);
    } catch (const mf::UserError& e) {
      mf::fuzz::finding("the printed form of a valid fusion does not parse: " + e.message() + "\nprinted:\n" + printed);
    }
    mf::fuzz::findingIf(reprinted != printed, "print -> parse -> print is not the identity\nprinted:\n" + printed +
                                                  "\nprinted again:\n" + reprinted);
  });
  return 0;
}
