// A rank that fails in the middle of a multi-rank program, through the C++ API: rank 2 of 4
// throws from its second GEMM of a tensor-parallel MLP while the other ranks go on into the
// allreduce it will never join. The executor must end the job with rank 2's message (the
// failing_rank_mid_program test checks that every rank exits quickly, long before the
// communicator's watchdog would fire).
#include <cstdio>

#include "meshfuse/executor.h"
#include "meshfuse/ops.h"
#include "models.h"
#include "runtime/backend.h"

using namespace meshfuse;

namespace {

// The CPU backend, except that on one rank the n-th segment launch throws.
class FailingBackend final : public Backend {
 public:
  FailingBackend(bool fails, int64_t fail_at) : fails_(fails), fail_at_(fail_at) {}
  std::string name() const override { return inner_->name(); }
  Tensor allocate(DataType dt, const std::vector<int64_t>& shape) override { return inner_->allocate(dt, shape); }
  void runSegment(const Segment& seg, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out,
                  const ShapeFn& shape_of) override {
    MF_USER_CHECK(!fails_ || ++launches_ < fail_at_, ErrorKind::Runtime, "segment launch {} fails on purpose",
                  launches_);
    inner_->runSegment(seg, in, out, shape_of);
  }

 private:
  std::unique_ptr<Backend> inner_ = makeCpuBackend();
  bool fails_;
  int64_t fail_at_, launches_ = 0;
};

}  // namespace

int main() {
  std::unique_ptr<Communicator> comm = makeDefaultCommunicator();
  const int64_t n = comm->size(), r = comm->rank();
  auto def = std::make_unique<Fusion>();
  models::buildMlp(*def, 32);
  std::vector<int64_t> ranks(n);
  for (int64_t i = 0; i < n; ++i) ranks[i] = i;
  DeviceMesh mesh(ranks);
  std::vector<ShardedTensor> inputs = {
      distributeTensor(Tensor::random(DataType::Float, {16, 32}, 0), mesh, {Placement::replicate()}, r),
      distributeTensor(Tensor::random(DataType::Float, {128, 32}, 1), mesh, {Placement::shard(0)}, r),
      distributeTensor(Tensor::random(DataType::Float, {32, 128}, 2), mesh, {Placement::shard(1)}, r)};
  MultiDeviceExecutor exec(std::move(def), *comm, std::make_unique<FailingBackend>(r == 2, 2));
  try {
    exec.run(inputs);
  } catch (const UserError& e) {
    // A caller that catches the error and goes on (here: returns normally, MPI_Finalize) is
    // what would hang the others without the abort.
    std::printf("rank %lld caught: %s\n", static_cast<long long>(r), e.what());
    return 0;
  }
  std::printf("rank %lld finished\n", static_cast<long long>(r));
  return 0;
}
