// assign-streams: places a specialized program's work on streams (the one pass that does, apart
// from ring loops, whose stream and event pattern is their algorithm: lower_overlap.h).
//
// 1. Stream pools. A loop whose iterations are independent (ForLoop::stream_pool = k: chunks of
//    a collective-based overlap, stream chunks of a GEMM) runs iteration i on stream 1 + i % k,
//    after the main stream's state at the loop's start (an event recorded before it); the main
//    stream joins the pool after the loop (sync). The host issues iteration i only once
//    iteration i - k is done (host_wait): the buffers of at most k iterations are alive.
//
//      before: for i in [0, 4) on 2 streams { BODY }
//      after:  record e0[0] ; for i in [0, 4) { host_wait e1[i - 2] ; stream 1 + i % 2 ;
//              wait_event e0[0] ; BODY ; record e1[i] } ; stream 0 ; sync
//
// 2. FSDP prefetch. With fully sharded parameters every GEMM's weight is all-gathered just
//    before the GEMM. Each such gather (its buffer allocation, the collective and its wait) moves
//    onto stream 1 and is issued just before the previous gathered parameter's first use, so that
//    gather k + 1 runs while layer k computes; the main stream waits for gather k + 1's event
//    just before its first use. At most two gathered parameters are alive at once: the one in use
//    and the one being prefetched (insert-deallocations frees each after its last use).
//
//      before: allocate %w1g ; comm h1 allgather %w1 -> %w1g ; wait h1 ; gemm %y1 = linear(%x1, %w1g)
//      after:  allocate %w1g ; stream 1 ; comm h1 ... ; wait h1 ; record e1[0] ; stream 0 ;
//              wait_event e0[0] ; gemm %y0 = linear(%x0, %w0g) ; ... ; wait_event e1[0] ;
//              gemm %y1 = linear(%x1, %w1g)
//
// 3. Pipeline stage boundaries (GPipe forward). In a rank's microbatch loop, a stage-boundary
//    receive is posted for every microbatch before the loop (into a buffer of all microbatches)
//    and waited for on stream 1, so microbatch i + 1 arrives while microbatch i computes; a send
//    runs on stream 2 after the compute of its microbatch, so it travels while the next one
//    computes. The main stream waits only for the receive it needs; the loop ends with a join.
//    Every microbatch loop (pipeline or not) keeps at most 2 microbatches in flight (host_wait
//    for the iteration 2 before: one computing, the previous one being sent).
//
//      before: for i in [0, 4) { allocate %0 (one block of 4) ; comm h0 send_recv %a -> %0 from
//              rank 0 ; wait h0 ; gemm (%0, %w) -> (%b) ; comm h1 send_recv %b -> %1 to rank 2 ;
//              wait h1 ; deallocate %0 }
//      after:  allocate %0 ; stream 1 ; for i in [0, 4) { comm h0 send_recv %a -> %0[i of 4] from
//              rank 0 } ; for i in [0, 4) { wait h0 ; record e0[i] } ; stream 0 ;
//              for i in [0, 4) { host_wait e2[i - 2] ; wait_event e0[i] ; gemm (%0[i of 4], %w) ->
//              (%b) ; record e1[i] ; stream 2 ; wait_event e1[i] ; comm h1 send_recv %b -> %1 to
//              rank 2 ; wait h1 ; record e2[i] ; stream 0 } ; sync
//
// requires: specialize-for-rank; runs before insert-deallocations.
// guarantees: every value is still produced before it is read (events order the streams); no
//   ForLoop is left with stream_pool set.
#include "lower/assign_streams.h"

#include <algorithm>

#include "lower/host_builder.h"

#include "meshfuse/ir/fusion.h"

