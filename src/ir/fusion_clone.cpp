// Fusion::clone: a structural copy (fusion.h). Every node is copied in storage order and every
// pointer between nodes (operands, definitions, uses, IterDomains, transforms, provenance
// references) is remapped to the copy's, so the copy is indistinguishable from the original:
// same printed text, same display names, same schedules, pins and provenance.
#include <unordered_map>

#include "meshfuse/ir/fusion.h"

namespace meshfuse {
namespace {

template <typename T>
T* remapped(const std::unordered_map<const T*, T*>& map, const T* p) {
  if (p == nullptr) return nullptr;
  auto it = map.find(p);
  MF_CHECK(it != map.end(), "Fusion::clone: a pointer to a node the fusion does not own");
  return it->second;
}

template <typename T>
std::vector<T*> remapped(const std::unordered_map<const T*, T*>& map, const std::vector<T*>& ps) {
  std::vector<T*> out;
  out.reserve(ps.size());
  for (T* p : ps) out.push_back(remapped(map, p));
  return out;
}

}  // namespace

std::unique_ptr<Fusion> Fusion::clone() const {
  auto f = std::make_unique<Fusion>();
  for (const MeshEntry& m : meshes_) f->meshes_.push_back({std::make_unique<DeviceMesh>(*m.mesh), m.name});

  std::unordered_map<const IterDomain*, IterDomain*> ids;
  for (const auto& id : ids_) {
    f->ids_.push_back(std::make_unique<IterDomain>(*id));
    ids[id.get()] = f->ids_.back().get();
  }
  std::unordered_map<const IdTransform*, IdTransform*> transforms;
  for (const auto& t : transforms_) {
    IdTransform copy = *t;
    copy.inputs = remapped(ids, t->inputs);
    copy.outputs = remapped(ids, t->outputs);
    f->transforms_.push_back(std::make_unique<IdTransform>(std::move(copy)));
    transforms[t.get()] = f->transforms_.back().get();
  }
  for (const auto& id : f->ids_) id->setDefinition(remapped(transforms, id->definition()));

  std::unordered_map<const Val*, Val*> vals;
  for (const auto& v : vals_) {
    std::unique_ptr<Val> copy;
    if (v->valKind() == ValKind::Scalar) {
      copy.reset(new Scalar(f.get(), static_cast<const Scalar*>(v.get())->value(), v->dtype()));
    } else {
      const auto* tv = static_cast<const TensorView*>(v.get());
      auto* c = new TensorView(f.get(), tv->dtype(), remapped(ids, tv->logical_), tv->name());
      c->loop_ = remapped(ids, tv->loop_);
      c->schedule_ = tv->schedule_;
      c->mesh_index_ = tv->mesh_index_;
      c->num_partial_dims_ = tv->num_partial_dims_;
      c->pinned_ = tv->pinned_;
      copy.reset(c);
    }
    copy->name_ = v->name_;
    vals[v.get()] = copy.get();
    f->vals_.push_back(std::move(copy));
  }
  auto val = [&](const Val* v) { return remapped(vals, v); };
  auto tensor = [&](const TensorView* tv) { return static_cast<TensorView*>(val(tv)); };

  std::unordered_map<const Expr*, Expr*> exprs;
  for (const auto& e : expr_storage_) {
    std::vector<Val*> inputs;
    for (const Val* in : e->inputs_) inputs.push_back(in ? val(in) : nullptr);
    f->expr_storage_.push_back(std::unique_ptr<Expr>(new Expr(e->kind_, std::move(inputs), e->attrs_)));
    Expr* c = f->expr_storage_.back().get();
    for (const TensorView* o : e->outputs_) c->outputs_.push_back(tensor(o));
    exprs[e.get()] = c;
  }
  auto expr = [&](const Expr* e) { return remapped(exprs, e); };

  // Links between values and ops, and provenance (whose references name values).
  for (const auto& v : vals_) {
    Val* c = vals.at(v.get());
    c->definition_ = expr(v->definition_);
    for (const Expr* use : v->uses_) c->uses_.push_back(expr(use));
    if (v->valKind() == ValKind::TensorView) {
      Provenance p = static_cast<const TensorView*>(v.get())->provenance_;
      for (const Val*& ref : p.refs) ref = ref ? val(ref) : nullptr;
      static_cast<TensorView*>(c)->provenance_ = std::move(p);
    }
  }
  for (const Expr* e : exprs_) f->exprs_.push_back(expr(e));
  for (const TensorView* in : inputs_) f->inputs_.push_back(tensor(in));
  for (const TensorView* out : outputs_) f->outputs_.push_back(tensor(out));
  f->insertion_point_ = expr(insertion_point_);
  for (ExtentConstraint c : extent_constraints_) {
    c.ta = c.ta ? val(c.ta) : nullptr;
    c.tb = c.tb ? val(c.tb) : nullptr;
    c.out = c.out ? tensor(c.out) : nullptr;
    f->extent_constraints_.push_back(std::move(c));
  }
  f->output_aliases_ = output_aliases_;
  f->reshard_by_bytes_ = reshard_by_bytes_;
  return f;
}

}  // namespace meshfuse
