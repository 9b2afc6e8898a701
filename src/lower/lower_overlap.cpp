// Lowering of overlapped (collective, GEMM) pairs (contract in lower_overlap.h).
#include "lower/lower_overlap.h"

#include <algorithm>

#include "lower/host_builder.h"
#include "lower/lower_segment.h"
#include "meshfuse/ir/fusion.h"
#include "propagation/sharding.h"

namespace meshfuse {
namespace {

using host::allocate;
using host::block;
using host::copy;
using host::deallocate;
using host::event;
using host::loop;
using host::onStream;
using host::wait;

// ---- the pair ---------------------------------------------------------------------------------

class PairLowering {
 public:
  PairLowering(const Segment& comm_seg, const Segment& gemm_seg, int64_t gemm_index, int64_t pool,
               OverlapLoweringState& state)
      : set_(comm_seg.exprs.at(0)), gemm_seg_(gemm_seg), gemm_index_(gemm_index), pool_(pool), state_(state) {
    x_ = static_cast<const TensorView*>(set_->input(size_t{0}));
    y_ = set_->output();
    Sharding from = readSharding(x_), to = readSharding(y_);
    for (size_t a = 0; a < from.axes.size(); ++a)
      if (from.axes[a] != to.axes[a]) axis_ = static_cast<int64_t>(a), change_to_ = to.axes[a];
    MF_CHECK(axis_ >= 0, "an overlapped set that changes no mesh axis");
    n_ = y_->mesh()->size(axis_);
    s_ = set_->attr<int64_t>("chunks");
    ring_ = set_->attr<std::string>("overlap") == "ring";
    gathers_ = readSharding(x_).axes[axis_].kind == Placement::Shard;
  }

  void lower(std::vector<HostNode>& out) {
    if (gathers_) {
      ring_ ? allgatherRing(out) : allgatherCollective(out);
    } else if (change_to_.kind == Placement::Shard) {
      ring_ ? reduceScatterRing(out) : reduceScatterCollective(out);
    } else {
      ring_ ? allreduceRing(out) : allreduceCollective(out);
    }
  }

 private:
  HostNode gemm(const BlockRef& row_in, const BlockRef& row_out) const {
    return gemmOnRows(gemm_seg_, gemm_index_, row_in, row_out);
  }
  const TensorView* gemmRows() const { return static_cast<const TensorView*>(gemm_seg_.exprs.at(0)->input(size_t{0})); }
  const TensorView* gemmOut() const { return gemm_seg_.outputs.at(0); }

  HostNode comm(CommKind kind, BlockRef in, BlockRef out, int64_t* handle) const {
    hir::Communication n = host::communication(kind, std::move(in), std::move(out), axis_, *handle = state_.handles++);
    if (kind == CommKind::Allgather) n.in_dim = 0;
    if (kind == CommKind::ReduceScatter) n.out_dim = 0;
    if (kind == CommKind::SendRecv) n.shift = 1;
    return n;
  }

  // The loop of collective-based pairs: independent iterations, on the stream pool
  // (assign-streams places them: each after the main stream's state at the loop's start, joined
  // at the end).
  void collectiveLoop(std::vector<HostNode> body, std::vector<HostNode>& out) {
    out.push_back(loop(s_, std::move(body), pool_));
  }

  void allgatherCollective(std::vector<HostNode>& out) {
    for (const TensorView* o : gemm_seg_.outputs) out.push_back(allocate(o));
    std::vector<HostNode> body;
    int64_t h = 0;
    // One chunk of the gathered rows: chunk i of every rank's shard (of unequal sizes where the
    // shards or their chunks are uneven), gathered by one collective.
    body.push_back(allocate(y_, s_, 0, n_));
    body.push_back(comm(CommKind::Allgather, block(x_, s_, {1}, 0, 0, axis_), BlockRef::of(y_), &h));
    body.push_back(wait(h));
    for (int64_t r = 0; r < n_; ++r)
      body.push_back(gemm(block(y_, n_, {}, 0, r, axis_), block(gemmOut(), n_ * s_, {1}, 0, r * s_, axis_, 0, s_)));
    body.push_back(deallocate(y_, s_, 0, n_));
    collectiveLoop(std::move(body), out);
  }

