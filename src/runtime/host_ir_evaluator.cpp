// The host-IR interpreter (see host_ir_evaluator.h).
#include "runtime/host_ir_evaluator.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <set>

#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/placement.h"
#include "lower/check_collectives.h"
#include "runtime/communicator_checks.h"
#include "runtime/tensor_blocks.h"

namespace meshfuse {
namespace {

std::vector<int64_t> zeros(size_t n) { return std::vector<int64_t>(n, 0); }

// Whether blocks along dim `d` of a row-major tensor of `shape` are contiguous.
bool contiguousBlocks(const std::vector<int64_t>& shape, int64_t d) {
  for (int64_t i = 0; i < d; ++i)
    if (shape[i] != 1) return false;
  return true;
}

std::string currentExceptionMessage() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

bool hasCommunication(const std::vector<HostNode>& nodes) {
  bool found = false;
  forEachNode(nodes, [&](const HostNode& n) { found |= n.is<hir::Communication>(); });
  return found;
}

}  // namespace

std::vector<Team> communicationTeams(const HostProgram& program, const Team& program_ranks) {
  std::set<Team> teams;
  forEachNode(program.nodes, [&](const HostNode& node) {
    const auto* c = node.as<hir::Communication>();
    if (c == nullptr) return;
    const hir::Communication& n = *c;
    if (n.kind != CommKind::SendRecv) {
      if (n.team.size() > 1) teams.insert(n.team);
      return;
    }
    // Point-to-point exchanges travel on the program's team (Communicator::sendRecv).
    const bool exchanges = (n.send_to >= 0 && n.send_to != program.rank) ||
                           (n.recv_from >= 0 && n.recv_from != program.rank);
    if (exchanges && program_ranks.size() > 1) teams.insert(program_ranks);
  });
  return {teams.begin(), teams.end()};  // std::set: sorted, the order Communicator::prepareTeams asks for
}

// Collectives on one communicator must be issued in the same order on every rank. Tasks on
// different streams run in any order, so each communication takes a ticket in program order
// when it is interpreted, and its task issues only when every earlier ticket has issued. A task
// that failed poisons the gate, so that later tickets fail instead of waiting forever.
class HostIrEvaluator::IssueGate {
 public:
  int64_t take() { return next_ticket_++; }
  void issue(int64_t ticket, const std::function<void()>& start) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return issued_ == ticket || poisoned_; });
    MF_USER_CHECK(!poisoned_, ErrorKind::Runtime, "a communication was abandoned after an earlier task failed");
    try {
      start();
    } catch (...) {
      poisoned_ = true;
      cv_.notify_all();
      throw;
    }
    ++issued_;
    cv_.notify_all();
  }
  void poison() {
    std::lock_guard<std::mutex> lk(mu_);
    poisoned_ = true;
    cv_.notify_all();
  }
  void reset() {
    std::lock_guard<std::mutex> lk(mu_);
    next_ticket_ = issued_ = 0;
    poisoned_ = false;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t next_ticket_ = 0, issued_ = 0;
  bool poisoned_ = false;
};

// A communication in flight: filled by the task that issues it, finished by the Wait's task.
struct HostIrEvaluator::Handle {
  int64_t ticket = -1;  // its position in this rank's issue order (the plan's issue_index)
  std::unique_ptr<Work> work;
  std::function<void()> finish;             // unpacks staging buffers (all-to-all)
  std::vector<Tensor> buffers;              // kept alive until the operation completed
};

HostIrEvaluator::HostIrEvaluator(const HostProgram& program, Backend& backend, Communicator& comm)
    : program_(program),
      backend_(backend),
      comm_(comm),
      streams_(backend.streams()),
      gate_(std::make_shared<IssueGate>()) {
  MF_CHECK(program.rank == comm.rank(), "program for rank {} run on rank {}", program.rank, comm.rank());
  communicates_ = hasCommunication(program.nodes);
  std::set<int64_t> ranks;
  for (int64_t m = 0; m < program.fusion->numMeshes(); ++m)
    for (int64_t d : program.fusion->mesh(m).devices()) ranks.insert(d);
  if (ranks.count(comm.rank())) program_ranks_.assign(ranks.begin(), ranks.end());
  teams_ = communicationTeams(program, program_ranks_);
}

HostIrEvaluator::~HostIrEvaluator() = default;

void HostIrEvaluator::setTracing(bool on) { tracing_ = on; }

std::vector<TraceEvent> HostIrEvaluator::takeTrace() { return std::move(trace_); }