namespace meshfuse {
namespace {

// Whether `n` all-gathers a parameter (a fusion input a GEMM reads as its weight).
const hir::Communication* gathersParameter(const Fusion& f, const HostNode& node) {
  const auto* n = node.as<hir::Communication>();
  if (n == nullptr || n->kind != CommKind::Allgather || !n->in.whole() || !n->out.whole()) return nullptr;
  if (!f.isInput(n->in.tv)) return nullptr;
  for (const Expr* use : n->out.tv->uses())
    if (use->info().category == OpCategory::Gemm && use->input(size_t{1}) == n->out.tv) return n;
  return nullptr;
}

bool readsTensor(const HostProgram& p, const HostNode& node, const TensorView* tv) {
  return node.visit([&](const auto& n) {
    using T = std::decay_t<decltype(n)>;
    if constexpr (std::is_base_of_v<hir::SegmentCall, T>) {
      const Segment& seg = p.segment(n);
      return std::find(seg.inputs.begin(), seg.inputs.end(), tv) != seg.inputs.end();
    } else if constexpr (std::is_same_v<T, hir::Communication> || std::is_same_v<T, hir::ShardSlice> ||
                         std::is_same_v<T, hir::Copy>) {
      return n.in.tv == tv;
    } else {
      return false;
    }
  });
}

size_t firstReader(const HostProgram& p, const std::vector<HostNode>& nodes, const TensorView* tv, size_t from) {
  for (size_t i = from; i < nodes.size(); ++i)
    if (readsTensor(p, nodes[i], tv)) return i;
  return nodes.size();
}

// The host waits for iteration i - k's `done` event before it issues iteration i: at most k
// iterations are in flight, so at most k iterations' buffers are alive (peakMemoryBytes).
HostNode hostWait(int64_t done, int64_t k) { return host::event(HostNodeKind::HostWaitEvent, done, {1}, -k); }

// 1. (see the top): the loops of independent iterations on their stream pools.
void placeStreamPools(std::vector<HostNode>& nodes, int64_t& events) {
  std::vector<HostNode> out;
  for (HostNode& node : nodes) {
    auto* n = node.as<hir::ForLoop>();
    if (n == nullptr || n->stream_pool == 0) {
      out.push_back(std::move(node));
      continue;
    }
    const int64_t start = events++, done = events++;
    n->body.insert(n->body.begin(), {hostWait(done, n->stream_pool), host::onStream(1, n->stream_pool),
                                     host::event(HostNodeKind::WaitEvent, start)});
    n->body.push_back(host::event(HostNodeKind::RecordEvent, done, {1}));
    n->stream_pool = 0;
    out.push_back(host::event(HostNodeKind::RecordEvent, start));
    out.push_back(std::move(node));
    out.push_back(host::onStream(0));
    out.push_back(host::sync());
  }
  nodes = std::move(out);
}

// 2. (see the top): parameter gathers on stream 1, one ahead.
void prefetchParameters(HostProgram& p, int64_t& events) {
  const Fusion& f = *p.fusion;
  std::vector<HostNode>& nodes = p.nodes;
  int64_t previous_event = -1;  // the event of the last gathered parameter
  for (size_t c = 0; c < nodes.size(); ++c) {
    const hir::Communication* gather = gathersParameter(f, nodes[c]);
    if (gather == nullptr) continue;
    // The group: allocate (just before), comm, wait (just after).
    const TensorView* gathered = gather->out.tv;
    const hir::Allocate* alloc = c > 0 ? nodes[c - 1].as<hir::Allocate>() : nullptr;
    const hir::Wait* wait = c + 1 < nodes.size() ? nodes[c + 1].as<hir::Wait>() : nullptr;
    if (alloc == nullptr || alloc->tv != gathered || wait == nullptr || wait->handle != gather->handle) continue;
    std::vector<HostNode> group(nodes.begin() + static_cast<std::ptrdiff_t>(c - 1),
                                nodes.begin() + static_cast<std::ptrdiff_t>(c + 2));
    nodes.erase(nodes.begin() + static_cast<std::ptrdiff_t>(c - 1), nodes.begin() + static_cast<std::ptrdiff_t>(c + 2));
    const int64_t event = events++;
    std::vector<HostNode> issued = {
        group[0], host::onStream(1), group[1], group[2], host::event(HostNodeKind::RecordEvent, event), host::onStream(0)};
    // Issue it just before the main stream waits for the previous gathered parameter (one ahead),
    // so that it runs while the previous layer computes; the first one stays where it was.
    size_t at = c - 1;
    for (size_t i = 0; previous_event >= 0 && i < at; ++i)
      if (const auto* w = nodes[i].as<hir::WaitEvent>(); w != nullptr && w->event == previous_event) at = i;
    nodes.insert(nodes.begin() + static_cast<std::ptrdiff_t>(at), issued.begin(), issued.end());
    size_t use = firstReader(p, nodes, gathered, at + issued.size());
    nodes.insert(nodes.begin() + static_cast<std::ptrdiff_t>(use), host::event(HostNodeKind::WaitEvent, event));
    c = use;  // continue after the first use
    previous_event = event;
  }
}

// ---- 3. pipeline stage boundaries ------------------------------------------------------------

const hir::Communication* stageBoundary(const HostNode& node) {
  const auto* n = node.as<hir::Communication>();
  return n != nullptr && n->kind == CommKind::SendRecv && n->shift == 0 && n->mesh_axis < 0 ? n : nullptr;
}
const hir::Communication* receivesOnly(const HostNode& n) {
  const hir::Communication* s = stageBoundary(n);
  return s != nullptr && s->recv_from >= 0 && s->send_to < 0 ? s : nullptr;
}
const hir::Communication* sendsOnly(const HostNode& n) {
  const hir::Communication* s = stageBoundary(n);
  return s != nullptr && s->send_to >= 0 && s->recv_from < 0 ? s : nullptr;
}

// Makes every whole reference to `tv` in `nodes` a reference to block `i of blocks`.
void viewAsBlocks(std::vector<HostNode>& nodes, const TensorView* tv, int64_t blocks) {
  auto fix = [&](BlockRef& b) {
    if (b.tv != tv || !b.whole()) return;
    b.blocks = blocks;
    b.loop_coeffs = {1};
  };
  forEachNode(nodes, [&](HostNode& node) {
    node.visit([&](auto& n) {
      using T = std::decay_t<decltype(n)>;
      if constexpr (std::is_base_of_v<hir::SegmentCall, T>) {
        for (BlockRef& v : n.views) fix(v);
      } else if constexpr (std::is_same_v<T, hir::Communication> || std::is_same_v<T, hir::ShardSlice> ||
                           std::is_same_v<T, hir::Copy>) {
        fix(n.in);
        fix(n.out);
      }
    });
  });
}

// Rewrites one microbatch loop; `before` receives the nodes that go ahead of it, `after` those
// that follow it.
void pipelineLoop(hir::ForLoop& loop, int64_t& events, std::vector<HostNode>& before, std::vector<HostNode>& after) {
  const int64_t m = loop.trip_count;
  std::vector<HostNode> posts, waits, body;
  bool sends = false;
  auto waitOf = [&](size_t j, int64_t handle) {
    const hir::Wait* w = j + 1 < loop.body.size() ? loop.body[j + 1].as<hir::Wait>() : nullptr;
    MF_CHECK(w != nullptr && w->handle == handle, "a stage boundary's wait must follow it");
    return loop.body[j + 1];
  };
  std::vector<const TensorView*> received;
  size_t last_send = 0;  // where body[] has the last send's wait, + 1
  for (size_t j = 0; j < loop.body.size(); ++j) {
    HostNode& n = loop.body[j];
    if (const hir::Communication* recv = receivesOnly(n)) {
      const int64_t arrived = events++;
      posts.push_back(n);
      waits.push_back(waitOf(j, recv->handle));
      waits.push_back(host::event(HostNodeKind::RecordEvent, arrived, {1}));
      body.push_back(host::event(HostNodeKind::WaitEvent, arrived, {1}));
      received.push_back(recv->out.tv);
      ++j;  // (its wait went with it)
    } else if (const hir::Communication* send = sendsOnly(n)) {
      const int64_t computed = events++;
      body.push_back(host::event(HostNodeKind::RecordEvent, computed, {1}));
      body.push_back(host::onStream(2));
      body.push_back(host::event(HostNodeKind::WaitEvent, computed, {1}));
      body.push_back(n);
      body.push_back(waitOf(j, send->handle));
      last_send = body.size();
      body.push_back(host::onStream(0));
      sends = true;
      ++j;
    } else {
      body.push_back(std::move(n));
    }
  }
  // At most 2 microbatches in flight: one computing, the one before it being sent. `done`: an
  // iteration's last work is done (its sends, else its compute).
  const int64_t done = events++;
  if (sends) {
    body.insert(body.begin() + static_cast<std::ptrdiff_t>(last_send), host::event(HostNodeKind::RecordEvent, done, {1}));
  } else {
    body.push_back(host::event(HostNodeKind::RecordEvent, done, {1}));
  }
  body.insert(body.begin(), hostWait(done, 2));
  // A received tensor becomes a buffer of every microbatch, allocated before the loop.
  for (const TensorView* tv : received) {
    std::erase_if(body, [&](const HostNode& n) {
      const auto* a = n.as<hir::Allocate>();
      const auto* d = n.as<hir::Deallocate>();
      return (a != nullptr && a->tv == tv) || (d != nullptr && d->tv == tv);
    });
    viewAsBlocks(body, tv, m);
    viewAsBlocks(posts, tv, m);
    before.push_back(host::allocate(tv));
  }
  if (!posts.empty()) {
    before.push_back(host::onStream(1));
    before.push_back(host::loop(m, std::move(posts)));  // every receive posted up front
    before.push_back(host::loop(m, std::move(waits)));  // and waited for in order, beside the compute
    before.push_back(host::onStream(0));
  }
  loop.body = std::move(body);
  if (received.empty() && !sends) return;
  after.push_back(host::sync());
}

// Microbatch loops: the loops, not on a stream pool, whose iterations allocate buffers (ring
// loops allocate theirs before the loop).
void placeMicrobatchLoops(std::vector<HostNode>& nodes, int64_t& events) {
  std::vector<HostNode> out;
  for (HostNode& node : nodes) {
    auto* n = node.as<hir::ForLoop>();
    if (n == nullptr || n->stream_pool > 0 ||
        std::none_of(n->body.begin(), n->body.end(), [](const HostNode& b) { return b.is<hir::Allocate>(); })) {
      out.push_back(std::move(node));
      continue;
    }
    std::vector<HostNode> before, after;
    pipelineLoop(*n, events, before, after);
    out.insert(out.end(), before.begin(), before.end());
    out.push_back(std::move(node));
    out.insert(out.end(), after.begin(), after.end());
  }
  nodes = std::move(out);
}

}  // namespace

void assignStreams(HostProgram& p) {
  int64_t events = 0;  // the next free event id
  forEachNode(p.nodes, [&](const HostNode& node) {
    node.visit([&](const auto& n) {
      if constexpr (std::is_base_of_v<hir::EventNode, std::decay_t<decltype(n)>>) events = std::max(events, n.event + 1);
    });
  });
  placeMicrobatchLoops(p.nodes, events);  // (first: it tells pool loops by their stream_pool)
  placeStreamPools(p.nodes, events);
  prefetchParameters(p, events);
}

}  // namespace meshfuse
