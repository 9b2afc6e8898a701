// The host-IR verifier (rules in host_ir_verifier.h): a symbolic run of the program, loops
// unrolled, that tracks which buffers are alive, which handles are in flight and which event
// instances were recorded -- the state the evaluator keeps, without data.
#include "lower/host_ir_verifier.h"

#include <map>
#include <set>

#include "meshfuse/error.h"
#include "meshfuse/ir/fusion.h"

namespace meshfuse {
namespace {

using Buffer = std::pair<const TensorView*, int64_t>;  // a tensor and its slot (ring temporaries)

// Every buffer the loop body (nested loops included) allocates.
std::set<Buffer> allocatedIn(const std::vector<HostNode>& body) {
  std::set<Buffer> out;
  forEachNode(body, [&](const HostNode& n) {
    if (n.kind == HostNodeKind::Allocate) out.insert({n.tv, n.slot});
  });
  return out;
}

class Checker {
 public:
  Checker(const HostProgram& p, const HostVerifyOptions& o) : p_(p), options_(o) {
    for (const TensorView* in : p.fusion->inputs()) alive_.insert({in, 0});
  }

  void run(const std::vector<HostNode>& nodes) {
    for (const HostNode& n : nodes) node(n);
  }

 private:
  struct Loop {
    int64_t i = 0;
    std::set<Buffer> body_allocates;      // what the body allocates
    std::set<Buffer> allocated_this_trip;  // what it has allocated so far in this iteration
  };

  [[noreturn]] void fail(const HostNode& n, const std::string& what) const {
    std::string where;
    for (size_t j = 0; j < loops_.size(); ++j)
      where += fmt::format("{}{} = {}", j == 0 ? " (in iteration " : ", ",
                           loops_.size() == 1 ? std::string("i") : fmt::format("i{}", j), loops_[j].i);
    throw InternalError(
        fmt::format("host IR verifier: `{}` {}{}", printHostNode(p_, n), what, where.empty() ? "" : where + ")"));
  }

  std::string name(const Buffer& b) const { return BlockRef::of(b.first, b.second).toString(*p_.fusion); }

  // Another rank's tensor, in a specialized program: its buffer is not this rank's to allocate.
  bool othersTensor(const TensorView* tv) const {
    return p_.rank >= 0 && tv->mesh() != nullptr && !tv->mesh()->contains(p_.rank);
  }

  void checkIndex(const HostNode& n, size_t coeffs, const std::string& what) const {
    if (coeffs > loops_.size())
      fail(n, fmt::format("indexes {} by {} loop variables inside {} loops", what, coeffs, loops_.size()));
  }

  void use(const HostNode& n, const BlockRef& ref) {
    checkIndex(n, ref.loop_coeffs.size(), ref.toString(*p_.fusion));
    const Buffer b{ref.tv, ref.slot};
    if (othersTensor(ref.tv)) return;
    for (const Loop& l : loops_)
      if (l.body_allocates.count(b) && !l.allocated_this_trip.count(b))
        fail(n, fmt::format("uses {} before the loop body allocates it: a value carried from one iteration to "
                            "the next needs a buffer allocated before the loop",
                            name(b)));
    if (alive_.count(b)) return;
    if (freed_.count(b)) fail(n, fmt::format("uses {} after its deallocate", name(b)));
    fail(n, fmt::format("uses {}, which is not allocated before it", name(b)));
  }

  void useAll(const HostNode& n) {
    if (n.segment >= 0) {
      const Segment& seg = p_.segment(n);
      if (!n.views.empty()) {
        for (const BlockRef& v : n.views) use(n, v);
        return;
      }
      for (const TensorView* tv : seg.inputs) use(n, BlockRef::of(tv));
      for (const TensorView* tv : seg.outputs) use(n, BlockRef::of(tv));
      return;
    }
    use(n, n.in);
    use(n, n.out);
  }

  int64_t iteration() const {  // the evaluator's key for handles: loops flattened
    int64_t it = 0;
    for (size_t j = 0; j < loops_.size(); ++j) it = it * trips_[j] + loops_[j].i;
    return it;
  }

  int64_t eventInstance(const HostNode& n) const {
    checkIndex(n, n.event_coeffs.size(), fmt::format("event e{}", n.event));
    int64_t index = n.event_offset;
    const size_t first = loops_.size() - n.event_coeffs.size();
    for (size_t j = 0; j < n.event_coeffs.size(); ++j) index += n.event_coeffs[j] * loops_[first + j].i;
    return index;
  }

  void allocate(const HostNode& n) {
    const Buffer b{n.tv, n.slot};
    alive_.insert(b);
    freed_.erase(b);
    for (Loop& l : loops_) l.allocated_this_trip.insert(b);
  }

  void deallocate(const HostNode& n) {
    const Buffer b{n.tv, n.slot};
    if (!alive_.count(b)) fail(n, fmt::format("deallocates {}, which is not allocated", name(b)));
    alive_.erase(b);
    freed_.insert(b);
  }

  void loop(const HostNode& n) {
    if (options_.streams_assigned && n.stream_pool > 0)
      fail(n, "is still marked for a stream pool: assign-streams must place its iterations before the program "
              "runs");
    if (n.trip_count < 1) fail(n, "has no iterations");
    loops_.push_back({0, allocatedIn(n.body), {}});
    trips_.push_back(n.trip_count);
    for (int64_t i = 0; i < n.trip_count; ++i) {
      loops_.back().i = i;
      loops_.back().allocated_this_trip.clear();
      run(n.body);
    }
    loops_.pop_back();
    trips_.pop_back();
  }

  void node(const HostNode& n) {
    switch (n.kind) {
      case HostNodeKind::Allocate: allocate(n); break;
      case HostNodeKind::Deallocate: deallocate(n); break;
      case HostNodeKind::LaunchKernel:
      case HostNodeKind::Gemm:
      case HostNodeKind::ShardSlice:
      case HostNodeKind::Copy: useAll(n); break;
      case HostNodeKind::Communication:
        useAll(n);
        ++handles_[{n.handle, iteration()}];
        break;
      case HostNodeKind::Wait: {
        auto it = handles_.find({n.handle, iteration()});
        if (it == handles_.end() || it->second == 0)
          fail(n, fmt::format("waits for h{}, which no communication issued before it in this iteration (or which "
                              "was waited for already)",
                              n.handle));
        --it->second;
        break;
      }
      case HostNodeKind::ForLoop: loop(n); break;
      case HostNodeKind::RecordEvent: recorded_.insert({n.event, eventInstance(n)}); break;
      case HostNodeKind::WaitEvent:
      case HostNodeKind::HostWaitEvent: {
        const int64_t instance = eventInstance(n);
        if (instance >= 0 && !recorded_.count({n.event, instance}))
          fail(n, fmt::format("waits for instance {} of event e{}, which is not recorded before it", instance,
                              n.event));
        break;
      }
      case HostNodeKind::SetCurrentStream:
      case HostNodeKind::Synchronize: break;
    }
  }

  const HostProgram& p_;
  HostVerifyOptions options_;
  std::set<Buffer> alive_, freed_;
  std::map<std::pair<int64_t, int64_t>, int64_t> handles_;  // (handle, iteration) -> issued, not waited
  std::set<std::pair<int64_t, int64_t>> recorded_;           // (event, instance)
  std::vector<Loop> loops_;
  std::vector<int64_t> trips_;
};

}  // namespace

void verifyHostIr(const HostProgram& program, const HostVerifyOptions& options) {
  Checker(program, options).run(program.nodes);
}

}  // namespace meshfuse