Tensor& HostIrEvaluator::value(const TensorView* tv, int64_t slot) {
  auto it = values_.find({tv, slot});
  MF_CHECK(it != values_.end(), "{} has no buffer on rank {}", BlockRef::of(tv, slot).toString(*program_.fusion),
           comm_.rank());
  return it->second;
}

int64_t HostIrEvaluator::eventInstance(const hir::EventNode& n) const {
  MF_CHECK(n.coeffs.size() <= loops_.size(), "an event index over {} loops inside {} loops", n.coeffs.size(),
           loops_.size());
  int64_t index = n.offset;
  const size_t first = loops_.size() - n.coeffs.size();
  for (size_t j = 0; j < n.coeffs.size(); ++j) index += n.coeffs[j] * loops_[first + j].i;
  return index;
}

int64_t HostIrEvaluator::iteration() const {
  int64_t it = 0;
  for (const Loop& l : loops_) it = it * l.trips + l.i;
  return it;
}

std::vector<int64_t> HostIrEvaluator::loopValues() const {
  std::vector<int64_t> out;
  for (const Loop& l : loops_) out.push_back(l.i);
  return out;
}

Tensor HostIrEvaluator::view(const BlockRef& ref) {
  Tensor& t = value(ref.tv, ref.slot);
  if (ref.whole()) return t;
  Span rows = sizes_->rows(ref, comm_.rank(), loopValues());
  MF_CHECK(rows.end() <= t.shape().at(0), "{} names rows [{}, {}) of a buffer of {} rows on rank {}",
           ref.toString(*program_.fusion), rows.begin, rows.end(), t.shape()[0], comm_.rank());
  return t.slice0(rows.begin, rows.size);
}

Counts HostIrEvaluator::memberCounts(const hir::Communication& n, const BlockRef& ref) const {
  return memberElements(*sizes_, n, ref, loopValues());
}

HostIrEvaluator::DimBlock HostIrEvaluator::blockAlong(const BlockRef& ref, int64_t dim) {
  DimBlock b{value(ref.tv, ref.slot), {}, {}};
  b.sizes = b.whole.shape();
  b.offsets.assign(b.sizes.size(), 0);
  MF_CHECK(dim >= 0 && dim < static_cast<int64_t>(b.sizes.size()), "blocks along dim {} of {}", dim,
           ref.toString(*program_.fusion));
  MF_USER_CHECK(b.sizes[dim] % ref.blocks == 0, ErrorKind::Unsupported,
                "uneven blocks not supported: {} has {} rows along dim {} on rank {}, which do not split into {} "
                "equal blocks",
                program_.fusion->displayName(ref.tv), b.sizes[dim], dim, comm_.rank(), ref.blocks);
  b.sizes[dim] /= ref.blocks;
  b.offsets[dim] = (ref.whole() ? 0 : BufferSizes::blockIndex(ref, comm_.rank(), loopValues())) * b.sizes[dim];
  return b;
}

// The global positions of a ring attention step's rows: each BlockRef is a block of its tensor's
// global sequence (dim 2 of attention's [batch, heads, seq, e] operands).
AttentionLaunch HostIrEvaluator::attentionLaunch(const hir::SegmentCall& n) const {
  AttentionLaunch launch;
  launch.accumulate = n.accumulate;
  auto rows = [&](const std::vector<BlockRef>& blocks, std::vector<AttentionLaunch::Rows>& out) {
    for (const BlockRef& b : blocks) {
      const int64_t len = b.tv->evaluateShape(bindings_).at(2) / b.blocks;
      out.push_back({(b.whole() ? 0 : BufferSizes::blockIndex(b, comm_.rank(), loopValues())) * len, len});
    }
  };
  rows(n.query_blocks, launch.query);
  rows(n.key_blocks, launch.key);
  return launch;
}

// A causal attention whose query rows are this rank's block of a longer sequence (the sequence
// split on some mesh axes, the keys whole: gathered or replicated) masks by the rows' global
// positions: the block's place in the sequence, from the query's sharding.
std::optional<AttentionLaunch> HostIrEvaluator::causalQueryBlock(const Segment& seg) {
  const Expr* e = seg.exprs.back();
  if (e->info().category != OpCategory::Attention || !e->attr<bool>("is_causal")) return std::nullopt;
  const auto* q = static_cast<const TensorView*>(e->input(size_t{0}));
  constexpr int64_t kSeq = 2;
  if (q->mesh() == nullptr) return std::nullopt;
  // torch.chunk's block of the sequence (uneven shards: its offset is not rank * size).
  const Span rows = localBlock(q, bindings_, comm_.rank()).at(kSeq);
  if (rows.size == q->evaluateShape(bindings_).at(kSeq)) return std::nullopt;
  AttentionLaunch launch;
  launch.query.push_back({rows.begin, rows.size});
  return launch;
}

