// What every Backend shares.
#include "runtime/backend.h"

#include <cstring>

#include "meshfuse/error.h"
#include "meshfuse/ir/fusion.h"
#include "runtime/tensor_blocks.h"

namespace meshfuse {

void Backend::copy(Tensor& dst, const Tensor& src) {
  MF_CHECK(dst.dtype() == src.dtype() && dst.numel() == src.numel(), "copy of {} into {}", src.shapeString(),
           dst.shapeString());
  if (src.nbytes() > 0 && dst.data() != src.data()) std::memcpy(dst.data(), src.data(), src.nbytes());
}

void Backend::accumulate(Tensor& dst, const Tensor& src) {
  MF_CHECK(dst.dtype() == src.dtype() && dst.numel() == src.numel(), "accumulating {} into {}", src.shapeString(),
           dst.shapeString());
  const int64_t n = dst.numel();
  if (dst.dtype() == DataType::Float) {
    float* d = static_cast<float*>(dst.data());
    const float* x = static_cast<const float*>(src.data());
    for (int64_t i = 0; i < n; ++i) d[i] += x[i];
    return;
  }
  for (int64_t i = 0; i < n; ++i) dst.set(i, dst.get(i) + src.get(i));  // bf16/f16/i64: through double
}

void Backend::copyBlock(const Tensor& src, const std::vector<int64_t>& so, Tensor& dst, const std::vector<int64_t>& dof,
                        const std::vector<int64_t>& sizes) {
  meshfuse::copyBlock(src, so, dst, dof, sizes);
}

void checkSegmentBuffersDisjoint(const Segment& seg, const std::vector<const Tensor*>& inputs,
                                 const std::vector<Tensor*>& outputs) {
  auto range = [](const Tensor& t) {
    const auto* b = static_cast<const char*>(t.data());
    return std::make_pair(b, b + t.nbytes());
  };
  auto name = [&](size_t i) {
    return i < inputs.size() ? fmt::format("input {}", i) : fmt::format("output {}", i - inputs.size());
  };
  for (size_t o = 0; o < outputs.size(); ++o) {
    auto [ob, oe] = range(*outputs[o]);
    if (ob == oe) continue;
    for (size_t i = 0; i < inputs.size() + o; ++i) {
      const Tensor& t = i < inputs.size() ? *inputs[i] : *outputs[i - inputs.size()];
      auto [b, e] = range(t);
      // An in-place output (Fusion::aliasOutputToInput) is exactly its input's buffer.
      const TensorView* out_tv = seg.outputs.at(o);
      if (i < inputs.size() && b == ob && e == oe && out_tv->fusion()->aliasedInput(out_tv) == seg.inputs.at(i))
        continue;
      MF_CHECK(b == e || e <= ob || oe <= b,
               "{} segment ({} exprs): output {} overlaps {} ([{}, {}) and [{}, {})): generated kernels take every "
               "buffer as restrict/noalias",
               segmentKindName(seg.kind), seg.exprs.size(), o, name(i), fmt::ptr(ob), fmt::ptr(oe), fmt::ptr(b),
               fmt::ptr(e));
    }
  }
}

Streams& Backend::streams() {
  if (!streams_) streams_ = makeCpuStreams();
  return *streams_;
}

}  // namespace meshfuse
