// The host-IR interpreter.
#include "meshfuse/runtime/host_ir_evaluator.h"

#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/placement.h"
#include "runtime/tensor_blocks.h"

namespace meshfuse {
namespace {

std::vector<int64_t> zeros(size_t n) { return std::vector<int64_t>(n, 0); }

// Whether blocks along dim `d` of a row-major tensor of `shape` are contiguous.
bool contiguousBlocks(const std::vector<int64_t>& shape, int64_t d) {
  for (int64_t i = 0; i < d; ++i)
    if (shape[i] != 1) return false;
  return true;
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t x : s) n *= x;
  return n;
}

// Offsets of `rank`'s block of `tv` in the global tensor, per dims() index. Several mesh axes
// sharding one dim nest in mesh-axis order (axis 0 outermost), as applyPlacements splits.
std::vector<int64_t> blockOffsets(const TensorView* tv, const std::vector<int64_t>& local, int64_t rank) {
  std::vector<int64_t> off(local.size(), 0);
  const DeviceMesh* mesh = tv->mesh();
  if (mesh == nullptr) return off;
  std::vector<Placement> ps = placementsOf(tv);
  std::vector<int64_t> coords = mesh->coordinates(rank);
  std::vector<int64_t> index(local.size(), 0);  // block index along each dim
  for (int64_t a = 0; a < mesh->rank(); ++a)
    if (ps[a].kind == Placement::Shard) index[ps[a].dim] = index[ps[a].dim] * mesh->size(a) + coords[a];
  for (size_t d = 0; d < local.size(); ++d) off[d] = index[d] * local[d];
  return off;
}

}  // namespace

SymbolBindings bindLocalInputs(const Fusion& f, const std::vector<Tensor>& locals, int64_t rank) {
  MF_USER_CHECK(locals.size() == f.inputs().size(), ErrorKind::Value, "the fusion takes {} inputs but {} were given",
                f.inputs().size(), locals.size());
  SymbolBindings b;
  for (size_t i = 0; i < locals.size(); ++i) {
    const TensorView* tv = f.inputs()[i];
    if (tv->mesh() != nullptr && !tv->mesh()->contains(rank)) continue;
    const Tensor& t = locals[i];
    const std::string name = f.displayName(tv);
    MF_USER_CHECK(t.dtype() == tv->dtype(), ErrorKind::Dtype, "input {} ({}): expected dtype {} but got {}", i, name,
                  dtypeName(tv->dtype()), dtypeName(t.dtype()));
    std::vector<Extent> shape = tv->shape();
    MF_USER_CHECK(t.rank() == static_cast<int64_t>(shape.size()), ErrorKind::Shape,
                  "input {} ({}): expected rank {} but got a local tensor of shape {}", i, name, shape.size(),
                  t.shapeString());
    std::vector<int64_t> factors = shardFactors(tv);
    for (size_t d = 0; d < shape.size(); ++d) {
      int64_t global = t.shape()[d] * factors[d];
      if (shape[d].isStatic()) {
        MF_USER_CHECK(shape[d].value() == global, ErrorKind::Shape,
                      "input {} ({}): dim {} must be {} globally ({} per rank over {} shards) but the local tensor has "
                      "shape {}",
                      i, name, d, shape[d].value(), shape[d].value() / factors[d], factors[d], t.shapeString());
        continue;
      }
      auto [it, fresh] = b.emplace(shape[d].symbol(), global);
      MF_USER_CHECK(fresh || it->second == global, ErrorKind::Shape,
                    "input {} ({}): dim {} is ?{} = {} but an earlier input bound it to {}", i, name, d,
                    shape[d].symbol(), global, it->second);
    }
  }
  f.checkExtentConstraints(b);
  return b;
}

HostIrEvaluator::HostIrEvaluator(const HostProgram& program, Backend& backend, Communicator& comm)
    : program_(program), backend_(backend), comm_(comm) {
  MF_CHECK(program.rank == comm.rank(), "program for rank {} run on rank {}", program.rank, comm.rank());
}

