// Constant and symbolic extents.
#include "meshfuse/ir/extent.h"

#include <numeric>

#include "meshfuse/error.h"

namespace meshfuse {

Extent Extent::symbolic(std::string symbol, int64_t num, int64_t den) {
  MF_CHECK(!symbol.empty() && num > 0 && den > 0, "bad symbolic extent");
  Extent e;
  e.value_ = -1;
  e.symbol_ = std::move(symbol);
  int64_t g = std::gcd(num, den);
  e.num_ = num / g;
  e.den_ = den / g;
  return e;
}

int64_t Extent::value() const {
  MF_CHECK(isStatic(), "value() of symbolic extent {}", toString());
  return value_;
}

bool Extent::divisible(int64_t n) const { return isStatic() ? value_ % n == 0 : true; }

Extent Extent::divided(int64_t n) const {
  MF_CHECK(n > 0, "divide by {}", n);
  if (isStatic()) return Extent((value_ + n - 1) / n);  // ceil: torch.chunk's leading shards
  return symbolic(symbol_, num_, den_ * n);
}

Extent Extent::multiplied(int64_t n) const {
  if (isStatic()) return Extent(value_ * n);
  return symbolic(symbol_, num_ * n, den_);
}

Extent Extent::multiplied(const Extent& o) const {
  if (o.isStatic()) return multiplied(o.value());
  if (isStatic()) return o.multiplied(value_);
  userError(ErrorKind::Unsupported, "the product of two symbolic sizes {} and {} is not supported",
            toString(), o.toString());
}

int64_t Extent::evaluate(const SymbolBindings& bindings) const {
  if (isStatic()) return value_;
  auto it = bindings.find(symbol_);
  MF_USER_CHECK(it != bindings.end(), ErrorKind::Shape, "symbolic size ?{} is not bound", symbol_);
  int64_t v = it->second * num_;
  MF_USER_CHECK(v % den_ == 0, ErrorKind::Unsupported,
                "uneven sharding not supported: ?{} = {} is not divisible into {} ({})", symbol_,
                it->second, toString(), den_);
  return v / den_;
}

std::string Extent::toString() const {
  if (isStatic()) return std::to_string(value_);
  std::string s = "?" + symbol_;
  if (num_ != 1) s += "*" + std::to_string(num_);
  if (den_ != 1) s += "/" + std::to_string(den_);
  return s;
}

}  // namespace meshfuse
