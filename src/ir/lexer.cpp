// Lexer of the .mf text form. `#` starts a comment that runs to the end of the line.
#include "ir/lexer.h"

#include <cctype>

#include "meshfuse/error.h"
#include "meshfuse/ir/op_kind.h"  // quoteString

namespace meshfuse {

namespace {

// Bytes outside printable ASCII as \xNN, so that a message never carries raw control bytes or
// pieces of a UTF-8 sequence to the terminal.
std::string escapeBytes(std::string_view s) {
  std::string out;
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    out += u >= 0x20 && u < 0x7f ? std::string(1, c) : fmt::format("\\x{:02X}", u);
  }
  return out;
}

int hexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string Token::describe() const {
  switch (kind) {
    case Ident: return "'" + escapeBytes(text) + "'";
    case Value: return "'%" + escapeBytes(text) + "'";
    case Mesh: return "'@" + escapeBytes(text) + "'";
    case Int:
    case Float: return "number " + escapeBytes(text);
    case String: return "string " + escapeBytes(quoteString(text));
    case Punct: return "'" + escapeBytes(text) + "'";
    case End: return "end of input";
  }
  return "?";
}

std::vector<Token> lex(std::string_view s, std::string_view filename) {
  std::vector<Token> out;
  int line = 1, col = 1;
  size_t i = 0;
  auto advance = [&](size_t n) {
    for (size_t k = 0; k < n; ++k, ++i) {
      if (s[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
  };
  auto isName = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'; };
  MF_USER_CHECK(!s.starts_with("\xEF\xBB\xBF"), ErrorKind::Parse,
                "{}:1:1: the file starts with a UTF-8 byte-order mark (bytes \\xEF\\xBB\\xBF); save it without one",
                filename);
  while (i < s.size()) {
    char c = s[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      advance(1);
      continue;
    }
    if (c == '#') {
      while (i < s.size() && s[i] != '\n') advance(1);
      continue;
    }
    Token t{Token::Punct, "", line, col};
    size_t start = i;
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      while (i < s.size() && isName(s[i])) advance(1);
      t.kind = Token::Ident;
      t.text = std::string(s.substr(start, i - start));
      if (t.text == "inf" || t.text == "nan") t.kind = Token::Float;  // non-finite scalars
    } else if (c == '%' || c == '@') {
      advance(1);
      size_t name_start = i;
      while (i < s.size() && isName(s[i])) advance(1);
      MF_USER_CHECK(i > name_start, ErrorKind::Parse, "{}:{}:{}: expected a name after '{}'", filename, t.line, t.col,
                    c);
      t.kind = c == '%' ? Token::Value : Token::Mesh;
      t.text = std::string(s.substr(name_start, i - name_start));
    } else if (c == '-' && s.substr(i, 4) == "-inf" && (i + 4 == s.size() || !isName(s[i + 4]))) {
      advance(4);
      t.kind = Token::Float;
      t.text = "-inf";
    } else if (std::isdigit(static_cast<unsigned char>(c)) ||
               (c == '-' && i + 1 < s.size() &&
                (std::isdigit(static_cast<unsigned char>(s[i + 1])) || s[i + 1] == '.'))) {
      advance(1);
      bool is_float = false;
      while (i < s.size()) {
        char d = s[i];
        if (std::isdigit(static_cast<unsigned char>(d))) {
          advance(1);
          continue;
        }
        if (d == '.' || d == 'e' || d == 'E') {
          is_float = true;
          advance(1);
          if ((d == 'e' || d == 'E') && i < s.size() && (s[i] == '-' || s[i] == '+')) advance(1);
          continue;
        }
        break;
      }
      t.kind = is_float ? Token::Float : Token::Int;
      t.text = std::string(s.substr(start, i - start));
    } else if (c == '"') {
      advance(1);
      while (true) {
        MF_USER_CHECK(i < s.size() && s[i] != '\n', ErrorKind::Parse, "{}:{}:{}: unterminated string", filename, t.line,
                      t.col);
        if (s[i] == '"') {
          advance(1);
          break;
        }
        if (s[i] == '\\' && i + 1 < s.size()) {  // the escapes quoteString writes, and no others
          const int esc_line = line, esc_col = col;
          advance(1);
          const char e = s[i];
          if (e == 'x' && i + 2 < s.size() && hexDigit(s[i + 1]) >= 0 && hexDigit(s[i + 2]) >= 0) {
            t.text += static_cast<char>(hexDigit(s[i + 1]) * 16 + hexDigit(s[i + 2]));
            advance(3);
            continue;
          }
          const std::string_view known = "\\\"ntr";
          MF_USER_CHECK(known.find(e) != std::string_view::npos, ErrorKind::Parse,
                        "{}:{}:{}: unknown escape '\\{}' in a string (known: \\\\ \\\" \\n \\t \\r \\xNN)", filename,
                        esc_line, esc_col, escapeBytes(std::string(1, e)));
          t.text += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
          advance(1);
          continue;
        }
        t.text += s[i];
        advance(1);
      }
      t.kind = Token::String;
    } else if (std::string_view("=()[]{},:?*/").find(c) != std::string_view::npos) {
      t.text = std::string(1, c);
      advance(1);
    } else {
      userError(ErrorKind::Parse, "{}:{}:{}: unexpected character '{}'", filename, line, col,
                escapeBytes(std::string(1, c)));
    }
    out.push_back(std::move(t));
  }
  out.push_back({Token::End, "", line, col});
  return out;
}

}  // namespace meshfuse
