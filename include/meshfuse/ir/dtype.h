// Element types. bf16/f16 are stored as their 16-bit patterns; the CPU computes them in f32.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace meshfuse {

#define MESHFUSE_DTYPES(X) \
  X(Float, "f32", 4)       \
  X(BFloat16, "bf16", 2)   \
  X(Half, "f16", 2)        \
  X(Int64, "i64", 8)       \
  X(Bool, "bool", 1)

enum class DataType {
#define MESHFUSE_X(e, s, n) e,
  MESHFUSE_DTYPES(MESHFUSE_X)
#undef MESHFUSE_X
};

std::string_view dtypeName(DataType dt);                     // "f32"
std::optional<DataType> parseDtype(std::string_view name);   // nullopt when unknown
int64_t dtypeSize(DataType dt);
bool isFloatingPoint(DataType dt);
// The machine epsilon (1 to the next representable value) of a floating-point dtype: f32 2^-23,
// bf16 2^-7, f16 2^-10; 0 for i64 and bool.
double dtypeEpsilon(DataType dt);
// Result dtype of a binary op between two tensors (torch-like promotion among our dtypes).
DataType promote(DataType a, DataType b);

// Round a value to what the dtype can represent (used by the reference executor).
double roundToDtype(double v, DataType dt);
uint16_t floatToBf16Bits(float f);  // round-to-nearest-even
float bf16BitsToFloat(uint16_t b);
uint16_t floatToHalfBits(float f);  // round-to-nearest-even, IEEE binary16
float halfBitsToFloat(uint16_t h);

}  // namespace meshfuse