  void reduceScatterCollective(std::vector<HostNode>& out) {
    out.push_back(allocate(y_));
    std::vector<HostNode> body;
    int64_t h = 0;
    body.push_back(allocate(x_, s_, 0, n_));  // the partial rows of chunk i of every rank's result
    for (int64_t r = 0; r < n_; ++r)
      body.push_back(gemm(block(gemmRows(), n_ * s_, {1}, 0, r * s_, axis_, 0, s_), block(x_, n_, {}, 0, r, axis_)));
    body.push_back(comm(CommKind::ReduceScatter, BlockRef::of(x_), block(y_, s_, {1}, 0, 0, axis_), &h));
    body.push_back(wait(h));
    body.push_back(deallocate(x_, s_, 0, n_));
    collectiveLoop(std::move(body), out);
  }

  void allreduceCollective(std::vector<HostNode>& out) {
    out.push_back(allocate(y_));
    std::vector<HostNode> body;
    int64_t h = 0;
    body.push_back(allocate(x_, s_));
    body.push_back(gemm(block(gemmRows(), s_, {1}, 0, 0, axis_), BlockRef::of(x_)));
    body.push_back(comm(CommKind::Allreduce, BlockRef::of(x_), block(y_, s_, {1}, 0, 0, axis_), &h));
    body.push_back(wait(h));
    body.push_back(deallocate(x_, s_));
    collectiveLoop(std::move(body), out);
  }

  // Ring allgather + GEMM. The gathered tensor is filled block by block: at step k this rank
  // holds block r - k (in c sub-chunks), computes on it, and forwards it to rank r + 1 while
  // receiving block r - k - 1 from rank r - 1.
  void allgatherRing(std::vector<HostNode>& out) {
    const int64_t c = s_ / n_, nc = n_ * c;
    const int64_t start = state_.events++, arrived = state_.events++;
    for (const TensorView* o : gemm_seg_.outputs) out.push_back(allocate(o));
    out.push_back(allocate(y_));
    out.push_back(copy(BlockRef::of(x_), block(y_, n_, {}, 1, 0, axis_), false));
    out.push_back(event(HostNodeKind::RecordEvent, start));
    auto rows = [&](int64_t k_coeff, int64_t offset) {  // sub-chunk (r - k)*c + q + offset
      return std::vector<BlockRef>{block(y_, nc, {-c * k_coeff, 1}, c, offset, axis_, 0, c),
                                   block(gemmOut(), nc, {-c * k_coeff, 1}, c, offset, axis_, 0, c)};
    };
    // Steps k in [0, n - 1): forward the block (stream 1), compute on it (main stream).
    int64_t h = 0;
    std::vector<HostNode> step;
    step.push_back(onStream(1));
    step.push_back(event(HostNodeKind::WaitEvent, start));
    step.push_back(comm(CommKind::SendRecv, rows(1, 0)[0], block(y_, nc, {-c, 1}, c, -c, axis_, 0, c), &h));
    step.push_back(wait(h));
    step.push_back(event(HostNodeKind::RecordEvent, arrived, {c, 1}));
    step.push_back(onStream(0));
    step.push_back(event(HostNodeKind::WaitEvent, arrived, {c, 1}, -c));  // the block came in the previous step
    step.push_back(gemm(rows(1, 0)[0], rows(1, 0)[1]));
    out.push_back(loop(n_ - 1, {loop(c, std::move(step))}));
    // The last step k = n - 1: block r + 1, nothing left to forward.
    std::vector<HostNode> last;
    last.push_back(event(HostNodeKind::WaitEvent, arrived, {1}, (n_ - 2) * c));
    last.push_back(gemm(block(y_, nc, {1}, c, -(n_ - 1) * c, axis_, 0, c),
                        block(gemmOut(), nc, {1}, c, -(n_ - 1) * c, axis_, 0, c)));
    out.push_back(loop(c, std::move(last)));
    out.push_back(host::sync());
  }