std::string HostIrEvaluator::describe(const hir::SegmentCall& n) const {
  const Segment& seg = program_.segment(n);
  std::string s = segmentKindName(seg.kind);
  for (const Expr* e : seg.exprs) s += " " + std::string(e->name());
  return s;
}

std::string HostIrEvaluator::describe(const hir::Communication& n) const {
  return fmt::format("{} {}", commKindName(n.kind), program_.fusion->displayName(n.out.tv));
}

// The report of a communication node: its names and provenance are the same on every run.
CollectiveInfo HostIrEvaluator::collectiveInfo(const hir::Communication& n, CommKind kind, const Team& team,
                                               int64_t bytes) {
  auto it = info_.find(&n);
  if (it == info_.end()) {
    const Fusion& f = *program_.fusion;
    it = info_
             .emplace(
                 &n,
                 CollectiveInfo{
                     kind, n.mesh_axis, {}, 0, f.displayName(n.out.tv), f.displayName(n.in.tv), communicationReason(n)})
             .first;
  }
  CollectiveInfo c = it->second;
  c.team = team;
  c.bytes = bytes;
  return c;
}

std::vector<Tensor> HostIrEvaluator::run(const std::vector<Tensor>& local_inputs,
                                         const std::vector<std::vector<int64_t>>& global_shapes) {
  const Fusion& f = *program_.fusion;
  SymbolBindings bindings = bindLocalInputs(f, local_inputs, comm_.rank(), global_shapes);
  if (!sizes_ || bindings != bindings_) {  // local shapes depend on the sizes only
    bindings_ = std::move(bindings);
    sizes_ = std::make_unique<BufferSizes>(program_, bindings_);
  }
  values_.clear();
  handles_.clear();
  events_.clear();
  executed_.clear();
  loops_.clear();
  stream_ = 0;
  gate_->reset();
  static std::atomic<int64_t> runs{0};  // runs of this process: every rank runs the same sequence
  run_serial_ = ++runs;
  for (size_t i = 0; i < local_inputs.size(); ++i)
    values_[{f.inputs()[i], 0}] = local_inputs[i].defined() && local_inputs[i].device() != backend_.device()
                                      ? backend_.upload(local_inputs[i])
                                      : local_inputs[i];
  // Every team's per-team state (NCCL communicators) exists before the first communication, made
  // in the one order all ranks use (communicator.h: prepareTeams).
  std::vector<Team> teams = teams_;
  if (tracing_ && program_ranks_.size() > 1 && !std::binary_search(teams.begin(), teams.end(), program_ranks_)) {
    teams.insert(std::upper_bound(teams.begin(), teams.end(), program_ranks_), program_ranks_);
  }
  if (!teams.empty()) comm_.prepareTeams(teams);
  // A traced run starts with a barrier of the program's ranks: every rank's timeline then has
  // (nearly) the same origin, so a merged multi-rank trace lines up. It is an allreduce of one
  // element in the backend's memory: the communicator runs the programs on the backend's buffers
  // (NCCL takes device memory only).
  if (tracing_ && program_ranks_.size() > 1) {
    Tensor one = Tensor::empty(DataType::Int64, {1});
    one.set(0, 1);
    Tensor token = backend_.upload(one);
    comm_.allreduce(token.data(), token.data(), 1, DataType::Int64, ReduceOp::Sum, program_ranks_)->wait();
  }
  streams_.setTracing(tracing_);
  try {
    execute(program_.nodes);
    streams_.synchronize();
  } catch (...) {
    // The other ranks may be waiting in a collective this rank will not join: end the job now
    // with this rank's message (not after this rank's own in-flight work, which may itself wait
    // for them) rather than leave them hanging until the watchdog fires.
    if (abort_on_failure_ && communicates_ && comm_.size() > 1) comm_.abort(currentExceptionMessage());
    try {
      streams_.synchronize();  // let in-flight tasks finish before the buffers go away
    } catch (...) {
    }
    throw;
  }
  if (tracing_) trace_ = streams_.takeTrace();
  // An in-place update of an input the evaluator uploaded (a host tensor, a device backend) went
  // to the device copy: the caller's buffer gets the new values back (one copy per run).
  for (const auto& [o, i] : f.outputAliases()) {
    if (!local_inputs[i].defined() || local_inputs[i].device() == backend_.device()) continue;
    Tensor updated = backend_.download(value(f.outputs()[o])), caller = local_inputs[i];
    std::memcpy(caller.data(), updated.data(), updated.nbytes());
  }
  std::vector<Tensor> outs;
  for (const TensorView* o : f.outputs())
    outs.push_back(o->mesh() && !o->mesh()->contains(comm_.rank()) ? Tensor() : value(o));
  values_.clear();  // the caller owns the outputs now; intermediates go
  return outs;
}

