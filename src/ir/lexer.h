// Tokens of the .mf text form.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace meshfuse {

struct Token {
  enum Kind { Ident, Value, Mesh, Int, Float, String, Punct, End } kind;
  std::string text;  // identifier/number text, name without its sigil, unescaped string, punct
  int line = 1, col = 1;
  std::string describe() const;  // for "expected X but found Y"
};

// Throws ParseError "FILE:LINE:COL: ..." on a character that starts no token.
std::vector<Token> lex(std::string_view text, std::string_view filename);

}  // namespace meshfuse
