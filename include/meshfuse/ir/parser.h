// Parser of the `.mf` text form (see printer.h for the grammar by example).
#pragma once

#include <memory>
#include <string>
#include <string_view>

namespace meshfuse {

class Fusion;

// Throws ParseError "FILE:LINE:COL: expected ... but found ..." on malformed text, and the
// typed error of the op (with the same location prefix) when an op rejects its operands.
std::unique_ptr<Fusion> parseFusion(std::string_view text, std::string_view filename = "<input>");

}  // namespace meshfuse
