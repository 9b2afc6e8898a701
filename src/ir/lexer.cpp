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

namespace {

bool isNameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'; }
bool isDigit(char c) { return std::isdigit(static_cast<unsigned char>(c)); }

// A cursor over the text that keeps the line and column of the next byte, and one method per
// token class; each starts at the token's first byte and leaves the cursor after its last.
class Lexer {
 public:
  Lexer(std::string_view s, std::string_view filename) : s_(s), filename_(filename) {}

  std::vector<Token> run() {
    MF_USER_CHECK(!s_.starts_with("\xEF\xBB\xBF"), ErrorKind::Parse,
                  "{}:1:1: the file starts with a UTF-8 byte-order mark (bytes \\xEF\\xBB\\xBF); save it without one",
                  filename_);
    std::vector<Token> out;
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (std::isspace(static_cast<unsigned char>(c))) {
        advance(1);
      } else if (c == '#') {
        while (i_ < s_.size() && s_[i_] != '\n') advance(1);
      } else {
        out.push_back(token(c));
      }
    }
    out.push_back({Token::End, "", line_, col_});
    return out;
  }

 private:
  void advance(size_t n) {
    for (size_t k = 0; k < n; ++k, ++i_) {
      if (s_[i_] == '\n') {
        ++line_;
        col_ = 1;
      } else {
        ++col_;
      }
    }
  }
  char at(size_t k) const { return k < s_.size() ? s_[k] : '\0'; }

  Token token(char c) {
    Token t{Token::Punct, "", line_, col_};
    const size_t start = i_;
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      while (i_ < s_.size() && isNameChar(s_[i_])) advance(1);
      t.kind = Token::Ident;
      t.text = std::string(s_.substr(start, i_ - start));
      if (t.text == "inf" || t.text == "nan") t.kind = Token::Float;  // non-finite scalars
    } else if (c == '%' || c == '@') {
      sigilName(t, c);
    } else if (c == '-' && s_.substr(i_, 4) == "-inf" && (i_ + 4 == s_.size() || !isNameChar(s_[i_ + 4]))) {
      advance(4);
      t.kind = Token::Float;
      t.text = "-inf";
    } else if (isDigit(c) || (c == '-' && (isDigit(at(i_ + 1)) || at(i_ + 1) == '.'))) {
      number(t);
    } else if (c == '"') {
      string(t);
    } else if (std::string_view("=()[]{},:?*/").find(c) != std::string_view::npos) {
      t.text = std::string(1, c);
      advance(1);
    } else {
      userError(ErrorKind::Parse, "{}:{}:{}: unexpected character '{}'", filename_, line_, col_,
                escapeBytes(std::string(1, c)));
    }
    return t;
  }

  // %value or @mesh.
  void sigilName(Token& t, char sigil) {
    advance(1);
    const size_t name_start = i_;
    while (i_ < s_.size() && isNameChar(s_[i_])) advance(1);
    MF_USER_CHECK(i_ > name_start, ErrorKind::Parse, "{}:{}:{}: expected a name after '{}'", filename_, t.line, t.col,
                  sigil);
    t.kind = sigil == '%' ? Token::Value : Token::Mesh;
    t.text = std::string(s_.substr(name_start, i_ - name_start));
  }

  // An integer, or a float when it has a '.' or an exponent.
  void number(Token& t) {
    const size_t start = i_;
    advance(1);
    bool is_float = false;
    while (i_ < s_.size()) {
      const char d = s_[i_];
      if (isDigit(d)) {
        advance(1);
        continue;
      }
      if (d != '.' && d != 'e' && d != 'E') break;
      is_float = true;
      advance(1);
      if ((d == 'e' || d == 'E') && i_ < s_.size() && (s_[i_] == '-' || s_[i_] == '+')) advance(1);
    }
    t.kind = is_float ? Token::Float : Token::Int;
    t.text = std::string(s_.substr(start, i_ - start));
  }

  // A quoted string with the escapes quoteString writes, and no others.
  void string(Token& t) {
    advance(1);
    while (true) {
      MF_USER_CHECK(i_ < s_.size() && s_[i_] != '\n', ErrorKind::Parse, "{}:{}:{}: unterminated string", filename_,
                    t.line, t.col);
      if (s_[i_] == '"') {
        advance(1);
        break;
      }
      if (s_[i_] == '\\' && i_ + 1 < s_.size()) {
        t.text += escape();
        continue;
      }
      t.text += s_[i_];
      advance(1);
    }
    t.kind = Token::String;
  }

  // The byte a backslash escape stands for (the cursor on the backslash).
  char escape() {
    const int esc_line = line_, esc_col = col_;
    advance(1);
    const char e = s_[i_];
    if (e == 'x' && i_ + 2 < s_.size() && hexDigit(s_[i_ + 1]) >= 0 && hexDigit(s_[i_ + 2]) >= 0) {
      const char byte = static_cast<char>(hexDigit(s_[i_ + 1]) * 16 + hexDigit(s_[i_ + 2]));
      advance(3);
      return byte;
    }
    const std::string_view known = "\\\"ntr";
    MF_USER_CHECK(known.find(e) != std::string_view::npos, ErrorKind::Parse,
                  "{}:{}:{}: unknown escape '\\{}' in a string (known: \\\\ \\\" \\n \\t \\r \\xNN)", filename_,
                  esc_line, esc_col, escapeBytes(std::string(1, e)));
    advance(1);
    return e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
  }

  std::string_view s_;
  std::string_view filename_;
  size_t i_ = 0;
  int line_ = 1, col_ = 1;
};

}  // namespace

std::vector<Token> lex(std::string_view s, std::string_view filename) { return Lexer(s, filename).run(); }

}  // namespace meshfuse
