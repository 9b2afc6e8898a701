// Expr: one op application. Its kind's schema (ops.def) names its operands and attributes.
#pragma once

#include <string_view>
#include <vector>

#include "meshfuse/error.h"
#include "meshfuse/ir/op_kind.h"
#include "meshfuse/ir/val.h"

namespace meshfuse {

class Expr {
 public:
  OpKind kind() const { return kind_; }
  const OpInfo& info() const { return opInfo(kind_); }
  std::string_view name() const { return info().name; }

  // Operands aligned with the schema: an absent optional operand is nullptr; a variadic tail
  // contributes all its values.
  const std::vector<Val*>& inputs() const { return inputs_; }
  // The operand named `n` in the schema, or nullptr when it is an absent optional.
  Val* input(std::string_view n) const;
  Val* input(size_t i) const { return inputs_.at(i); }
  const std::vector<TensorView*>& outputs() const { return outputs_; }
  TensorView* output(size_t i = 0) const { return outputs_.at(i); }

  const Attributes& attrs() const { return attrs_; }
  template <typename T>
  const T& attr(std::string_view n) const {
    auto it = attrs_.find(n);
    MF_CHECK(it != attrs_.end(), "{} has no attribute '{}'", name(), n);
    return std::get<T>(it->second);
  }

 private:
  friend class Fusion;
  Expr(OpKind k, std::vector<Val*> in, Attributes a)
      : kind_(k), inputs_(std::move(in)), attrs_(std::move(a)) {}
  OpKind kind_;
  std::vector<Val*> inputs_;
  std::vector<TensorView*> outputs_;
  Attributes attrs_;
};

}  // namespace meshfuse