// One operator() per node kind: a kind execute() does not handle fails to compile.
struct HostIrEvaluator::Executor {
  HostIrEvaluator& e;
  void operator()(const hir::Allocate& n) { e.allocate(n); }
  void operator()(const hir::Deallocate& n) {
    e.values_.erase({n.tv, n.slot});  // tasks already submitted keep the memory alive until they ran
  }
  void operator()(const hir::LaunchKernel& n) { e.launch(n); }
  void operator()(const hir::Gemm& n) { e.launch(n); }
  void operator()(const hir::Communication& n) {
    if (n.kind == CommKind::SendRecv) {
      e.sendRecv(n);
    } else {
      e.communicate(n);
    }
  }
  void operator()(const hir::Wait& n) { e.wait(n); }
  void operator()(const hir::ShardSlice& n) { e.slice(n); }
  void operator()(const hir::Copy& n) { e.copy(n); }
  void operator()(const hir::ForLoop& n) { e.loop(n); }
  void operator()(const hir::SetCurrentStream& n) {
    e.stream_ = n.stream + (n.stream_pool > 0 && !e.loops_.empty() ? e.loops_.back().i % n.stream_pool : 0);
  }
  void operator()(const hir::RecordEvent& n) { e.events_[{n.event, e.eventInstance(n)}] = e.streams_.record(e.stream_); }
  void operator()(const hir::WaitEvent& n) { e.waitEvent(n, /*host=*/false); }
  void operator()(const hir::HostWaitEvent& n) { e.waitEvent(n, /*host=*/true); }
  void operator()(const hir::Synchronize&) {
    for (const auto& [key, event] : e.events_) e.streams_.wait(0, event);
  }
};

void HostIrEvaluator::execute(const std::vector<HostNode>& nodes) {
  for (const HostNode& n : nodes) n.visit(Executor{*this});
}

void HostIrEvaluator::allocate(const hir::Allocate& n) {
  std::vector<int64_t> shape = sizes_->bufferShape(n.tv, n.slot, comm_.rank(), loopValues());
  // An output that updates an input in place (Fusion::aliasOutputToInput) is that input's
  // buffer: lower/check_aliases.h guarantees the program may write it there.
  if (const TensorView* in = program_.fusion->aliasedInput(n.tv); in && n.slot == 0 && n.chunk_blocks == 1) {
    values_[{n.tv, 0}] = value(in);
    return;
  }
  try {
    values_[{n.tv, n.slot}] = backend_.allocate(n.tv->dtype(), shape);
  } catch (const UserError& e) {  // e.g. out of memory: say which tensor
    throw UserError(e.kind(), fmt::format("{}: {}", program_.fusion->displayName(n.tv), e.message()));
  }
}

void HostIrEvaluator::wait(const hir::Wait& n) {
  auto key = std::make_pair(n.handle, iteration());
  auto it = handles_.find(key);
  MF_CHECK(it != handles_.end(), "wait on unknown handle h{}", n.handle);
  std::shared_ptr<Handle> h = it->second;
  handles_.erase(it);
  submit(TaskKind::Communication, "wait", [this, h] {
    WaitContext context([this, ticket = h->ticket] { return describeWait(ticket); });
    if (h->work) h->work->wait();
    if (h->finish) h->finish();
    h->buffers.clear();
  });
}

void HostIrEvaluator::slice(const hir::ShardSlice& n) {
  Tensor in = view(n.in), out = view(n.out);
  std::vector<int64_t> off = zeros(out.shape().size());
  // The slice adds the innermost split of its dim (resharding_steps.h): this rank's
  // torch.chunk block of what the input holds.
  const DeviceMesh& mesh = *n.out.tv->mesh();
  const Span block =
      chunkSpan(in.shape().at(n.out_dim), mesh.size(n.mesh_axis), mesh.indexAlong(comm_.rank(), n.mesh_axis));
  MF_CHECK(block.size == out.shape()[n.out_dim], "slice of {}: rank {}'s block of {} has {} rows, its buffer {}",
           program_.fusion->displayName(n.out.tv), comm_.rank(), in.shape()[n.out_dim], block.size,
           out.shape()[n.out_dim]);
  off[n.out_dim] = block.begin;
  Backend* backend = &backend_;
  submit(TaskKind::Copy, "slice",
         [backend, in, out, off]() mutable { backend->copyBlock(in, off, out, zeros(off.size()), out.shape()); });
}

