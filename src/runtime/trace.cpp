// Timelines: overlap summaries and Chrome/Perfetto trace JSON.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <sstream>

#include "meshfuse/communicator.h"
#include "runtime/streams.h"

namespace meshfuse {

const char* taskKindName(TaskKind k) {
  switch (k) {
    case TaskKind::Compute: return "compute";
    case TaskKind::Communication: return "communication";
    case TaskKind::Copy: return "copy";
    case TaskKind::Wait: return "wait";
  }
  return "?";
}

bool isCausalBalanceExchange(const TraceEvent& e) {
  return e.kind == TaskKind::Communication && e.name.find(kCausalBalanceMark) != std::string::npos;
}

OverlapSummary summarizeOverlap(const std::vector<TraceEvent>& events) {
  return summarizeOverlap(events, [](const TraceEvent&) { return true; });
}

OverlapSummary summarizeOverlap(const std::vector<TraceEvent>& events,
                                const std::function<bool(const TraceEvent&)>& counted) {
  // The union of compute intervals, as sorted disjoint intervals.
  std::vector<std::pair<double, double>> compute;
  for (const TraceEvent& e : events)
    if (e.kind == TaskKind::Compute) compute.push_back({e.begin_us, e.end_us});
  std::sort(compute.begin(), compute.end());
  std::vector<std::pair<double, double>> merged;
  for (auto [b, e] : compute) {
    if (!merged.empty() && b <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, e);
    } else {
      merged.push_back({b, e});
    }
  }
  OverlapSummary s;
  for (auto [b, e] : merged) s.compute_us += e - b;
  for (const TraceEvent& e : events) {
    if (e.kind != TaskKind::Communication || !counted(e)) continue;
    s.communication_us += e.end_us - e.begin_us;
    for (auto [b, f] : merged) s.hidden_us += std::max(0.0, std::min(f, e.end_us) - std::max(b, e.begin_us));
  }
  return s;
}

std::string chromeTraceJson(const std::vector<std::vector<TraceEvent>>& per_rank) {
  nlohmann::json events = nlohmann::json::array();
  for (size_t rank = 0; rank < per_rank.size(); ++rank) {
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank}, {"args", {{"name", "rank " + std::to_string(rank)}}}});
    std::vector<int64_t> streams;
    for (const TraceEvent& e : per_rank[rank]) {
      if (std::find(streams.begin(), streams.end(), e.stream) == streams.end()) streams.push_back(e.stream);
      events.push_back({{"name", e.name},
                        {"cat", taskKindName(e.kind)},
                        {"ph", "X"},
                        {"ts", e.begin_us},
                        {"dur", e.end_us - e.begin_us},
                        {"pid", rank},
                        {"tid", e.stream}});
    }
    for (int64_t s : streams)
      events.push_back({{"name", "thread_name"},
                        {"ph", "M"},
                        {"pid", rank},
                        {"tid", s},
                        {"args", {{"name", s == 0 ? std::string("main stream") : "stream " + std::to_string(s)}}}});
  }
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump(1);
}

// Rank 0 receives every rank's timeline (as text: name, kind, stream, begin, end per line).
std::vector<std::vector<TraceEvent>> gatherTraces(Communicator& comm, const std::vector<TraceEvent>& mine) {
  auto encode = [](const std::vector<TraceEvent>& events) {
    std::string s;
    for (const TraceEvent& e : events)
      s += fmt::format("{}\t{}\t{}\t{}\t{}\n", e.name, static_cast<int>(e.kind), e.stream, e.begin_us, e.end_us);
    return s;
  };
  auto decode = [](const std::string& s) {
    std::vector<TraceEvent> events;
    std::istringstream in(s);
    for (std::string line; std::getline(in, line);) {
      std::istringstream f(line);
      TraceEvent e;
      int kind = 0;
      std::getline(f, e.name, '\t');
      f >> kind >> e.stream >> e.begin_us >> e.end_us;
      e.kind = static_cast<TaskKind>(kind);
      events.push_back(e);
    }
    return events;
  };
  if (comm.rank() != 0) {
    std::string text = encode(mine);
    int64_t size = static_cast<int64_t>(text.size());
    comm.send(&size, 1, DataType::Int64, 0, /*tag=*/8)->wait();
    comm.send(text.data(), size, DataType::Bool, 0, /*tag=*/9)->wait();
    return {};
  }
  std::vector<std::vector<TraceEvent>> all = {mine};
  for (int64_t r = 1; r < comm.size(); ++r) {
    int64_t size = 0;
    comm.recv(&size, 1, DataType::Int64, r, /*tag=*/8)->wait();
    std::string text(static_cast<size_t>(size), '\0');
    comm.recv(text.data(), size, DataType::Bool, r, /*tag=*/9)->wait();
    all.push_back(decode(text));
  }
  return all;
}

}  // namespace meshfuse