  // Ring GEMM + reduce-scatter into `result` blocks: at step k this rank computes the partial
  // of block b = r - k - 1, adds the partial of b it received from rank r - 1 (which computed
  // it one step earlier), and passes the sum to rank r + 1; at the last step b = r and the sum
  // is complete. The partials live in x (slot 0); received ones in x~1.
  void reduceScatterRingInto(const BlockRef& result_of_q, std::vector<HostNode>& out) {
    const int64_t c = s_ / n_, nc = n_ * c;
    const int64_t computed = state_.events++, received = state_.events++;
    out.push_back(allocate(x_));
    out.push_back(allocate(x_, 1, 1));
    auto part = [&](std::vector<int64_t> coeffs, int64_t offset, int64_t slot = 0) {
      return block(x_, nc, std::move(coeffs), c, offset, axis_, slot, c);
    };
    auto rows = [&](std::vector<int64_t> coeffs, int64_t offset) {
      return block(gemmRows(), nc, std::move(coeffs), c, offset, axis_, 0, c);
    };
    int64_t h = 0;
    // Step 0: b = r - 1.
    std::vector<HostNode> first;
    first.push_back(onStream(0));
    first.push_back(gemm(rows({1}, -c), part({1}, -c)));
    first.push_back(event(HostNodeKind::RecordEvent, computed, {1}));
    first.push_back(onStream(1));
    first.push_back(event(HostNodeKind::WaitEvent, computed, {1}));
    first.push_back(comm(CommKind::SendRecv, part({1}, -c), part({1}, -2 * c, 1), &h));
    first.push_back(wait(h));
    first.push_back(event(HostNodeKind::RecordEvent, received, {1}));
    out.push_back(loop(c, std::move(first)));
    // Steps k = 1 .. n - 2 (loop variable k - 1): b = r - k - 1.
    if (n_ > 2) {
      std::vector<HostNode> mid;
      mid.push_back(onStream(0));
      mid.push_back(gemm(rows({-c, 1}, -2 * c), part({-c, 1}, -2 * c)));
      mid.push_back(event(HostNodeKind::WaitEvent, received, {c, 1}));
      mid.push_back(copy(part({-c, 1}, -2 * c, 1), part({-c, 1}, -2 * c), true));
      mid.push_back(event(HostNodeKind::RecordEvent, computed, {c, 1}, c));
      mid.push_back(onStream(1));
      mid.push_back(event(HostNodeKind::WaitEvent, computed, {c, 1}, c));
      mid.push_back(comm(CommKind::SendRecv, part({-c, 1}, -2 * c), part({-c, 1}, -3 * c, 1), &h));
      mid.push_back(wait(h));
      mid.push_back(event(HostNodeKind::RecordEvent, received, {c, 1}, c));
      out.push_back(loop(n_ - 2, {loop(c, std::move(mid))}));
    }
    // Step n - 1: b = r; the sum lands in this rank's result.
    std::vector<HostNode> last;
    last.push_back(onStream(0));
    last.push_back(gemm(rows({1}, 0), result_of_q));
    last.push_back(event(HostNodeKind::WaitEvent, received, {1}, (n_ - 2) * c));
    last.push_back(copy(part({1}, 0, 1), result_of_q, true));
    out.push_back(loop(c, std::move(last)));
    out.push_back(host::sync());
    out.push_back(deallocate(x_, 1, 1));  // (slot 0 is freed by insert-deallocations)
  }

  void reduceScatterRing(std::vector<HostNode>& out) {
    out.push_back(allocate(y_));
    reduceScatterRingInto(block(y_, s_ / n_, {1}, 0, 0, axis_), out);
  }

  // Ring allreduce = the ring reduce-scatter into this rank's block of the result, then a ring
  // allgather of the blocks (n - 1 forwarding steps, nothing left to compute).
  void allreduceRing(std::vector<HostNode>& out) {
    const int64_t c = s_ / n_, nc = n_ * c;
    out.push_back(allocate(y_));
    reduceScatterRingInto(block(y_, nc, {1}, c, 0, axis_, 0, c), out);
    int64_t h = 0;
    std::vector<HostNode> step;
    step.push_back(comm(CommKind::SendRecv, block(y_, nc, {-c, 1}, c, 0, axis_, 0, c),
                        block(y_, nc, {-c, 1}, c, -c, axis_, 0, c), &h));
    step.push_back(wait(h));
    out.push_back(loop(n_ - 1, {loop(c, std::move(step))}));
  }

  const Expr* set_;
  const Segment& gemm_seg_;
  int64_t gemm_index_, pool_;
  OverlapLoweringState& state_;
  const TensorView* x_ = nullptr;  // the set's input
  const TensorView* y_ = nullptr;  // the set's output
  int64_t axis_ = -1, n_ = 1, s_ = 1;
  Placement change_to_;
  bool ring_ = false, gathers_ = false;
};

}  // namespace

void lowerOverlappedPair(const Segment& comm_seg, const Segment& gemm_seg, int64_t gemm_index, int64_t stream_pool,
                         OverlapLoweringState& state, std::vector<HostNode>& out) {
  PairLowering(comm_seg, gemm_seg, gemm_index, stream_pool, state).lower(out);
}

}  // namespace meshfuse
