// Block copies between row-major tensors.
#include "runtime/tensor_blocks.h"

#include <cstring>

#include "meshfuse/error.h"

namespace meshfuse {
namespace {

std::vector<int64_t> strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * shape[i + 1];
  return s;
}

// Calls f(src_flat, dst_flat, run_length) for each innermost contiguous run of the block.
template <typename F>
void forEachRun(const Tensor& src, const std::vector<int64_t>& so, const Tensor& dst, const std::vector<int64_t>& dof,
                const std::vector<int64_t>& sizes, F&& f) {
  const size_t r = sizes.size();
  MF_CHECK(src.rank() == static_cast<int64_t>(r) && dst.rank() == static_cast<int64_t>(r), "block rank mismatch");
  for (size_t d = 0; d < r; ++d)
    MF_CHECK(so[d] + sizes[d] <= src.shape()[d] && dof[d] + sizes[d] <= dst.shape()[d], "block out of bounds");
  for (int64_t s : sizes)
    if (s == 0) return;
  if (r == 0) return f(0, 0, 1);
  std::vector<int64_t> ss = strides(src.shape()), ds = strides(dst.shape());
  std::vector<int64_t> idx(r, 0);
  while (true) {
    int64_t sf = 0, df = 0;
    for (size_t d = 0; d < r; ++d) sf += (so[d] + idx[d]) * ss[d], df += (dof[d] + idx[d]) * ds[d];
    f(sf, df, sizes[r - 1]);
    int64_t d = static_cast<int64_t>(r) - 2;
    for (; d >= 0; --d) {
      if (++idx[d] < sizes[d]) break;
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

}  // namespace

void copyBlock(const Tensor& src, const std::vector<int64_t>& so, Tensor& dst, const std::vector<int64_t>& dof,
               const std::vector<int64_t>& sizes) {
  MF_CHECK(src.dtype() == dst.dtype(), "copyBlock dtype mismatch");
  const int64_t es = dtypeSize(src.dtype());
  const auto* s = static_cast<const std::byte*>(src.data());
  auto* d = static_cast<std::byte*>(dst.data());
  forEachRun(src, so, dst, dof, sizes, [&](int64_t sf, int64_t df, int64_t n) { std::memcpy(d + df * es, s + sf * es, n * es); });
}

void addBlock(const Tensor& src, const std::vector<int64_t>& so, Tensor& dst, const std::vector<int64_t>& dof,
              const std::vector<int64_t>& sizes) {
  forEachRun(src, so, dst, dof, sizes, [&](int64_t sf, int64_t df, int64_t n) {
    for (int64_t i = 0; i < n; ++i) dst.set(df + i, dst.get(df + i) + src.get(sf + i));
  });
}

}  // namespace meshfuse
