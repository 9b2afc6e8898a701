// Constant and symbolic extents.
#include "meshfuse/ir/extent.h"

#include <algorithm>
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
  userError(ErrorKind::Unsupported, "the product of two symbolic sizes {} and {} is not supported", toString(),
            o.toString());
}

int64_t Extent::evaluate(const SymbolBindings& bindings) const {
  if (isStatic()) return value_;
  auto it = bindings.find(symbol_);
  MF_USER_CHECK(it != bindings.end(), ErrorKind::Shape, "symbolic size ?{} is not bound", symbol_);
  int64_t v = 0;
  MF_USER_CHECK(!__builtin_mul_overflow(it->second, num_, &v), ErrorKind::Shape, "size {} overflows for ?{} = {}",
                toString(), symbol_, it->second);
  MF_USER_CHECK(v % den_ == 0, ErrorKind::Shape, "size {} is not an integer for ?{} = {} ({} is not divisible by {})",
                toString(), symbol_, it->second, v, den_);
  return v / den_;
}

Span chunkSpan(int64_t extent, int64_t parts, int64_t index) {
  MF_CHECK(parts > 0 && index >= 0 && index < parts && extent >= 0, "chunk {} of {} of {} elements", index, parts,
           extent);
  const int64_t full = (extent + parts - 1) / parts;
  const int64_t begin = std::min(extent, full * index);
  return {begin, std::min(extent, begin + full) - begin};
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::optional<int64_t> checkedNumel(const std::vector<int64_t>& shape, int64_t bytes_per_element) {
  // A zero size makes the product 0 whatever the other sizes are, even ones whose product overflows.
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  int64_t n = 1, bytes = 0;
  for (int64_t s : shape)
    if (__builtin_mul_overflow(n, s, &n)) return std::nullopt;
  if (__builtin_mul_overflow(n, bytes_per_element, &bytes)) return std::nullopt;
  return n;
}

std::string Extent::toString() const {
  if (isStatic()) return std::to_string(value_);
  std::string s = "?" + symbol_;
  if (num_ != 1) s += "*" + std::to_string(num_);
  if (den_ != 1) s += "/" + std::to_string(den_);
  return s;
}

}  // namespace meshfuse
