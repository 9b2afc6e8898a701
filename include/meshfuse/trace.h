// Timelines of a run: every task a rank's streams ran (kernels, GEMMs, collectives, waits), a
// summary of how much communication was hidden behind compute, and Chrome/Perfetto trace JSON
// (`meshfuse run --trace`, ExecutorOptions::trace, Python's trace option).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace meshfuse {

enum class TaskKind { Compute, Communication, Copy, Wait };
const char* taskKindName(TaskKind k);

// One executed task, for timelines (Chrome/Perfetto traces).
struct TraceEvent {
  std::string name;
  TaskKind kind;
  int64_t stream;
  double begin_us, end_us;  // since the run started (a traced multi-rank run starts with a world
                            // barrier: the ranks' origins agree, so their timelines line up)
};

// Summary of a timeline: how much of the communication time ran while compute was running.
struct OverlapSummary {
  double compute_us = 0, communication_us = 0, hidden_us = 0;
  double hiddenFraction() const { return communication_us > 0 ? hidden_us / communication_us : 0; }
};
OverlapSummary summarizeOverlap(const std::vector<TraceEvent>& events);
// Causal balance's half exchanges (before and after a causal ring attention, see
// docs/parallelisms.md) carry this mark in their names and their waits' names.
inline constexpr const char* kCausalBalanceMark = " (causal balance)";
bool isCausalBalanceExchange(const TraceEvent& e);

// The same, over the communication tasks `counted` accepts only (compute counts whole): e.g. a
// ring's rotation without causal balance's exchanges, which run before and after it.
OverlapSummary summarizeOverlap(const std::vector<TraceEvent>& events,
                                const std::function<bool(const TraceEvent&)>& counted);

// Chrome / Perfetto trace JSON ("traceEvents" with complete events; pid = rank, tid = stream).
std::string chromeTraceJson(const std::vector<std::vector<TraceEvent>>& per_rank);

class Communicator;
// Every rank's timeline on rank 0 (indexed by rank); other ranks get an empty list. Every rank
// of `comm` must call it.
std::vector<std::vector<TraceEvent>> gatherTraces(Communicator& comm, const std::vector<TraceEvent>& mine);

}  // namespace meshfuse
