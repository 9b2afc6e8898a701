// WaitContext: what a thread is waiting for, for the watchdog's hang report (communicator.h).
#include <exception>

#include "meshfuse/communicator.h"

namespace meshfuse {
namespace {
thread_local WaitContext* current = nullptr;
}  // namespace

WaitContext::WaitContext(std::function<std::string()> describe) : describe_(std::move(describe)), outer_(current) {
  current = this;
}

WaitContext::~WaitContext() { current = outer_; }

std::string WaitContext::describeCurrent() {
  if (current == nullptr || !current->describe_) return "";
  try {  // called on the way to aborting the job: a failing description must not hide the hang
    return current->describe_();
  } catch (const std::exception& e) {
    return std::string("(its position could not be described: ") + e.what() + ")";
  }
}

}  // namespace meshfuse
