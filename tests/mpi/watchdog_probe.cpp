// A deliberately broken two-rank program for the watchdog test: rank 0 enters an allreduce
// that rank 1 never joins. The communicator's watchdog must abort the job with a message.
#include <chrono>
#include <thread>

#include "meshfuse/communicator.h"

int main() {
  std::unique_ptr<meshfuse::Communicator> comm = meshfuse::makeMpiCommunicator();
  float x = 1, y = 0;
  if (comm->rank() == 0) {
    comm->allreduce(&x, &y, 1, meshfuse::DataType::Float, meshfuse::ReduceOp::Sum, {0, 1})->wait();
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(30));
  }
  return 0;
}