void HostIrEvaluator::copy(const hir::Copy& n) {
  Backend* backend = &backend_;
  if (n.along_dim >= 0) {  // blocks along another dim than 0: a strided block copy
    DimBlock in = blockAlong(n.in, n.along_dim), out = blockAlong(n.out, n.along_dim);
    MF_CHECK(!n.accumulate && in.sizes == out.sizes, "a block copy of {} into {}", n.in.toString(*program_.fusion),
             n.out.toString(*program_.fusion));
    submit(TaskKind::Copy, "copy", [backend, in, out]() mutable {
      backend->copyBlock(in.whole, in.offsets, out.whole, out.offsets, in.sizes);
    });
    return;
  }
  Tensor in = view(n.in), out = view(n.out);
  bool add = n.accumulate;
  submit(add ? TaskKind::Compute : TaskKind::Copy, add ? "add" : "copy", [=]() mutable {
    if (add) {
      backend->accumulate(out, in);
    } else {
      backend->copy(out, in);
    }
  });
}

void HostIrEvaluator::loop(const hir::ForLoop& n) {
  loops_.push_back({0, n.trip_count});
  for (int64_t i = 0; i < n.trip_count; ++i) {
    loops_.back().i = i;
    execute(n.body);
  }
  loops_.pop_back();
}

void HostIrEvaluator::waitEvent(const hir::EventNode& n, bool host) {
  int64_t instance = eventInstance(n);
  if (instance < 0) return;  // before the first instance: nothing to wait for
  auto it = events_.find({n.event, instance});
  MF_CHECK(it != events_.end(), "{}wait for instance {} of event e{}, which was never recorded", host ? "host " : "",
           instance, n.event);
  if (host) {
    it->second->wait();  // blocks this (the host) thread; the streams go on
  } else {
    streams_.wait(stream_, it->second);
  }
}

void HostIrEvaluator::launch(const hir::SegmentCall& n) {
  const Segment& seg = program_.segment(n);
  const size_t ni = seg.inputs.size();
  std::vector<Tensor> ins, outs;
  ins.reserve(ni);
  outs.reserve(seg.outputs.size());
  for (size_t i = 0; i < ni; ++i) ins.push_back(n.views.empty() ? value(seg.inputs[i]) : view(n.views[i]));
  for (size_t i = 0; i < seg.outputs.size(); ++i)
    outs.push_back(n.views.empty() ? value(seg.outputs[i]) : view(n.views[ni + i]));
  // Shapes of this launch: the tensors it touches have the shapes of their views; a chunked
  // launch's intermediates are chunked along dim 0 like the operands they derive from. (Most
  // segments have none: their shapes are found among the operands.)
  std::vector<std::pair<const TensorView*, std::vector<int64_t>>> inner;
  const bool chunked = std::any_of(n.views.begin(), n.views.end(), [](const BlockRef& v) { return !v.whole(); });
  for (const Expr* e : seg.exprs) {
    const TensorView* o = e->output();
    if (std::find(seg.outputs.begin(), seg.outputs.end(), o) != seg.outputs.end()) continue;
    std::vector<int64_t> s = sizes_->localShape(o, comm_.rank());
    if (chunked && !s.empty()) s[0] = outs.at(0).shape().at(0);  // the rows of the block it computes
    inner.emplace_back(o, std::move(s));
  }
  Backend* backend = &backend_;
  // A ring attention step carries the positions of its rows and whether it merges (else none).
  std::optional<AttentionLaunch> step;
  if (n.accumulate || !n.query_blocks.empty()) step = attentionLaunch(n);
  if (!step) step = causalQueryBlock(seg);
  submit(TaskKind::Compute, taskName(n), [backend, &seg, ins, outs, inner, step]() mutable {
    std::vector<const Tensor*> in_ptrs;
    std::vector<Tensor*> out_ptrs;
    for (const Tensor& t : ins) in_ptrs.push_back(&t);
    for (Tensor& t : outs) out_ptrs.push_back(&t);
    ShapeFn shape_of = [&](const TensorView* tv) -> std::vector<int64_t> {
      for (size_t i = 0; i < seg.inputs.size(); ++i)
        if (seg.inputs[i] == tv) return ins[i].shape();
      for (size_t i = 0; i < seg.outputs.size(); ++i)
        if (seg.outputs[i] == tv) return outs[i].shape();
      for (const auto& [t, shape] : inner)
        if (t == tv) return shape;
      MF_CHECK(false, "{} is not a tensor of this segment", tv->fusion()->displayName(tv));
    };
    if (step) {
      backend->runAttentionStep(seg, in_ptrs, out_ptrs, shape_of, *step);
    } else {
      backend->runSegment(seg, in_ptrs, out_ptrs, shape_of);
    }
  });
}