Tensor& HostIrEvaluator::value(const TensorView* tv) {
  auto it = values_.find(tv);
  MF_CHECK(it != values_.end(), "{} has no buffer on rank {}", program_.fusion->displayName(tv), comm_.rank());
  return it->second;
}

std::vector<Tensor> HostIrEvaluator::run(const std::vector<Tensor>& local_inputs) {
  const Fusion& f = *program_.fusion;
  bindings_ = bindLocalInputs(f, local_inputs, comm_.rank());
  values_.clear();
  executed_.clear();
  for (size_t i = 0; i < local_inputs.size(); ++i) values_[f.inputs()[i]] = local_inputs[i];
  for (const HostNode& n : program_.nodes) {
    switch (n.kind) {
      case HostNodeKind::Allocate:
        values_[n.tv] = backend_.allocate(n.tv->dtype(), localShape(n.tv, bindings_));
        break;
      case HostNodeKind::Deallocate:
        values_.erase(n.tv);
        break;
      case HostNodeKind::LaunchKernel:
      case HostNodeKind::Gemm: {
        const Segment& seg = program_.segment(n);
        std::vector<const Tensor*> ins;
        std::vector<Tensor*> outs;
        for (const TensorView* tv : seg.inputs) ins.push_back(&value(tv));
        for (const TensorView* tv : seg.outputs) outs.push_back(&value(tv));
        backend_.runSegment(seg, ins, outs, [this](const TensorView* tv) { return localShape(tv, bindings_); });
        break;
      }
      case HostNodeKind::Communication:
        communicate(n);
        break;
      case HostNodeKind::Wait:
        wait(n.handle);
        break;
      case HostNodeKind::ShardSlice: {
        const Tensor& in = value(n.in);
        Tensor& out = value(n.out);
        std::vector<int64_t> off = zeros(out.shape().size());
        off[n.out_dim] = n.out->mesh()->indexAlong(comm_.rank(), n.mesh_axis) * out.shape()[n.out_dim];
        copyBlock(in, off, out, zeros(off.size()), out.shape());
        break;
      }
    }
  }
  MF_CHECK(pending_.empty(), "{} communications were never waited for", pending_.size());
  std::vector<Tensor> outs;
  for (const TensorView* o : f.outputs()) outs.push_back(o->mesh() && !o->mesh()->contains(comm_.rank()) ? Tensor() : value(o));
  return outs;
}

void HostIrEvaluator::communicate(const HostNode& n) {
  const Tensor& in = value(n.in);
  Tensor& out = value(n.out);
  const int64_t team = static_cast<int64_t>(n.team.size());
  const DataType dt = in.dtype();
  const size_t rank = in.shape().size();
  Pending p;
  executed_.push_back({n.comm, n.mesh_axis, n.team, static_cast<int64_t>(in.nbytes()), program_.fusion->displayName(n.out),
                       program_.fusion->displayName(n.in), n.out->provenance()});
  switch (n.comm) {
    case CommKind::Allreduce:
      p.work = comm_.allreduce(in.data(), out.data(), in.numel(), dt, ReduceOp::Sum, n.team);
      break;
    case CommKind::Allgather:
      // layout-for-communication made the gathered dim outermost: rank j's block is the j-th
      // contiguous chunk of the output.
      MF_CHECK(contiguousBlocks(out.shape(), n.in_dim), "allgather along non-outermost dim {}", n.in_dim);
      p.work = comm_.allgather(in.data(), out.data(), in.numel(), dt, n.team);
      break;
    case CommKind::ReduceScatter:
      MF_CHECK(contiguousBlocks(in.shape(), n.out_dim), "reduce-scatter along non-outermost dim {}", n.out_dim);
      p.work = comm_.reduceScatter(in.data(), out.data(), out.numel(), dt, ReduceOp::Sum, n.team);
      break;
    case CommKind::AllToAll: {
      // Send chunk j = my slice j along out_dim; receive from rank j its block along in_dim.
      std::vector<int64_t> send_chunk = in.shape();
      send_chunk[n.out_dim] /= team;
      auto send = std::make_shared<Tensor>(dt, stagingShape(send_chunk, team));
      for (int64_t j = 0; j < team; ++j) {
        std::vector<int64_t> so(rank, 0), dof(rank, 0);
        so[n.out_dim] = j * send_chunk[n.out_dim];
        dof[0] = j * send_chunk[0];
        copyBlock(in, so, *send, dof, send_chunk);
      }
      auto recv = std::make_shared<Tensor>(dt, stagingShape(send_chunk, team));
      p.work = comm_.allToAll(send->data(), recv->data(), numel(send_chunk), dt, n.team);
      int64_t d = n.in_dim;
      p.finish = [send, recv, send_chunk, d, team, rank, &out] {
        for (int64_t j = 0; j < team; ++j) {
          std::vector<int64_t> so(rank, 0), dof(rank, 0);
          so[0] = j * send_chunk[0];
          dof[d] = j * send_chunk[d];
          copyBlock(*recv, so, out, dof, send_chunk);
        }
      };
      break;
    }
    default:
      userError(ErrorKind::Unsupported, "{} communications are not lowered yet", commKindName(n.comm));
  }
  pending_[n.handle] = std::move(p);
}

