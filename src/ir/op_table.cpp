// The op schema table, built once from ops.def.
#include <cmath>
#include <cstdlib>
#include <string>

#include "meshfuse/error.h"
#include "meshfuse/ir/op_kind.h"

namespace meshfuse {
namespace {

std::string trim(std::string s) {
  size_t b = s.find_first_not_of(' '), e = s.find_last_not_of(' ');
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::vector<std::string> splitList(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    std::string item = trim(s.substr(start, comma - start));
    if (!item.empty()) out.push_back(item);
    start = comma + 1;
  }
  return out;
}

AttrType parseAttrType(const std::string& t) {
  if (t == "int") return AttrType::Int;
  if (t == "ints") return AttrType::Ints;
  if (t == "float") return AttrType::Float;
  if (t == "bool") return AttrType::Bool;
  if (t == "str") return AttrType::Str;
  if (t == "dtype") return AttrType::Dtype;
  MF_CHECK(false, "bad attribute type '{}' in ops.def", t);
}

AttrValue parseDefault(AttrType t, const std::string& v) {
  switch (t) {
    case AttrType::Int: return static_cast<int64_t>(std::stoll(v));
    case AttrType::Float: return std::strtod(v.c_str(), nullptr);
    case AttrType::Bool: return v == "true";
    case AttrType::Str: return v;
    default: MF_CHECK(false, "attribute type without default support");
  }
}

OpInfo makeInfo(OpKind kind, std::string_view name, OpCategory cat, const char* operands, const char* attrs) {
  OpInfo info{kind, name, cat, {}, {}};
  for (std::string o : splitList(operands)) {
    OperandSpec spec;
    if (o.ends_with("...")) {
      spec.variadic = true;
      o.resize(o.size() - 3);
    }
    if (o.ends_with("?")) {
      spec.optional = true;
      o.pop_back();
    }
    spec.name = o;
    info.operands.push_back(spec);
  }
  for (const std::string& a : splitList(attrs)) {
    size_t colon = a.find(':'), eq = a.find('=');
    AttrSpec spec{a.substr(0, colon), AttrType::Int, std::nullopt};
    spec.type = parseAttrType(a.substr(colon + 1, eq == std::string::npos ? std::string::npos : eq - colon - 1));
    if (eq != std::string::npos) spec.default_value = parseDefault(spec.type, a.substr(eq + 1));
    info.attrs.push_back(spec);
  }
  return info;
}

const std::vector<OpInfo>& table() {
  static const std::vector<OpInfo> t = {
#define MESHFUSE_OP(e, name, cat, operands, attrs) makeInfo(OpKind::e, name, OpCategory::cat, operands, attrs),
#include "meshfuse/ir/ops.def"
#undef MESHFUSE_OP
  };
  return t;
}

}  // namespace

const AttrSpec* OpInfo::findAttr(std::string_view n) const {
  for (const AttrSpec& a : attrs)
    if (a.name == n) return &a;
  return nullptr;
}

int64_t OpInfo::findOperand(std::string_view n) const {
  for (size_t i = 0; i < operands.size(); ++i)
    if (operands[i].name == n) return static_cast<int64_t>(i);
  return -1;
}

const OpInfo& opInfo(OpKind kind) { return table().at(static_cast<size_t>(kind)); }

std::optional<OpKind> parseOpKind(std::string_view name) {
  for (const OpInfo& i : table())
    if (i.name == name) return i.kind;
  return std::nullopt;
}

const std::vector<OpKind>& allOpKinds() {
  static const std::vector<OpKind> kinds = [] {
    std::vector<OpKind> k;
    for (const OpInfo& i : table()) k.push_back(i.kind);
    return k;
  }();
  return kinds;
}

std::string_view attrTypeName(AttrType t) {
  switch (t) {
    case AttrType::Int: return "int";
    case AttrType::Ints: return "ints";
    case AttrType::Float: return "float";
    case AttrType::Bool: return "bool";
    case AttrType::Str: return "str";
    case AttrType::Dtype: return "dtype";
  }
  return "?";
}

bool attrHasType(const AttrValue& v, AttrType t) {
  switch (t) {
    case AttrType::Int: return std::holds_alternative<int64_t>(v);
    case AttrType::Ints: return std::holds_alternative<std::vector<int64_t>>(v);
    case AttrType::Float: return std::holds_alternative<double>(v);
    case AttrType::Bool: return std::holds_alternative<bool>(v);
    case AttrType::Str: return std::holds_alternative<std::string>(v);
    case AttrType::Dtype: return std::holds_alternative<DataType>(v);
  }
  return false;
}

std::string formatFloat(double v) {
  // Shortest text that parses back to the same double (subnormals too); NaN has no sign here.
  if (std::isnan(v)) return "nan";
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eE") == std::string::npos && s.find("inf") == std::string::npos &&
      s.find("nan") == std::string::npos)
    s += ".0";
  return s;
}

std::string quoteString(const std::string& s) {
  // Bytes >= 0x80 (UTF-8 text) stay as they are; the lexer reads back exactly these escapes.
  std::string out = "\"";
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\x{:02X}", u);
    } else {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
  }
  return out + "\"";
}

std::string formatAttr(const AttrValue& v) {
  struct {
    std::string operator()(int64_t x) { return std::to_string(x); }
    std::string operator()(const std::vector<int64_t>& x) { return fmt::format("[{}]", fmt::join(x, ", ")); }
    std::string operator()(double x) { return formatFloat(x); }
    std::string operator()(bool x) { return x ? "true" : "false"; }
    std::string operator()(const std::string& x) { return quoteString(x); }
    std::string operator()(DataType x) { return std::string(dtypeName(x)); }
  } visitor;
  return std::visit(visitor, v);
}

}  // namespace meshfuse
