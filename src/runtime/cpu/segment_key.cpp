// Compile-cache keys (contract in segment_key.h).
#include "runtime/cpu/segment_key.h"

#include <bit>
#include <string_view>
#include <vector>

#include "meshfuse/ir/fusion.h"

namespace meshfuse::cpu {
namespace {

// Two independent 64-bit streams (FNV-1a and a multiply-xorshift), so that a collision needs
// both to collide.
class Hasher {
 public:
  void add(uint64_t x) {
    a_ = (a_ ^ x) * 0x100000001b3ULL;
    b_ = (b_ ^ x) * 0x9E3779B97F4A7C15ULL;
    b_ ^= b_ >> 29;
  }
  void add(double x) { add(std::bit_cast<uint64_t>(x)); }
  void add(std::string_view s) {
    add(static_cast<uint64_t>(s.size()));
    for (char c : s) add(static_cast<uint64_t>(static_cast<unsigned char>(c)));
  }
  void addShape(const std::vector<int64_t>& s) {
    add(static_cast<uint64_t>(s.size()));
    for (int64_t x : s) add(static_cast<uint64_t>(x));
  }
  SegmentKey key() const { return {a_, b_}; }

 private:
  uint64_t a_ = 0xcbf29ce484222325ULL, b_ = 0x84222325cbf29ce4ULL;
};

void addAttr(Hasher& h, const AttrValue& v) {
  h.add(static_cast<uint64_t>(v.index()));
  std::visit(
      [&h](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          h.add(static_cast<uint64_t>(x));
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          h.addShape(x);
        } else if constexpr (std::is_same_v<T, double>) {
          h.add(x);
        } else if constexpr (std::is_same_v<T, bool>) {
          h.add(static_cast<uint64_t>(x));
        } else if constexpr (std::is_same_v<T, std::string>) {
          h.add(std::string_view(x));
        } else {
          h.add(static_cast<uint64_t>(x));  // DataType
        }
      },
      v);
}

}  // namespace

SegmentKey segmentKey(const Segment& seg, const ShapeFn& shape_of) {
  Hasher h;
  // Values are numbered by position: the segment's inputs, then its ops' outputs.
  std::vector<const Val*> numbered;
  numbered.reserve(seg.inputs.size() + seg.exprs.size());
  auto number = [&numbered](const Val* v) {
    for (size_t i = 0; i < numbered.size(); ++i)
      if (numbered[i] == v) return static_cast<uint64_t>(i);
    return ~uint64_t{0};
  };
  h.add(static_cast<uint64_t>(seg.kind));
  for (const TensorView* in : seg.inputs) {
    numbered.push_back(in);
    h.add(static_cast<uint64_t>(in->dtype()));
    h.addShape(shape_of(in));
  }
  for (const Expr* e : seg.exprs) {
    h.add(static_cast<uint64_t>(e->kind()));
    for (const auto& [name, value] : e->attrs()) {
      h.add(std::string_view(name));
      addAttr(h, value);
    }
    for (const Val* v : e->inputs()) {
      if (v == nullptr) {
        h.add(uint64_t{0xab5e47});  // an absent optional operand
      } else if (v->valKind() == ValKind::Scalar) {
        h.add(static_cast<uint64_t>(v->dtype()));
        h.add(static_cast<const Scalar*>(v)->value());
      } else {
        h.add(number(v));
      }
    }
    for (const TensorView* o : e->outputs()) {
      numbered.push_back(o);
      h.add(static_cast<uint64_t>(o->dtype()));
      h.addShape(shape_of(o));
    }
  }
  for (const TensorView* o : seg.outputs) {
    h.add(number(o));
    // An in-place output's kernel drops restrict/noalias on it and its input (kir::Buffer::may_alias).
    if (const TensorView* in = o->fusion()->aliasedInput(o)) h.add(uint64_t{0xa11a5} + number(in));
  }
  return h.key();
}

}  // namespace meshfuse::cpu
