// Lowering of microbatched programs (contract in lower_microbatches.h).
#include "lower/lower_microbatches.h"

#include <algorithm>
#include <set>

#include "lower/host_builder.h"
#include "lower/lower_segment.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/placement.h"

namespace meshfuse {

bool isMicrobatched(const Fusion& f) {
  return std::any_of(f.inputs().begin(), f.inputs().end(),
                     [](const TensorView* in) { return streamSplitOf(in).has_value(); });
}

namespace {

bool microbatched(const TensorView* tv) { return streamSplitOf(tv).has_value(); }

class MicrobatchLowering {
 public:
  MicrobatchLowering(const Fusion& f, const std::vector<Segment>& segments) : f_(f), segments_(segments) {
    for (const TensorView* in : f.inputs())
      if (std::optional<StreamSplit> s = streamSplitOf(in)) chunks_ = s->chunks;
  }

  void lower(std::vector<HostNode>& out) {
    std::vector<HostNode> body;
    std::vector<const TensorView*> buffers;  // one-microbatch buffers allocated in the body
    for (size_t i = 0; i < segments_.size(); ++i) {
      const Segment& seg = segments_[i];
      bool in_loop = std::any_of(seg.outputs.begin(), seg.outputs.end(), microbatched);
      if (!in_loop) {
        for (const TensorView* in : seg.inputs)
          MF_USER_CHECK(!microbatched(in), ErrorKind::Unsupported,
                        "{} needs every microbatch of {} at once; microbatched pipelines need ops that process rows "
                        "independently",
                        seg.exprs.at(0)->name(), f_.displayName(in));
        for (const TensorView* o : seg.outputs) out.push_back(host::allocate(o));
        for (HostNode& n : segmentNodes(seg, static_cast<int64_t>(i), handles_)) out.push_back(std::move(n));
        continue;
      }
      for (const TensorView* o : seg.outputs) {
        if (f_.isOutput(o)) {
          out.push_back(host::allocate(o));  // whole, written one microbatch at a time
        } else {
          body.push_back(host::allocate(o, chunks_));
          buffers.push_back(o);
        }
      }
      for (HostNode& n : segmentNodes(seg, static_cast<int64_t>(i), handles_)) {
        n.visit([&](auto& node) {
          using T = std::decay_t<decltype(node)>;
          if constexpr (std::is_base_of_v<hir::SegmentCall, T>) {
            for (const TensorView* tv : seg.inputs) node.views.push_back(view(tv));
            for (const TensorView* tv : seg.outputs) node.views.push_back(view(tv));
          } else if constexpr (std::is_same_v<T, hir::Communication> || std::is_same_v<T, hir::ShardSlice>) {
            node.in = view(node.in.tv);
            node.out = view(node.out.tv);
          }
        });
        body.push_back(std::move(n));
      }
    }
    for (const TensorView* tv : buffers) body.push_back(host::deallocate(tv, chunks_));
    out.push_back(host::loop(chunks_, std::move(body)));
  }

 private:
  // A microbatched fusion input or output is read/written one block per iteration; a body
  // buffer holds the microbatch already; anything else is whole.
  BlockRef view(const TensorView* tv) const {
    BlockRef b = BlockRef::of(tv);
    if (microbatched(tv) && (f_.isInput(tv) || f_.isOutput(tv))) {
      b.blocks = chunks_;
      b.loop_coeffs = {1};
    }
    return b;
  }

  const Fusion& f_;
  const std::vector<Segment>& segments_;
  int64_t chunks_ = 1;
  int64_t handles_ = 0;
};

}  // namespace

void lowerMicrobatched(const Fusion& fusion, const std::vector<Segment>& segments, std::vector<HostNode>& out) {
  MicrobatchLowering(fusion, segments).lower(out);
}

}  // namespace meshfuse
