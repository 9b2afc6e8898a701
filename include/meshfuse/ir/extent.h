// The extent of an IterDomain: a constant, or a symbolic size (e.g. the batch `?t`, bound when
// inputs arrive) times a rational factor, so that `?t` split by 4 devices is `?t/4`.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace meshfuse {

using SymbolBindings = std::map<std::string, int64_t, std::less<>>;

class Extent {
 public:
  Extent() = default;
  Extent(int64_t value) : value_(value) {}  // NOLINT: constants convert implicitly
  static Extent symbolic(std::string symbol, int64_t num = 1, int64_t den = 1);

  bool isStatic() const { return symbol_.empty(); }
  int64_t value() const;  // requires isStatic()
  const std::string& symbol() const { return symbol_; }
  int64_t num() const { return num_; }
  int64_t den() const { return den_; }

  // Exact division / multiplication; `divisible` tells whether division is exact (symbolic
  // extents are assumed divisible and checked when bound).
  bool divisible(int64_t n) const;
  Extent divided(int64_t n) const;
  Extent multiplied(int64_t n) const;
  Extent multiplied(const Extent& o) const;  // at most one side symbolic

  // Value under `bindings`; throws ShapeError naming the symbol when unbound or when the value
  // is not an integer (a reshape of ?t rows into a size that ?t does not divide).
  int64_t evaluate(const SymbolBindings& bindings) const;

  std::string toString() const;  // "64", "?t", "?t/4", "?t*2"
  bool operator==(const Extent& o) const {
    return value_ == o.value_ && symbol_ == o.symbol_ && num_ == o.num_ && den_ == o.den_;
  }
  bool operator!=(const Extent& o) const { return !(*this == o); }

 private:
  int64_t value_ = 0;
  std::string symbol_;
  int64_t num_ = 1, den_ = 1;
};

// torch.chunk's split of `extent` elements into `parts` (the rule DTensor's Shard follows):
// part `index` starts at `begin` and holds `size` elements. Leading parts hold ceil(extent /
// parts), the trailing ones less, possibly none: 5 over 4 is 2, 2, 1, 0 (torch.chunk then
// returns only 3 chunks; DTensor gives the fourth rank an empty shard, as here).
struct Span {
  int64_t begin = 0;
  int64_t size = 0;
  int64_t end() const { return begin + size; }
  bool operator==(const Span&) const = default;
};
Span chunkSpan(int64_t extent, int64_t parts, int64_t index);

// The element count of an evaluated shape whose sizes are known to be valid (no overflow check).
int64_t numel(const std::vector<int64_t>& shape);
// The element count of `shape`, or nullopt when it, or its size in bytes (times
// `bytes_per_element`), does not fit in an int64. Sizes must be >= 0.
std::optional<int64_t> checkedNumel(const std::vector<int64_t>& shape, int64_t bytes_per_element = 1);

}  // namespace meshfuse
