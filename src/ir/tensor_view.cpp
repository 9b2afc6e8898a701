// TensorView: domains and the schedule API.
#include <fmt/args.h>

#include <algorithm>
#include <functional>
#include <map>

#include "meshfuse/error.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/printer.h"

namespace meshfuse {

std::vector<IterDomain*> TensorView::dims() const {
  std::vector<IterDomain*> out;
  out.reserve(logical_.size());
  for (IterDomain* id : logical_)
    if (!id->isReduction()) out.push_back(id);
  return out;
}

std::vector<Extent> TensorView::shape() const {
  std::vector<Extent> out;
  out.reserve(logical_.size());
  for (const IterDomain* id : logical_)
    if (!id->isReduction()) out.push_back(id->extent());
  return out;
}

std::string TensorView::describe() const {
  if (definition_ == nullptr) return "input " + fusion_->displayName(this);
  return fusion_->displayName(this) + " = " + printExprCall(*fusion_, definition_);
}

std::vector<int64_t> TensorView::evaluateShape(const SymbolBindings& bindings) const {
  std::vector<int64_t> out;
  try {
    for (const Extent& e : shape()) out.push_back(e.evaluate(bindings));
  } catch (const UserError& e) {
    throw UserError(e.kind(), fmt::format("{}: {}", describe(), e.message()));
  }
  MF_USER_CHECK(checkedNumel(out, dtypeSize(dtype_)).has_value(), ErrorKind::Shape,
                "{}: shape [{}] of {} has more elements or bytes than an int64 can count", describe(),
                fmt::join(out, ", "), dtypeName(dtype_));
  return out;
}

Provenance Provenance::join(const std::vector<Provenance>& notes) {
  Provenance out;
  for (const Provenance& n : notes) {
    if (n.text.empty()) continue;
    if (!out.text.empty()) out.text += "; ";
    out.text += n.text;
    out.refs.insert(out.refs.end(), n.refs.begin(), n.refs.end());
  }
  return out;
}

Provenance Provenance::literal(std::string_view text) {
  Provenance p;
  for (char c : text) {
    p.text += c;
    if (c == '{' || c == '}') p.text += c;  // a format string: braces are doubled
  }
  return p;
}

std::string TensorView::provenance() const {
  fmt::dynamic_format_arg_store<fmt::format_context> args;
  for (const Val* v : provenance_.refs) args.push_back(fusion_->displayName(v));
  return fmt::vformat(provenance_.text, args);
}

std::vector<IterDomain*> TensorView::allocation() const {
  // The splits on the way from a logical dim to each DID loop axis, by the IterDomain they split.
  std::map<const IterDomain*, const IdTransform*> did_split;
  for (const IterDomain* id : loop_) {
    if (!id->isDeviceDim()) continue;
    for (const IterDomain* x = id; x->definition() != nullptr; x = x->definition()->inputs[0]) {
      if (x->definition()->kind != IdTransform::Split) break;  // DID of a merge: placementsOf rejects it
      did_split[x->definition()->inputs[0]] = x->definition();
    }
  }
  std::vector<IterDomain*> out;
  std::function<void(IterDomain*)> expand = [&](IterDomain* id) {
    auto it = did_split.find(id);
    if (it == did_split.end()) {
      out.push_back(id);
      return;
    }
    for (IterDomain* part : it->second->outputs) expand(part);
  };
  for (IterDomain* id : logical_) expand(id);
  return out;
}

std::vector<Extent> TensorView::allocatedShape() const {
  std::vector<IterDomain*> alloc = allocation();
  std::vector<Extent> out;
  for (IterDomain* dim : dims()) {
    Extent e(1);
    for (const IterDomain* id : alloc) {
      if (id->isDeviceDim()) continue;
      const IterDomain* root = id;
      while (root->definition() != nullptr) root = root->definition()->inputs[0];
      if (root == dim) e = e.multiplied(id->extent());
    }
    out.push_back(e);
  }
  return out;
}

const DeviceMesh* TensorView::mesh() const { return mesh_index_ < 0 ? nullptr : &fusion_->mesh(mesh_index_); }

int64_t TensorView::normalizeAxis(int64_t axis, const char* what) const {
  int64_t n = static_cast<int64_t>(loop_.size());
  int64_t a = axis < 0 ? axis + n : axis;
  MF_USER_CHECK(a >= 0 && a < n, ErrorKind::Value, "{}: axis {} is out of range for {} whose loop domain has {} axes",
                what, axis, fusion_->displayName(this), n);
  return a;
}

TensorView* TensorView::setDeviceMesh(const DeviceMesh& mesh) {
  mesh_index_ = fusion_->addMesh(mesh);
  pinned_ = true;
  return this;
}

TensorView* TensorView::split(int64_t axis, int64_t factor, bool inner_split) {
  applyStep({ScheduleStep::Split, axis, factor, inner_split, ParallelType::Serial});
  return this;
}

TensorView* TensorView::merge(int64_t axis) {
  applyStep({ScheduleStep::Merge, axis, 0, false, ParallelType::Serial});
  return this;
}

TensorView* TensorView::parallelize(int64_t axis, ParallelType pt) {
  applyStep({ScheduleStep::Parallelize, axis, 0, false, pt});
  return this;
}

void TensorView::applyStep(const ScheduleStep& step) {
  const std::string name = fusion_->displayName(this);
  ScheduleStep s = step;
  switch (step.kind) {
    case ScheduleStep::Split: {
      s.axis = normalizeAxis(step.axis, "split");
      IterDomain* in = loop_[s.axis];
      MF_USER_CHECK(step.factor > 0, ErrorKind::Value, "split of {} axis {}: factor {} must be positive", name, s.axis,
                    step.factor);
      // A factor that does not divide the extent splits it as torch.chunk does: the remainder's
      // extent is the leading parts' ceil (placement.h: localBlock).
      Extent rest = in->extent().divided(step.factor);
      // A size-1 dim splits like any other (by 1: a mesh axis of one device shards it); being a
      // broadcast dim is what elementwise ops may do with it, not a limit on its placement.
      IterType t = in->iterType();
      IterDomain* outer = fusion_->newIterDomain(step.inner_split ? rest : Extent(step.factor), t);
      IterDomain* inner = fusion_->newIterDomain(step.inner_split ? Extent(step.factor) : rest, t);
      const IdTransform* tr =
          fusion_->newTransform({IdTransform::Split, {in}, {outer, inner}, step.factor, step.inner_split});
      outer->setDefinition(tr);
      inner->setDefinition(tr);
      loop_[s.axis] = outer;
      loop_.insert(loop_.begin() + s.axis + 1, inner);
      break;
    }
    case ScheduleStep::Merge: {
      s.axis = normalizeAxis(step.axis, "merge");
      MF_USER_CHECK(s.axis + 1 < static_cast<int64_t>(loop_.size()), ErrorKind::Value,
                    "merge of {} axis {}: there is no axis {} to merge with", name, s.axis, s.axis + 1);
      IterDomain* a = loop_[s.axis];
      IterDomain* b = loop_[s.axis + 1];
      MF_USER_CHECK(a->isReduction() == b->isReduction(), ErrorKind::Value,
                    "merge of {} axes {} and {}: cannot merge a reduction with an iteration dim", name, s.axis,
                    s.axis + 1);
      IterDomain* out = fusion_->newIterDomain(a->extent().multiplied(b->extent()),
                                               a->isReduction() ? IterType::Reduction : IterType::Iteration);
      out->setDefinition(fusion_->newTransform({IdTransform::Merge, {a, b}, {out}, 0, false}));
      loop_[s.axis] = out;
      loop_.erase(loop_.begin() + s.axis + 1);
      break;
    }
    case ScheduleStep::Parallelize: {
      s.axis = normalizeAxis(step.axis, "parallelize");
      IterDomain* id = loop_[s.axis];
      if (isDeviceDim(step.ptype)) {
        for (size_t i = 0; i < loop_.size(); ++i)
          MF_USER_CHECK(static_cast<int64_t>(i) == s.axis || loop_[i]->parallelType() != step.ptype,
                        ErrorKind::Placement, "parallelize of {} axis {} on {}: axis {} is already {}", name, s.axis,
                        parallelTypeName(step.ptype), i, parallelTypeName(step.ptype));
        if (const DeviceMesh* m = mesh()) {
          int64_t mesh_axis = -1;
          try {
            mesh_axis = m->axisOfParallelType(step.ptype);
          } catch (const UserError& e) {  // name the tensor, keep the mesh's explanation
            userError(e.kind(), "parallelize of {} axis {} on {}: {}", name, s.axis, parallelTypeName(step.ptype),
                      e.message());
          }
          MF_USER_CHECK(!id->extent().isStatic() || id->extent().value() == m->size(mesh_axis), ErrorKind::Placement,
                        "parallelize of {} axis {} on {}: the axis has extent {} but mesh axis {} of {} has {} devices",
                        name, s.axis, parallelTypeName(step.ptype), id->extent().toString(), mesh_axis, m->toString(),
                        m->size(mesh_axis));
        }
      }
      id->parallelize(step.ptype);
      break;
    }
  }
  schedule_.push_back(s);
}

void TensorView::resetSchedule() {
  logical_.resize(logical_.size() - num_partial_dims_);  // Partial dims belong to the placement
  num_partial_dims_ = 0;
  for (IterDomain* id : logical_) id->parallelize(ParallelType::Serial);
  loop_ = logical_;
  schedule_.clear();
  mesh_index_ = -1;
  pinned_ = false;
}

IterDomain* TensorView::addPartialDim(int64_t extent) {
  IterDomain* id = fusion_->newIterDomain(Extent(extent), IterType::Reduction);
  logical_.push_back(id);
  loop_.push_back(id);
  ++num_partial_dims_;
  return id;
}

int64_t TensorView::loopAxisOf(ParallelType pt) const {
  for (size_t i = 0; i < loop_.size(); ++i)
    if (loop_[i]->parallelType() == pt) return static_cast<int64_t>(i);
  return -1;
}

int64_t TensorView::logicalAxisOf(int64_t loop_axis) const {
  const IterDomain* id = loop_.at(loop_axis);
  while (const IdTransform* t = id->definition()) {
    if (t->kind == IdTransform::Merge) return -1;
    id = t->inputs[0];
  }
  auto it = std::find(logical_.begin(), logical_.end(), id);
  MF_CHECK(it != logical_.end(), "loop axis {} does not derive from the logical domain", loop_axis);
  return it - logical_.begin();
}

}  // namespace meshfuse
