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
    if (const auto* a = n.as<hir::Allocate>()) out.insert({a->tv, a->slot});
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

  void useAll(const HostNode& n, const hir::SegmentCall& call) {
    if (!call.views.empty()) {
      for (const BlockRef& v : call.views) use(n, v);
      return;
    }
    const Segment& seg = p_.segment(call);
    for (const TensorView* tv : seg.inputs) use(n, BlockRef::of(tv));
    for (const TensorView* tv : seg.outputs) use(n, BlockRef::of(tv));
  }

  void useBoth(const HostNode& n, const BlockRef& in, const BlockRef& out) {
    use(n, in);
    use(n, out);
  }

  int64_t iteration() const {  // the evaluator's key for handles: loops flattened
    int64_t it = 0;
    for (size_t j = 0; j < loops_.size(); ++j) it = it * trips_[j] + loops_[j].i;
    return it;
  }

  int64_t eventInstance(const HostNode& n, const hir::EventNode& e) const {
    checkIndex(n, e.coeffs.size(), fmt::format("event e{}", e.event));
    int64_t index = e.offset;
    const size_t first = loops_.size() - e.coeffs.size();
    for (size_t j = 0; j < e.coeffs.size(); ++j) index += e.coeffs[j] * loops_[first + j].i;
    return index;
  }

  void allocate(const hir::Allocate& a) {
    const Buffer b{a.tv, a.slot};
    alive_.insert(b);
    freed_.erase(b);
    for (Loop& l : loops_) l.allocated_this_trip.insert(b);
  }

  void deallocate(const HostNode& n, const hir::Deallocate& d) {
    const Buffer b{d.tv, d.slot};
    if (!alive_.count(b)) fail(n, fmt::format("deallocates {}, which is not allocated", name(b)));
    alive_.erase(b);
    freed_.insert(b);
  }

  void loop(const HostNode& n, const hir::ForLoop& l) {
    if (options_.streams_assigned && l.stream_pool > 0)
      fail(n, "is still marked for a stream pool: assign-streams must place its iterations before the program "
              "runs");
    if (l.trip_count < 1) fail(n, "has no iterations");
    loops_.push_back({0, allocatedIn(l.body), {}});
    trips_.push_back(l.trip_count);
    for (int64_t i = 0; i < l.trip_count; ++i) {
      loops_.back().i = i;
      loops_.back().allocated_this_trip.clear();
      run(l.body);
    }
    loops_.pop_back();
    trips_.pop_back();
  }

  void wait(const HostNode& n, int64_t handle) {
    auto it = handles_.find({handle, iteration()});
    if (it == handles_.end() || it->second == 0)
      fail(n, fmt::format("waits for h{}, which no communication issued before it in this iteration (or which "
                          "was waited for already)",
                          handle));
    --it->second;
  }

  void waitEvent(const HostNode& n, const hir::EventNode& e) {
    const int64_t instance = eventInstance(n, e);
    if (instance >= 0 && !recorded_.count({e.event, instance}))
      fail(n, fmt::format("waits for instance {} of event e{}, which is not recorded before it", instance, e.event));
  }

  void node(const HostNode& n) {
    n.visit(Overloaded{
        [&](const hir::Allocate& a) { allocate(a); },
        [&](const hir::Deallocate& d) { deallocate(n, d); },
        [&](const hir::LaunchKernel& k) { useAll(n, k); },
        [&](const hir::Gemm& g) { useAll(n, g); },
        [&](const hir::ShardSlice& c) { useBoth(n, c.in, c.out); },
        [&](const hir::Copy& c) { useBoth(n, c.in, c.out); },
        [&](const hir::Communication& c) {
          useBoth(n, c.in, c.out);
          ++handles_[{c.handle, iteration()}];
        },
        [&](const hir::Wait& w) { wait(n, w.handle); },
        [&](const hir::ForLoop& l) { loop(n, l); },
        [&](const hir::RecordEvent& e) { recorded_.insert({e.event, eventInstance(n, e)}); },
        [&](const hir::WaitEvent& e) { waitEvent(n, e); },
        [&](const hir::HostWaitEvent& e) { waitEvent(n, e); },
        [&](const hir::SetCurrentStream&) {},
        [&](const hir::Synchronize&) {},
    });
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
