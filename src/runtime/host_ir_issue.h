// How HostIrEvaluator issues communications in one order on every rank and finishes them: the
// IssueGate its tasks take tickets from, and the Handle of a communication in flight. Internal to
// the evaluator (host_ir_evaluator.cpp runs and waits, host_ir_communication.cpp issues).
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/host_ir_evaluator.h"

namespace meshfuse {

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
  std::string name;     // the communication's, in timelines (its wait's task is named after it)
  std::unique_ptr<Work> work;
  std::function<void()> finish;             // unpacks staging buffers (all-to-all)
  std::vector<Tensor> buffers;              // kept alive until the operation completed
};

}  // namespace meshfuse
