// IR verifier.
#include "meshfuse/ir/verifier.h"

#include <set>

#include "meshfuse/ir/fusion.h"

namespace meshfuse {
namespace {

void verifyTensor(const Fusion& f, const TensorView* tv, const VerifyOptions& o) {
  const std::string name = f.displayName(tv);
  const DeviceMesh* mesh = tv->mesh();
  MF_USER_CHECK(!o.require_meshes || mesh != nullptr, ErrorKind::Placement, "{} has no device mesh", name);
  std::set<ParallelType> seen;
  for (size_t i = 0; i < tv->loop().size(); ++i) {
    const IterDomain* id = tv->loop()[i];
    if (!id->isDeviceDim()) continue;
    ParallelType pt = id->parallelType();
    MF_USER_CHECK(seen.insert(pt).second, ErrorKind::Placement, "{}: two loop axes are parallelized on {}", name,
                  parallelTypeName(pt));
    MF_USER_CHECK(mesh != nullptr, ErrorKind::Placement, "{}: loop axis {} is parallelized on {} but the tensor has no mesh",
                  name, i, parallelTypeName(pt));
    MF_USER_CHECK(mesh->hasAxisFor(pt), ErrorKind::Placement,
                  "{}: loop axis {} is parallelized on {}, which is beyond the axes of rank-{} mesh {}", name, i,
                  parallelTypeName(pt), mesh->rank(), mesh->toString());
    int64_t axis = mesh->axisOfParallelType(pt);
    MF_USER_CHECK(id->extent().isStatic() && id->extent().value() == mesh->size(axis), ErrorKind::Placement,
                  "{}: loop axis {} ({}) has extent {} but mesh axis {} of {} has {} devices", name, i,
                  parallelTypeName(pt), id->extent().toString(), axis, mesh->toString(), mesh->size(axis));
  }
}

}  // namespace

void verify(const Fusion& f, const VerifyOptions& o) {
  std::set<const Val*> defined(f.inputs().begin(), f.inputs().end());
  for (const TensorView* in : f.inputs()) {
    MF_CHECK(in->definition() == nullptr, "input {} has a definition", f.displayName(in));
    verifyTensor(f, in, o);
  }
  for (const Expr* e : f.exprs()) {
    for (const Val* v : e->inputs()) {
      if (v == nullptr || v->valKind() == ValKind::Scalar) continue;
      MF_CHECK(v->fusion() == &f, "{} uses a value of another fusion", e->name());
      MF_CHECK(defined.count(v), "{} uses {} before its definition", e->name(), f.displayName(v));
    }
    for (const TensorView* out : e->outputs()) {
      MF_CHECK(out->definition() == e, "{}'s output {} has another definition", e->name(), f.displayName(out));
      MF_CHECK(defined.insert(out).second, "{} is defined twice", f.displayName(out));
      verifyTensor(f, out, o);
    }
  }
  for (const TensorView* out : f.outputs())
    MF_CHECK(defined.count(out), "output {} is never defined", f.displayName(out));
}

}  // namespace meshfuse