namespace {

// Whether `rank` holds a buffer of `tv`: a gather's or reduce's output, and a broadcast's or
// scatter's input, live on the root alone.
bool holds(const TensorView* tv, int64_t rank) { return tv->mesh() == nullptr || tv->mesh()->contains(rank); }

}  // namespace

void HostIrEvaluator::communicate(const hir::Communication& n) {
  const int64_t me = comm_.rank();
  // Where this rank holds no buffer, an empty tensor: the Communicator reads or writes only the
  // root's (its null data pointer is what MPI and NCCL ignore on the other ranks).
  Tensor in = holds(n.in.tv, me) ? view(n.in) : Tensor(), out = holds(n.out.tv, me) ? view(n.out) : Tensor();
  const DataType dt = n.in.tv->dtype();
  auto h = std::make_shared<Handle>();
  h->buffers = {in, out};
  handles_[{n.handle, iteration()}] = h;
  CollectiveInfo info = collectiveInfo(n, n.kind, n.team, in.defined() ? static_cast<int64_t>(in.nbytes()) : 0);
  info.root = n.root;
  info.padded_bytes = paddedBytes(*sizes_, n, loopValues());
  executed_.push_back(std::move(info));
  Communicator* comm = &comm_;
  std::function<void()> issue;
  // Blocks of different sizes (uneven shards) go by counts per member: each member's count is
  // its view's, as BufferSizes computes it for every rank alike.
  auto packed = [&](const Counts& counts, const Tensor& t, const char* what) {
    MF_CHECK(totalCount(counts) == t.numel(), "{} {}: the members' blocks [{}] do not fill its {} elements", what,
             program_.fusion->displayName(n.out.tv), fmt::join(counts, ", "), t.numel());
  };
  switch (n.kind) {
    case CommKind::Allreduce:
      issue = [=]() mutable {
        h->work = comm->allreduce(in.data(), out.data(), in.numel(), dt, n.reduce_op, n.team);
      };
      break;
    case CommKind::Allgather: {
      // layout-for-communication made the gathered dim outermost: rank j's block is the j-th
      // contiguous block of the output.
      MF_CHECK(contiguousBlocks(out.shape(), n.in_dim), "allgather along non-outermost dim {}", n.in_dim);
      Counts counts = memberCounts(n, n.in);
      packed(counts, out, "allgather");
      issue = [=]() mutable { h->work = comm->allgatherv(in.data(), out.data(), counts, dt, n.team); };
      break;
    }
    case CommKind::ReduceScatter: {
      MF_CHECK(contiguousBlocks(in.shape(), n.out_dim), "reduce-scatter along non-outermost dim {}", n.out_dim);
      Counts counts = memberCounts(n, n.out);
      packed(counts, in, "reduce-scatter");
      issue = [=]() mutable {
        h->work = comm->reduceScatterv(in.data(), out.data(), counts, dt, n.reduce_op, n.team);
      };
      break;
    }
    case CommKind::AllToAll: issue = allToAll(n, h, in, out); break;
    case CommKind::Broadcast: {
      // The root's output is the buffer it sends from (the root is in the team: its output
      // lives there too); every other member receives into its output.
      MF_CHECK(out.defined() && (n.root != me || in.defined()), "broadcast {}: rank {} lacks a buffer",
               program_.fusion->displayName(n.out.tv), me);
      Backend* backend = &backend_;
      issue = [=]() mutable {
        if (n.root == me) backend->copy(out, in);
        h->work = comm->broadcast(out.data(), out.numel(), dt, n.root, n.team);
      };
      break;
    }
    case CommKind::Scatter: {
      // layout-for-communication made the scattered dim outermost: member j receives the root's
      // j-th contiguous block.
      MF_CHECK(!in.defined() || contiguousBlocks(in.shape(), n.out_dim), "scatter along non-outermost dim {}",
               n.out_dim);
      Counts counts = memberCounts(n, n.out);
      if (in.defined()) packed(counts, in, "scatter");
      issue = [=]() mutable { h->work = comm->scatterv(in.data(), out.data(), counts, dt, n.root, n.team); };
      break;
    }
    case CommKind::Gather: {
      MF_CHECK(!out.defined() || contiguousBlocks(out.shape(), n.in_dim), "gather along non-outermost dim {}",
               n.in_dim);
      Counts counts = memberCounts(n, n.in);
      if (out.defined()) packed(counts, out, "gather");
      issue = [=]() mutable { h->work = comm->gatherv(in.data(), out.data(), counts, dt, n.root, n.team); };
      break;
    }
    case CommKind::Reduce:
      issue = [=]() mutable {
        h->work = comm->reduce(in.data(), out.data(), in.numel(), dt, n.reduce_op, n.root, n.team);
      };
      break;
    case CommKind::SendRecv: MF_CHECK(false, "send/recv is not a collective (sendRecv() runs it)");
  }
  h->ticket = submitCommunication(taskName(n), std::move(issue));
}

