// HostIrEvaluator: interprets a rank's host program over a Backend and a Communicator.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "meshfuse/host_ir.h"
#include "meshfuse/runtime/backend.h"
#include "meshfuse/runtime/communicator.h"
#include "meshfuse/tensor.h"

namespace meshfuse {

class HostIrEvaluator {
 public:
  // `program` must be specialized for comm.rank().
  HostIrEvaluator(const HostProgram& program, Backend& backend, Communicator& comm);

  // Runs the program on this rank's local inputs (aligned with the fusion's inputs; a rank
  // outside an input's mesh passes an empty Tensor). Returns the local outputs. Throws a
  // UserError naming the input and both shapes when a local input has the wrong shape/dtype.
  std::vector<Tensor> run(const std::vector<Tensor>& local_inputs);

  // The collectives the last run executed, in order.
  const std::vector<CollectiveInfo>& executed() const { return executed_; }

 private:
  void communicate(const HostNode& n);
  void wait(int64_t handle);
  Tensor& value(const TensorView* tv);

  const HostProgram& program_;
  Backend& backend_;
  Communicator& comm_;
  SymbolBindings bindings_;
  std::map<const TensorView*, Tensor> values_;
  struct Pending {
    std::unique_ptr<Work> work;
    std::function<void()> finish;  // unpacks staging buffers into the output
  };
  std::map<int64_t, Pending> pending_;
  std::vector<CollectiveInfo> executed_;
};

// Binds symbolic sizes from local inputs: a sharded dim's global size is its local size times
// the number of shards. Checks dtypes and shapes, naming the input and both shapes.
SymbolBindings bindLocalInputs(const Fusion& fusion, const std::vector<Tensor>& local_inputs, int64_t rank);

// The block of the full (global) tensor that `rank` holds for `tv`'s sharding. A Partial axis
// gives the whole value to the rank at index 0 along that axis and zeros to the others.
Tensor shardForRank(const TensorView* tv, const Tensor& full, int64_t rank);
// The global tensor from every rank's local block (`locals[r]` for global rank r; Partial axes
// are summed, replicated copies are taken from index 0 along the axis).
Tensor assembleGlobal(const TensorView* tv, const std::vector<Tensor>& locals);

}  // namespace meshfuse
