// check-collectives (see check_collectives.h for the contract).
#include "lower/check_collectives.h"

#include <algorithm>
#include <set>
#include <tuple>

#include "meshfuse/error.h"
#include "meshfuse/ir/fusion.h"

namespace meshfuse {
namespace {

// A step of one rank's program, as far as communication goes.
struct Step {
  bool wait = false;
  int64_t op = -1;  // the communication issued, or waited for (index in the rank's issue order)
  std::string where;
};

struct RankWalk {
  const HostProgram& program;
  BufferSizes sizes;
  std::vector<PlannedCommunication> ops;
  std::vector<Step> steps;
  std::map<std::pair<int64_t, int64_t>, int64_t> handles;  // (handle, iteration) -> op
  std::vector<std::pair<int64_t, int64_t>> loops;          // (i, trips), outermost first
};

[[noreturn]] void fail(const std::vector<const HostProgram*>& involved, const std::string& what) {
  std::string dump;
  for (const HostProgram* p : involved) dump += "\n" + p->toString();
  throw InternalError("check-collectives: the ranks' host programs do not match: " + what +
                      "\nThe programs involved:" + dump);
}

int64_t iterationOf(const RankWalk& w) {  // as HostIrEvaluator::iteration() numbers them
  int64_t it = 0;
  for (auto [i, trips] : w.loops) it = it * trips + i;
  return it;
}

std::string whereOf(const RankWalk& w, const HostNode& n) {
  std::string s = "`" + printHostNode(w.program, n) + "`";
  if (!w.loops.empty()) {
    std::vector<int64_t> is;
    for (auto [i, trips] : w.loops) is.push_back(i);
    s += fmt::format(" (iteration {})", fmt::join(is, ", "));
  }
  return s;
}

std::vector<int64_t> loopValues(const RankWalk& w) {
  std::vector<int64_t> out;
  for (auto [i, trips] : w.loops) out.push_back(i);
  return out;
}

int64_t elementsOf(const RankWalk& w, const BlockRef& ref) {
  return w.sizes.elements(ref, w.program.rank, loopValues(w));
}

// What a collective's members must agree on: the counts they pass to the communicator, per
// member in team order (uneven shards: blocks of different sizes). An all-to-all's are what each
// member sends each other member (row i: member i's), found from its blocks along the dim it
// scatters; the others' from the block each member contributes (allgather, gather: its input;
// reduce-scatter, scatter: its output; the rest: the buffer, the same on every member).
std::vector<int64_t> collectiveCounts(const RankWalk& w, const hir::Communication& n) {
  const std::vector<int64_t> loops = loopValues(w);
  switch (n.kind) {
    case CommKind::Allgather:
    case CommKind::Gather: return memberElements(w.sizes, n, n.in, loops);
    case CommKind::ReduceScatter:
    case CommKind::Scatter: return memberElements(w.sizes, n, n.out, loops);
    case CommKind::AllToAll: {
      std::vector<int64_t> matrix;
      const int64_t t = static_cast<int64_t>(n.team.size());
      for (int64_t sender : n.team) {
        std::vector<int64_t> shape = w.sizes.shape(n.in, sender, loops);
        const int64_t whole = shape.at(n.out_dim);
        for (int64_t j = 0; j < t; ++j) {
          shape[n.out_dim] = chunkSpan(whole, t, j).size;
          matrix.push_back(numel(shape));
        }
      }
      return matrix;
    }
    case CommKind::Broadcast: return {elementsOf(w, n.out)};
    default: return {elementsOf(w, n.in)};
  }
}

void walk(RankWalk& w, const std::vector<HostNode>& nodes) {
  for (const HostNode& node : nodes) {
    if (const auto* l = node.as<hir::ForLoop>()) {
      w.loops.push_back({0, l->trip_count});
      for (int64_t i = 0; i < l->trip_count; ++i) {
        w.loops.back().first = i;
        walk(w, l->body);
      }
      w.loops.pop_back();
      continue;
    }
    if (const auto* wait = node.as<hir::Wait>()) {
      auto it = w.handles.find({wait->handle, iterationOf(w)});
      if (it == w.handles.end())
        fail({&w.program}, fmt::format("rank {}'s {} waits for handle h{}, which it has not issued", w.program.rank,
                                       whereOf(w, node), wait->handle));
      w.steps.push_back({true, it->second, whereOf(w, node)});
      w.handles.erase(it);
      continue;
    }
    const auto* comm = node.as<hir::Communication>();
    if (comm == nullptr) continue;
    const hir::Communication& n = *comm;
    const int64_t me = w.program.rank;
    PlannedCommunication c;
    c.rank = me;
    c.node = &n;
    c.where = whereOf(w, node);
    c.issue_index = static_cast<int64_t>(w.ops.size());
    if (n.kind == CommKind::SendRecv) {
      c.tag = n.handle * 1024 + iterationOf(w) % 1024;  // as HostIrEvaluator::sendRecv tags it
      if (!(n.send_to == me && n.recv_from == me)) {     // both stages on this rank: a local copy
        c.send_to = n.send_to;
        c.recv_from = n.recv_from;
        if (n.send_to >= 0) c.send_elements = elementsOf(w, n.in);
        if (n.recv_from >= 0) c.recv_elements = elementsOf(w, n.out);
      }
    } else {
      c.team = n.team;
      c.counts = collectiveCounts(w, n);
    }
    w.handles[{n.handle, iterationOf(w)}] = c.issue_index;
    w.steps.push_back({false, c.issue_index, c.where});
    w.ops.push_back(std::move(c));
  }
}

std::string collectiveSummary(const PlannedCommunication& c) {
  const hir::Communication& n = *c.node;
  const bool one = c.counts.size() == 1;
  std::string s = fmt::format("{} of {}{}{} {}", commKindName(n.kind), one ? "" : "[", fmt::join(c.counts, ", "),
                              one ? "" : "]", dtypeName(n.in.tv->dtype()));
  if (n.kind == CommKind::Allreduce || n.kind == CommKind::ReduceScatter || n.kind == CommKind::Reduce)
    s += n.reduce_op == ReduceOp::Max ? ", max" : ", sum";
  if (n.root >= 0) s += fmt::format(", root {}", n.root);
  return s;
}

using Key = std::pair<int64_t, int64_t>;  // (rank, issue index)

// Rule 1: per team, members issue the same collectives in the same order.
void matchCollectives(std::map<int64_t, RankWalk>& walks, std::map<Key, std::vector<Key>>& needs) {
  std::map<Team, std::map<int64_t, std::vector<int64_t>>> sequences;  // team -> rank -> ops
  for (const auto& [rank, w] : walks)
    for (const PlannedCommunication& c : w.ops)
      if (c.node->kind != CommKind::SendRecv) sequences[c.team][rank].push_back(c.issue_index);
  for (const auto& [team, per_rank] : sequences) {
    const std::string t = fmt::format("team [{}]", fmt::join(team, ", "));
    for (int64_t member : team)
      if (!walks.count(member))
        fail({}, fmt::format("{} names rank {}, which has no program", t, member));
    const int64_t first = team.front();
    const auto& a_ops = per_rank.count(first) ? per_rank.at(first) : std::vector<int64_t>{};
    const RankWalk& a = walks.at(first);
    for (int64_t member : team) {
      const RankWalk& b = walks.at(member);
      const auto& b_ops = per_rank.count(member) ? per_rank.at(member) : std::vector<int64_t>{};
      for (size_t k = 0; k < std::max(a_ops.size(), b_ops.size()); ++k) {
        if (k >= a_ops.size() || k >= b_ops.size()) {
          const bool a_short = k >= a_ops.size();
          const PlannedCommunication& extra = (a_short ? b : a).ops[(a_short ? b_ops : a_ops)[k]];
          fail({&a.program, &b.program},
               fmt::format("{}: rank {} issues {} collectives but rank {} issues {}: rank {}'s collective #{} {} ({}) "
                           "has no counterpart on rank {}",
                           t, first, a_ops.size(), member, b_ops.size(), extra.rank, k, extra.where,
                           collectiveSummary(extra), a_short ? first : member));
        }
        const PlannedCommunication& x = a.ops[a_ops[k]];
        const PlannedCommunication& y = b.ops[b_ops[k]];
        auto sig = [](const PlannedCommunication& c) {
          const hir::Communication& n = *c.node;
          return std::make_tuple(n.kind, c.counts, n.in.tv->dtype(), n.reduce_op, n.root);
        };
        if (sig(x) != sig(y))
          fail({&a.program, &b.program},
               fmt::format("{}: collective #{} differs: rank {} issues {} ({}) but rank {} issues {} ({})", t, k,
                           first, x.where, collectiveSummary(x), member, y.where, collectiveSummary(y)));
      }
    }
    // Positions, and what each collective needs: every member's collective at the same position.
    for (const auto& [rank, ops] : per_rank)
      for (size_t k = 0; k < ops.size(); ++k) {
        walks.at(rank).ops[ops[k]].team_position = static_cast<int64_t>(k);
        for (int64_t member : team)
          if (member != rank) needs[{rank, ops[k]}].push_back({member, per_rank.at(member)[k]});
      }
  }
}

// Rule 2: sends and recvs pair up per (sender, receiver, tag), in order, with equal sizes.
void matchPointToPoint(const std::map<int64_t, RankWalk>& walks, std::map<Key, std::vector<Key>>& needs) {
  using Channel = std::tuple<int64_t, int64_t, int64_t>;  // (sender, receiver, tag)
  std::map<Channel, std::vector<Key>> sends, recvs;
  for (const auto& [rank, w] : walks)
    for (const PlannedCommunication& c : w.ops) {
      if (c.send_to >= 0) sends[{rank, c.send_to, c.tag}].push_back({rank, c.issue_index});
      if (c.recv_from >= 0) recvs[{c.recv_from, rank, c.tag}].push_back({rank, c.issue_index});
    }
  std::set<Channel> channels;
  for (const auto& [ch, v] : sends) channels.insert(ch);
  for (const auto& [ch, v] : recvs) channels.insert(ch);
  for (const Channel& ch : channels) {
    const auto [from, to, tag] = ch;
    const std::vector<Key>& s = sends[ch];
    const std::vector<Key>& r = recvs[ch];
    for (size_t k = 0; k < std::max(s.size(), r.size()); ++k) {
      if (k >= r.size() || k >= s.size()) {
        const bool unreceived = k >= r.size();
        const Key& lone = unreceived ? s[k] : r[k];
        if (!walks.count(unreceived ? to : from))
          fail({&walks.at(lone.first).program},
               fmt::format("rank {}'s {} {} rank {}, which has no program", lone.first,
                           walks.at(lone.first).ops[lone.second].where, unreceived ? "sends to" : "receives from",
                           unreceived ? to : from));
        const RankWalk& w = walks.at(lone.first);
        fail({&w.program, &walks.at(unreceived ? to : from).program},
             unreceived ? fmt::format("rank {}'s {} sends to rank {} (tag {}), but rank {} never receives it", from,
                                      w.ops[lone.second].where, to, tag, to)
                        : fmt::format("rank {}'s {} receives from rank {} (tag {}), but rank {} never sends it", to,
                                      w.ops[lone.second].where, from, tag, from));
      }
      const PlannedCommunication& x = walks.at(from).ops[s[k].second];
      const PlannedCommunication& y = walks.at(to).ops[r[k].second];
      const DataType xt = x.node->in.tv->dtype(), yt = y.node->out.tv->dtype();
      if (x.send_elements != y.recv_elements || xt != yt)
        fail({&walks.at(from).program, &walks.at(to).program},
             fmt::format("rank {}'s {} sends {} {} to rank {}, but rank {}'s {} receives {} {}", from, x.where,
                         x.send_elements, dtypeName(xt), to, to, y.where, y.recv_elements, dtypeName(yt)));
      needs[s[k]].push_back(r[k]);
      needs[r[k]].push_back(s[k]);
    }
  }
}

// Rule 4: run every rank's steps; a wait passes once all counterparts of its communication are
// issued. A state where no rank can move and some have not finished is a deadlock.
void simulate(const std::map<int64_t, RankWalk>& walks, const std::map<Key, std::vector<Key>>& needs) {
  std::map<int64_t, size_t> pc;
  for (const auto& [rank, w] : walks) pc[rank] = 0;
  auto issued = [&](const Key& k) {  // rank k.first has issued its communication k.second
    const RankWalk& w = walks.at(k.first);
    size_t p = pc.at(k.first);
    for (size_t i = 0; i < p; ++i)
      if (!w.steps[i].wait && w.steps[i].op == k.second) return true;
    return false;
  };
  auto ready = [&](const Key& k) {
    auto it = needs.find(k);
    return it == needs.end() || std::all_of(it->second.begin(), it->second.end(), issued);
  };
  for (bool moved = true; moved;) {
    moved = false;
    for (const auto& [rank, w] : walks)
      while (pc[rank] < w.steps.size() && (!w.steps[pc[rank]].wait || ready({rank, w.steps[pc[rank]].op}))) {
        ++pc[rank];
        moved = true;
      }
  }
  std::vector<std::string> blocked;
  std::vector<const HostProgram*> involved;
  for (const auto& [rank, w] : walks) {
    if (pc[rank] == w.steps.size()) continue;
    const Step& s = w.steps[pc[rank]];
    std::vector<std::string> missing;
    for (const Key& k : needs.at({rank, s.op}))
      if (!issued(k)) missing.push_back(fmt::format("rank {}'s {}", k.first, walks.at(k.first).ops[k.second].where));
    blocked.push_back(fmt::format("rank {} waits at {} for {}, which needs {}", rank, s.where, w.ops[s.op].where,
                                  fmt::join(missing, " and ")));
    involved.push_back(&w.program);
  }
  if (!blocked.empty())
    fail(involved, fmt::format("the programs deadlock: every unfinished rank waits for a peer that has not issued "
                               "its part yet:\n  {}",
                               fmt::join(blocked, "\n  ")));
}

}  // namespace

CommunicationPlan checkCollectives(const std::vector<HostProgram>& programs, const SymbolBindings& bindings) {
  std::map<int64_t, RankWalk> walks;
  for (const HostProgram& p : programs) {
    MF_CHECK(p.rank >= 0, "check-collectives needs specialized programs (specialize-for-rank)");
    RankWalk& w = walks.emplace(p.rank, RankWalk{p, BufferSizes(p, bindings), {}, {}, {}, {}}).first->second;
    walk(w, p.nodes);
  }
  CommunicationPlan plan;
  matchCollectives(walks, plan.needs_);
  matchPointToPoint(walks, plan.needs_);
  simulate(walks, plan.needs_);
  for (auto& [rank, w] : walks) {
    for (PlannedCommunication& c : w.ops) c.node = nullptr;
    plan.by_rank_[rank] = std::move(w.ops);
  }
  return plan;
}

CommunicationPlan checkCollectives(const CompiledProgram& program, const SymbolBindings& bindings) {
  std::set<int64_t> ranks;
  for (int64_t m = 0; m < program.fusion->numMeshes(); ++m)
    for (int64_t d : program.fusion->mesh(m).devices()) ranks.insert(d);
  std::vector<HostProgram> programs;
  for (int64_t r : ranks) programs.push_back(programForRank(program, r));
  return checkCollectives(programs, bindings);
}

std::string CommunicationPlan::describeWait(int64_t rank, int64_t issue_index,
                                            const std::map<int64_t, int64_t>& issued) const {
  const PlannedCommunication& c = by_rank_.at(rank).at(issue_index);
  std::string s = "blocked in " + c.where;
  if (c.team_position >= 0)
    s += fmt::format(", collective #{} of team [{}]", c.team_position, fmt::join(c.team, ", "));
  std::vector<std::string> missing;
  auto it = needs_.find({rank, issue_index});
  for (const auto& [peer, index] : it == needs_.end() ? std::vector<Key>{} : it->second) {
    auto known = issued.find(peer);
    if (known != issued.end() && known->second > index) continue;  // the peer issued its part
    const auto& peer_ops = by_rank_.at(peer);
    std::string at = known == issued.end() || known->second == -1 ? "position unknown"
                     : known->second == -2                         ? "still in an earlier run"
                     : known->second == 0                          ? "has issued no communication yet"
                                                                   : "last issued " + peer_ops.at(known->second - 1).where;
    missing.push_back(fmt::format("rank {} should be at {} ({})", peer, peer_ops.at(index).where, at));
  }
  s += missing.empty() ? "; every peer has issued its part, so one of them stopped making progress after it (it "
                         "died, or is stuck outside meshfuse)"
                       : "; not arrived: " + fmt::format("{}", fmt::join(missing, "; "));
  return s;
}

}  // namespace meshfuse