void HostIrEvaluator::wait(int64_t handle) {
  auto it = pending_.find(handle);
  MF_CHECK(it != pending_.end(), "wait on unknown handle #{}", handle);
  it->second.work->wait();
  if (it->second.finish) it->second.finish();
  pending_.erase(it);
}

Tensor shardForRank(const TensorView* tv, const Tensor& full, int64_t rank) {
  if (tv->mesh() == nullptr) return full;
  std::vector<int64_t> factors = shardFactors(tv);
  std::vector<int64_t> local = full.shape();
  for (size_t d = 0; d < local.size(); ++d) {
    MF_USER_CHECK(local[d] % factors[d] == 0, ErrorKind::Unsupported,
                  "uneven sharding not supported: {} dim {} has size {} which does not divide into {} shards",
                  tv->fusion()->displayName(tv), d, local[d], factors[d]);
    local[d] /= factors[d];
  }
  Tensor out(full.dtype(), local);
  std::vector<Placement> ps = placementsOf(tv);
  std::vector<int64_t> coords = tv->mesh()->coordinates(rank);
  for (size_t a = 0; a < ps.size(); ++a)
    if (ps[a].kind == Placement::Partial && coords[a] != 0) return out;  // zeros: the sum is held by index 0
  copyBlock(full, blockOffsets(tv, local, rank), out, zeros(local.size()), local);
  return out;
}

Tensor assembleGlobal(const TensorView* tv, const std::vector<Tensor>& locals) {
  const DeviceMesh* mesh = tv->mesh();
  if (mesh == nullptr) return locals.at(0);
  std::vector<Placement> ps = placementsOf(tv);
  std::vector<int64_t> factors = shardFactors(tv);
  const Tensor& first = locals.at(mesh->devices()[0]);
  std::vector<int64_t> global = first.shape();
  for (size_t d = 0; d < global.size(); ++d) global[d] *= factors[d];
  Tensor out(first.dtype(), global);
  for (int64_t r : mesh->devices()) {
    std::vector<int64_t> coords = mesh->coordinates(r);
    bool skip = false, partial = false;
    for (size_t a = 0; a < ps.size(); ++a) {
      if (ps[a].kind == Placement::Replicate && coords[a] != 0) skip = true;
      if (ps[a].kind == Placement::Partial) partial = true;
    }
    if (skip) continue;
    const Tensor& l = locals.at(r);
    if (partial) addBlock(l, zeros(global.size()), out, blockOffsets(tv, l.shape(), r), l.shape());
    else copyBlock(l, zeros(global.size()), out, blockOffsets(tv, l.shape(), r), l.shape());
  }
  return out;
}

}  // namespace meshfuse
