// Element types and their conversions.
#include "meshfuse/ir/dtype.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "meshfuse/error.h"

namespace meshfuse {

std::string_view dtypeName(DataType dt) {
  switch (dt) {
#define MESHFUSE_X(e, s, n) \
  case DataType::e:         \
    return s;
    MESHFUSE_DTYPES(MESHFUSE_X)
#undef MESHFUSE_X
  }
  MF_CHECK(false, "unknown dtype {}", static_cast<int>(dt));
}

std::optional<DataType> parseDtype(std::string_view name) {
#define MESHFUSE_X(e, s, n) \
  if (name == s) return DataType::e;
  MESHFUSE_DTYPES(MESHFUSE_X)
#undef MESHFUSE_X
  return std::nullopt;
}

int64_t dtypeSize(DataType dt) {
  switch (dt) {
#define MESHFUSE_X(e, s, n) \
  case DataType::e:         \
    return n;
    MESHFUSE_DTYPES(MESHFUSE_X)
#undef MESHFUSE_X
  }
  MF_CHECK(false, "unknown dtype {}", static_cast<int>(dt));
}

bool isFloatingPoint(DataType dt) {
  return dt == DataType::Float || dt == DataType::BFloat16 || dt == DataType::Half;
}

double dtypeEpsilon(DataType dt) {
  switch (dt) {
    case DataType::Float: return 0x1p-23;
    case DataType::BFloat16: return 0x1p-7;
    case DataType::Half: return 0x1p-10;
    case DataType::Int64:
    case DataType::Bool: return 0;
  }
  MF_CHECK(false, "unknown dtype");
}

DataType promote(DataType a, DataType b) {
  if (a == b) return a;
  bool fa = isFloatingPoint(a), fb = isFloatingPoint(b);
  if (fa && fb) return DataType::Float;  // bf16 with f16 (or f32): f32 holds both exactly
  if (fa) return a;
  if (fb) return b;
  return DataType::Int64;  // i64 with bool
}

uint16_t floatToBf16Bits(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return 0x7fc0;
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

float bf16BitsToFloat(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

uint16_t floatToHalfBits(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t mant = x & 0x7fffff;
  int32_t exp = static_cast<int32_t>((x >> 23) & 0xff);
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00 | (mant ? 0x200 : 0));
  int32_t e = exp - 127 + 15;
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00);  // overflow -> inf
  if (e <= 0) {                                                // subnormal or zero
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000;
    uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;  // may carry into exponent: ok
  return static_cast<uint16_t>(half);
}

float halfBitsToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  if (exp == 0) {
    float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000 | (mant << 13));
  return std::bit_cast<float>(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

double roundToDtype(double v, DataType dt) {
  switch (dt) {
    case DataType::Float:
      return static_cast<float>(v);
    case DataType::BFloat16:
      return bf16BitsToFloat(floatToBf16Bits(static_cast<float>(v)));
    case DataType::Half:
      return halfBitsToFloat(floatToHalfBits(static_cast<float>(v)));
    case DataType::Int64:
      return std::trunc(v);
    case DataType::Bool:
      return v != 0.0 ? 1.0 : 0.0;
  }
  MF_CHECK(false, "unknown dtype");
}

}  // namespace meshfuse
