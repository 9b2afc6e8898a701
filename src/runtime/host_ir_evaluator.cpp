// The host-IR interpreter (see host_ir_evaluator.h): the walk over the nodes, buffers, copies,
// events and kernel launches. Communications are issued in host_ir_communication.cpp.
#include "runtime/host_ir_evaluator.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <set>

#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/placement.h"
#include "meshfuse/trace.h"
#include "runtime/host_ir_issue.h"
#include "runtime/tensor_blocks.h"

namespace meshfuse {
namespace {

std::vector<int64_t> zeros(size_t n) { return std::vector<int64_t>(n, 0); }

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
  if (ref.heads) {  // a head group: consecutive (batch, head) pairs, seen as headGroupShape says
    std::vector<int64_t> pairs(t.shape().begin() + 1, t.shape().end());
    pairs[0] *= t.shape()[0];
    return t.reshaped(pairs).slice0(rows.begin, rows.size).reshaped(headGroupShape(t.shape(), ref.blocks));
  }
  MF_CHECK(rows.end() <= t.shape().at(0), "{} names rows [{}, {}) of a buffer of {} rows on rank {}",
           ref.toString(*program_.fusion), rows.begin, rows.end(), t.shape()[0], comm_.rank());
  return t.slice0(rows.begin, rows.size);
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

// A causal attention whose query rows (or, for the key's and value's gradients, key rows) are
// this rank's block of a longer sequence (the sequence split on some mesh axes, the other side
// whole: gathered or replicated) masks by the rows' global positions: the block's place in the
// sequence, from the operand's sharding.
std::optional<AttentionLaunch> HostIrEvaluator::causalQueryBlock(const Segment& seg) {
  const Expr* e = seg.exprs.back();
  if (e->info().category != OpCategory::Attention || !e->attr<bool>("is_causal")) return std::nullopt;
  constexpr int64_t kSeq = 2;
  AttentionLaunch launch;
  bool split = false;
  for (size_t i : {size_t{0}, size_t{1}}) {
    const auto* t = static_cast<const TensorView*>(e->input(i));
    if (t->mesh() == nullptr) continue;
    // torch.chunk's block of the sequence (uneven shards: its offset is not rank * size).
    const Span rows = localBlock(t, bindings_, comm_.rank()).at(kSeq);
    if (rows.size == t->evaluateShape(bindings_).at(kSeq)) continue;
    (i == 0 ? launch.query : launch.key).push_back({rows.begin, rows.size});
    split = true;
  }
  if (!split) return std::nullopt;
  return launch;
}

std::string HostIrEvaluator::describe(const hir::SegmentCall& n) const {
  const Segment& seg = program_.segment(n);
  std::string s = segmentKindName(seg.kind);
  for (const Expr* e : seg.exprs) s += " " + std::string(e->name());
  return s;
}

std::string HostIrEvaluator::describe(const hir::Communication& n) const {
  // Causal balance's half exchanges are named apart from a ring's rotation: timelines and the
  // overlap summary tell the rotation (hidden behind attention) from them (which nothing hides).
  return fmt::format("{} {}{}", commKindName(n.kind), program_.fusion->displayName(n.out.tv),
                     n.mirror ? kCausalBalanceMark : "");
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
  void operator()(const hir::RecordEvent& n) {
    e.events_[{n.event, e.eventInstance(n)}] = e.streams_.record(e.stream_);
  }
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
  submit(TaskKind::Communication, h->name.empty() ? "wait" : "wait for " + h->name, [this, h] {
    WaitContext context([this, ticket = h->ticket] { return describeWait(ticket); });
    if (h->work) h->work->wait();
    if (h->finish) h->finish();
    h->buffers.clear();
  });
}

void HostIrEvaluator::slice(const hir::ShardSlice& n) {
  Tensor in = view(n.in), out = view(n.out);
  std::vector<int64_t> off = zeros(out.shape().size());
  Backend* backend = &backend_;
  if (n.out_dim == hir::ShardSlice::kPartition) {
    // A pending sum of the whole value: the first device along the axis keeps it, the others
    // hold zeros (summed over the axis, exactly the value).
    const DeviceMesh& mesh = *n.out.tv->mesh();
    Tensor src = mesh.indexAlong(comm_.rank(), n.mesh_axis) == 0 ? in : backend_.upload(Tensor(out.dtype(), out.shape()));
    submit(TaskKind::Copy, "partition", [backend, src, out]() mutable { backend->copy(out, src); });
    return;
  }
  // The slice adds the innermost split of its dim (resharding_steps.h): this rank's
  // torch.chunk block of what the input holds.
  const DeviceMesh& mesh = *n.out.tv->mesh();
  const Span block =
      chunkSpan(in.shape().at(n.out_dim), mesh.size(n.mesh_axis), mesh.indexAlong(comm_.rank(), n.mesh_axis));
  MF_CHECK(block.size == out.shape()[n.out_dim], "slice of {}: rank {}'s block of {} has {} rows, its buffer {}",
           program_.fusion->displayName(n.out.tv), comm_.rank(), in.shape()[n.out_dim], block.size,
           out.shape()[n.out_dim]);
  off[n.out_dim] = block.begin;
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
  // (The vectors move into the task, and shape_of captures one reference, which std::function
  // holds without allocating: this runs once per launch.)
  submit(TaskKind::Compute, taskName(n),
         [backend, &seg, ins = std::move(ins), outs = std::move(outs), inner = std::move(inner), step]() mutable {
           std::vector<const Tensor*> in_ptrs;
           std::vector<Tensor*> out_ptrs;
           in_ptrs.reserve(ins.size());
           out_ptrs.reserve(outs.size());
           for (const Tensor& t : ins) in_ptrs.push_back(&t);
           for (Tensor& t : outs) out_ptrs.push_back(&t);
           struct Shapes {
             const Segment& seg;
             const std::vector<Tensor>& ins;
             const std::vector<Tensor>& outs;
             const std::vector<std::pair<const TensorView*, std::vector<int64_t>>>& inner;
           } shapes{seg, ins, outs, inner};
           ShapeFn shape_of = [&s = shapes](const TensorView* tv) -> std::vector<int64_t> {
             for (size_t i = 0; i < s.seg.inputs.size(); ++i)
               if (s.seg.inputs[i] == tv) return s.ins[i].shape();
             for (size_t i = 0; i < s.seg.outputs.size(); ++i)
               if (s.seg.outputs[i] == tv) return s.outs[i].shape();
             for (const auto& [t, shape] : s.inner)
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

void HostIrEvaluator::poison(IssueGate& gate) { gate.poison(); }

}  // namespace meshfuse
