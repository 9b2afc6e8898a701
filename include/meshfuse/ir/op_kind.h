// OpKind and the schema of every op (operands and named attributes), generated from ops.def.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "meshfuse/ir/dtype.h"

namespace meshfuse {

enum class OpKind {
#define MESHFUSE_OP(e, name, cat, operands, attrs) e,
#include "meshfuse/ir/ops.def"
#undef MESHFUSE_OP
};

// Ops of one category share shape inference, sharding rules and kernels.
enum class OpCategory {
  Unary,
  Binary,
  Compare,
  Ternary,
  Cast,
  Set,
  Reduction,
  Gemm,
  BroadcastInDim,
  Reshape,
  Permute,
  Slice,
  Cat,
  Softmax,
  Norm,
  Attention,
  Indexing,
  Loss
};

// The number of op kinds of category `c`, at compile time. A switch that handles the kinds of
// one category and rejects the others (`default:`) cannot rely on -Wswitch; it states the count
// it handles instead, so that a new op of that category in ops.def fails to compile there:
//   static_assert(opCountOf(OpCategory::Unary) == 12, "a new unary op: handle it in unary()");
constexpr int64_t opCountOf(OpCategory c) {
  int64_t n = 0;
#define MESHFUSE_OP(e, name, cat, operands, attrs) n += OpCategory::cat == c ? 1 : 0;
#include "meshfuse/ir/ops.def"
#undef MESHFUSE_OP
  return n;
}

enum class AttrType { Int, Ints, Float, Bool, Str, Dtype };
using AttrValue = std::variant<int64_t, std::vector<int64_t>, double, bool, std::string, DataType>;
using Attributes = std::map<std::string, AttrValue, std::less<>>;

struct OperandSpec {
  std::string name;
  bool optional = false;
  bool variadic = false;
};

struct AttrSpec {
  std::string name;
  AttrType type;
  std::optional<AttrValue> default_value;  // nullopt: required
};

struct OpInfo {
  OpKind kind;
  std::string_view name;
  OpCategory category;
  std::vector<OperandSpec> operands;
  std::vector<AttrSpec> attrs;
  const AttrSpec* findAttr(std::string_view n) const;
  int64_t findOperand(std::string_view n) const;  // -1 when absent
};

const OpInfo& opInfo(OpKind kind);
std::optional<OpKind> parseOpKind(std::string_view name);
const std::vector<OpKind>& allOpKinds();
std::string_view attrTypeName(AttrType t);
bool attrHasType(const AttrValue& v, AttrType t);
std::string formatAttr(const AttrValue& v);  // the .mf literal form
std::string formatFloat(double v);           // shortest text that parses back exactly
// "..." with \\, \", \n, \t, \r and other control bytes (\xNN) escaped: what the lexer reads.
std::string quoteString(const std::string& s);

}  // namespace meshfuse
