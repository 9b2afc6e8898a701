// The communications of HostIrEvaluator (host_ir_evaluator.h): collectives and point-to-point
// exchanges issued as stream tasks in program order (the IssueGate's tickets), and what the
// watchdog reports of a wait. Apart from the interpreter's walk, which only dispatches to them.
#include <climits>
#include <set>

#include "lower/check_collectives.h"
#include "meshfuse/ir/fusion.h"
#include "runtime/communicator_checks.h"
#include "runtime/host_ir_evaluator.h"
#include "runtime/host_ir_issue.h"
#include "runtime/tensor_blocks.h"

namespace meshfuse {
namespace {

// Whether blocks along dim `d` of a row-major tensor of `shape` are contiguous.
bool contiguousBlocks(const std::vector<int64_t>& shape, int64_t d) {
  for (int64_t i = 0; i < d; ++i)
    if (shape[i] != 1) return false;
  return true;
}

// Whether `rank` holds a buffer of `tv`: a gather's or reduce's output, and a broadcast's or
// scatter's input, live on the root alone.
bool holds(const TensorView* tv, int64_t rank) { return tv->mesh() == nullptr || tv->mesh()->contains(rank); }

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

Counts HostIrEvaluator::memberCounts(const hir::Communication& n, const BlockRef& ref) const {
  return memberElements(*sizes_, n, ref, loopValues());
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
void HostIrEvaluator::communicate(const hir::Communication& n) {
  const int64_t me = comm_.rank();
  // Where this rank holds no buffer, an empty tensor: the Communicator reads or writes only the
  // root's (its null data pointer is what MPI and NCCL ignore on the other ranks).
  Tensor in = holds(n.in.tv, me) ? view(n.in) : Tensor(), out = holds(n.out.tv, me) ? view(n.out) : Tensor();
  auto h = std::make_shared<Handle>();
  h->buffers = {in, out};
  handles_[{n.handle, iteration()}] = h;
  CollectiveInfo info = collectiveInfo(n, n.kind, n.team, in.defined() ? static_cast<int64_t>(in.nbytes()) : 0);
  info.root = n.root;
  info.padded_bytes = paddedBytes(*sizes_, n, loopValues());
  executed_.push_back(std::move(info));
  h->name = taskName(n);
  h->ticket = submitCommunication(h->name, issueCollective(n, h, in, out));
}

std::function<void()> HostIrEvaluator::issueCollective(const hir::Communication& n, const std::shared_ptr<Handle>& h,
                                                       Tensor in, Tensor out) {
  const int64_t me = comm_.rank();
  const DataType dt = n.in.tv->dtype();
  Communicator* comm = &comm_;
  switch (n.kind) {
    case CommKind::Allreduce:
      return [=]() mutable { h->work = comm->allreduce(in.data(), out.data(), in.numel(), dt, n.reduce_op, n.team); };
    case CommKind::Allgather:
    case CommKind::ReduceScatter:
    case CommKind::Scatter:
    case CommKind::Gather: return issueByCounts(n, h, in, out);
    case CommKind::AllToAll: return allToAll(n, h, in, out);
    case CommKind::Broadcast: {
      // The root's output is the buffer it sends from (the root is in the team: its output
      // lives there too); every other member receives into its output.
      MF_CHECK(out.defined() && (n.root != me || in.defined()), "broadcast {}: rank {} lacks a buffer",
               program_.fusion->displayName(n.out.tv), me);
      Backend* backend = &backend_;
      return [=]() mutable {
        if (n.root == me) backend->copy(out, in);
        h->work = comm->broadcast(out.data(), out.numel(), dt, n.root, n.team);
      };
    }
    case CommKind::Reduce:
      return
          [=]() mutable { h->work = comm->reduce(in.data(), out.data(), in.numel(), dt, n.reduce_op, n.root, n.team); };
    case CommKind::SendRecv: MF_CHECK(false, "send/recv is not a collective (sendRecv() runs it)");
  }
  return {};
}

std::function<void()> HostIrEvaluator::issueByCounts(const hir::Communication& n, const std::shared_ptr<Handle>& h,
                                                     Tensor in, Tensor out) {
  const DataType dt = n.in.tv->dtype();
  Communicator* comm = &comm_;
  // Blocks of different sizes (uneven shards) go by counts per member: each member's count is
  // its view's, as BufferSizes computes it for every rank alike.
  auto packed = [&](const Counts& counts, const Tensor& t, const char* what) {
    MF_CHECK(totalCount(counts) == t.numel(), "{} {}: the members' blocks [{}] do not fill its {} elements", what,
             program_.fusion->displayName(n.out.tv), fmt::join(counts, ", "), t.numel());
  };
  switch (n.kind) {
    case CommKind::Allgather: {
      // layout-for-communication made the gathered dim outermost: rank j's block is the j-th
      // contiguous block of the output.
      MF_CHECK(contiguousBlocks(out.shape(), n.in_dim), "allgather along non-outermost dim {}", n.in_dim);
      Counts counts = memberCounts(n, n.in);
      packed(counts, out, "allgather");
      return [=]() mutable { h->work = comm->allgatherv(in.data(), out.data(), counts, dt, n.team); };
    }
    case CommKind::ReduceScatter: {
      MF_CHECK(contiguousBlocks(in.shape(), n.out_dim), "reduce-scatter along non-outermost dim {}", n.out_dim);
      Counts counts = memberCounts(n, n.out);
      packed(counts, in, "reduce-scatter");
      return [=]() mutable { h->work = comm->reduceScatterv(in.data(), out.data(), counts, dt, n.reduce_op, n.team); };
    }
    case CommKind::Scatter: {
      // layout-for-communication made the scattered dim outermost: member j receives the root's
      // j-th contiguous block.
      MF_CHECK(!in.defined() || contiguousBlocks(in.shape(), n.out_dim), "scatter along non-outermost dim {}",
               n.out_dim);
      Counts counts = memberCounts(n, n.out);
      if (in.defined()) packed(counts, in, "scatter");
      return [=]() mutable { h->work = comm->scatterv(in.data(), out.data(), counts, dt, n.root, n.team); };
    }
    case CommKind::Gather: {
      MF_CHECK(!out.defined() || contiguousBlocks(out.shape(), n.in_dim), "gather along non-outermost dim {}",
               n.in_dim);
      Counts counts = memberCounts(n, n.in);
      if (out.defined()) packed(counts, out, "gather");
      return [=]() mutable { h->work = comm->gatherv(in.data(), out.data(), counts, dt, n.root, n.team); };
    }
    default: MF_CHECK(false, "{} does not go by counts per member", commKindName(n.kind));
  }
  return {};
}

// Shard(in_dim) -> Shard(out_dim) along the team: member j gets this rank's block j along
// out_dim, and sends back its block along in_dim. The blocks run along different dims, so the
// runtime packs them into staging buffers, block j after block j - 1; with uneven shards each
// block has its own size (all_to_allv).
std::function<void()> HostIrEvaluator::allToAll(const hir::Communication& n, const std::shared_ptr<Handle>& h,
                                                const Tensor& in, const Tensor& out) {
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
  streams_.submit(stream_, TaskKind::Communication, name,
                  [gate, ticket, comm, run = run_serial_, issue = std::move(issue)] {
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
  h->name = taskName(n);
  h->ticket = submitCommunication(h->name, [=]() mutable {
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