// Shard(in_dim) -> Shard(out_dim) along the team: member j gets this rank's block j along
// out_dim, and sends back its block along in_dim. The blocks run along different dims, so the
// runtime packs them into staging buffers, block j after block j - 1; with uneven shards each
// block has its own size (all_to_allv).
std::function<void()> HostIrEvaluator::allToAll(const hir::Communication& n, const std::shared_ptr<Handle>& h, const Tensor& in,
                                                const Tensor& out) {
  const int64_t team = static_cast<int64_t>(n.team.size());
  const int64_t out_dim = n.out_dim, in_dim = n.in_dim;
  const DataType dt = n.in.tv->dtype();
  // Block j of what this rank sends (its torch.chunk block j of out_dim), and of what it
  // receives (member j's rows of in_dim, at this rank's block of out_dim).
  std::vector<std::vector<int64_t>> send_shape(team, in.shape()), recv_shape(team, out.shape());
  std::vector<int64_t> send_at(team), recv_at(team);
  Counts send_counts(team), recv_counts(team);
  for (int64_t j = 0; j < team; ++j) {
    const Span s = chunkSpan(in.shape()[out_dim], team, j), r = chunkSpan(out.shape()[in_dim], team, j);
    send_shape[j][out_dim] = s.size;
    send_at[j] = s.begin;
    recv_shape[j][in_dim] = r.size;
    recv_at[j] = r.begin;
    send_counts[j] = numel(send_shape[j]);
    recv_counts[j] = numel(recv_shape[j]);
  }
  Backend* backend = &backend_;
  Communicator* comm = &comm_;
  Tensor src = in, dst = out;  // (the views share the buffers)
  return [=] {
    auto send = std::make_shared<Tensor>(backend->allocate(dt, {totalCount(send_counts)}));
    auto recv = std::make_shared<Tensor>(backend->allocate(dt, {totalCount(recv_counts)}));
    const std::vector<int64_t> send_off = displacements(send_counts), recv_off = displacements(recv_counts);
    for (int64_t j = 0; j < team; ++j) {
      Tensor packed = send->slice0(send_off[j], send_counts[j]).reshaped(send_shape[j]);
      std::vector<int64_t> from(src.shape().size(), 0);
      from[out_dim] = send_at[j];
      backend->copyBlock(src, from, packed, std::vector<int64_t>(from.size(), 0), send_shape[j]);
    }
    h->work = comm->allToAllv(send->data(), send_counts, recv->data(), recv_counts, dt, n.team);
    h->finish = [backend, send, recv, recv_shape, recv_at, recv_counts, recv_off, in_dim, team, dst]() mutable {
      for (int64_t j = 0; j < team; ++j) {
        Tensor block = recv->slice0(recv_off[j], recv_counts[j]).reshaped(recv_shape[j]);
        std::vector<int64_t> to(dst.shape().size(), 0);
        to[in_dim] = recv_at[j];
        backend->copyBlock(block, std::vector<int64_t>(to.size(), 0), dst, to, recv_shape[j]);
      }
    };
  };
}

