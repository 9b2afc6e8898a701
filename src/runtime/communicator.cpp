// The Communicator interface's default implementations (communicator.h).
#include "meshfuse/communicator.h"

#include "meshfuse/error.h"

namespace meshfuse {
namespace {

// Several operations waited for together, in the order they were issued.
class WorkGroup final : public Work {
 public:
  explicit WorkGroup(std::vector<std::unique_ptr<Work>> parts) : parts_(std::move(parts)) {}
  void wait() override {
    for (std::unique_ptr<Work>& w : parts_) w->wait();
  }

 private:
  std::vector<std::unique_ptr<Work>> parts_;
};

}  // namespace

std::unique_ptr<Work> Communicator::sendRecv(const void* send_buf, int64_t send_count, int64_t to, void* recv_buf,
                                             int64_t recv_count, int64_t from, DataType dtype, int64_t tag,
                                             const Team&) {
  MF_CHECK(to >= 0 || from >= 0, "sendRecv with neither a peer to send to nor one to receive from");
  std::vector<std::unique_ptr<Work>> parts;
  if (from >= 0) parts.push_back(recv(recv_buf, recv_count, dtype, from, tag));
  if (to >= 0) parts.push_back(send(send_buf, send_count, dtype, to, tag));
  return std::make_unique<WorkGroup>(std::move(parts));
}

}  // namespace meshfuse