int64_t HostIrEvaluator::submitCommunication(const std::string& name, std::function<void()> issue) {
  std::shared_ptr<IssueGate> gate = gate_;
  int64_t ticket = gate->take();
  Communicator* comm = &comm_;
  streams_.submit(stream_, TaskKind::Communication, name, [gate, ticket, comm, run = run_serial_, issue = std::move(issue)] {
    gate->issue(ticket, issue);
    comm->publishProgress(run, ticket + 1);
  });
  return ticket;
}

// The watchdog's report of a wait that timed out (WaitContext): the plan's view of where this
// rank is and which peers have not issued their part, from the progress board.
std::string HostIrEvaluator::describeWait(int64_t ticket) const {
  if (plan_ == nullptr || ticket < 0) return "";
  std::map<int64_t, int64_t> issued;  // the plan's convention: -1 unknown, -2 an earlier run
  for (const auto& [peer, progress] : comm_.peerProgress()) {
    auto [run, count] = progress;
    issued[peer] = run == run_serial_ ? count : run > run_serial_ ? INT64_MAX : -2;
  }
  return fmt::format("rank {} is {}", comm_.rank(), plan_->describeWait(comm_.rank(), ticket, issued));
}

// Submits work that, when it fails, makes waiting communications fail too (no hang).
void HostIrEvaluator::submit(TaskKind kind, const std::string& name, std::function<void()> task) {
  std::shared_ptr<IssueGate> gate = gate_;
  streams_.submit(stream_, kind, name, [gate, task = std::move(task)] {
    try {
      task();
    } catch (...) {
      gate->poison();
      throw;
    }
  });
}

void HostIrEvaluator::sendRecv(const hir::Communication& n) {
  auto h = std::make_shared<Handle>();
  handles_[{n.handle, iteration()}] = h;
  const int64_t to = n.send_to, from = n.recv_from;  // resolved by specialize-for-rank (ring steps too)
  Backend* backend = &backend_;
  const DataType dt = (to >= 0 ? n.in.tv : n.out.tv)->dtype();
  Tensor in, out;
  std::function<void()> pack;
  if (n.in_dim < 0) {
    in = to >= 0 ? view(n.in) : Tensor();
    out = from >= 0 ? view(n.out) : Tensor();
  } else {
    // Blocks along another dim than 0 are not contiguous: they travel through staging buffers,
    // packed when the exchange is issued and unpacked when it completes.
    if (to >= 0) {
      DimBlock src = blockAlong(n.in, n.in_dim);
      in = backend->allocate(dt, src.sizes);
      pack = [backend, src, in]() mutable {
        backend->copyBlock(src.whole, src.offsets, in, std::vector<int64_t>(src.sizes.size(), 0), src.sizes);
      };
    }
    if (from >= 0) {
      DimBlock dst = blockAlong(n.out, n.in_dim);
      out = backend->allocate(dt, dst.sizes);
      h->finish = [backend, dst, out]() mutable {
        backend->copyBlock(out, std::vector<int64_t>(dst.sizes.size(), 0), dst.whole, dst.offsets, dst.sizes);
      };
    }
  }
  h->buffers = {in, out};
  // Reported once per rank, as the pair (sender, receiver): what a rank sends, or on the receiving
  // side of a stage boundary what it receives (collectives() reports the same).
  if (to >= 0) {
    executed_.push_back(collectiveInfo(n, CommKind::SendRecv, {comm_.rank(), to}, static_cast<int64_t>(in.nbytes())));
  } else if (from >= 0) {
    executed_.push_back(
        collectiveInfo(n, CommKind::SendRecv, {from, comm_.rank()}, static_cast<int64_t>(out.nbytes())));
  }
  // Tags tell a pipeline's successive microbatches (and ring steps) apart.
  const int64_t tag = n.handle * 1024 + iteration() % 1024;
  Communicator* comm = &comm_;
  const int64_t me = comm_.rank();
  const Team team = program_ranks_;
  h->ticket = submitCommunication(taskName(n), [=]() mutable {
    if (pack) pack();
    if (to == me && from == me) {  // both sides on this rank (stages on one device, a mirror's middle): a copy
      backend->copy(out, in);
      return;
    }
    if (to < 0 && from < 0) return;
    // One operation: a ring's receive from the left and send to the right must not be issued as
    // two calls a transport may run one after the other (NCCL on one stream: every rank would
    // wait in its receive).
    h->work = comm->sendRecv(to >= 0 ? in.data() : nullptr, to >= 0 ? in.numel() : 0, to,
                             from >= 0 ? out.data() : nullptr, from >= 0 ? out.numel() : 0, from, dt, tag, team);
  });
}

}  // namespace meshfuse
