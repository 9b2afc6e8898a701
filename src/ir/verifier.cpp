// IR verifier: structure (def-before-use, single definitions), types (each op's output is what
// shape and dtype inference gives for its current operands) and DID axes.
#include "meshfuse/ir/verifier.h"

#include <set>

#include "ir/shape_inference.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/placement.h"

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
    MF_USER_CHECK(mesh != nullptr, ErrorKind::Placement,
                  "{}: loop axis {} is parallelized on {} but the tensor has no mesh", name, i, parallelTypeName(pt));
    MF_USER_CHECK(mesh->hasAxisFor(pt), ErrorKind::Placement,
                  "{}: loop axis {} is parallelized on {}, which is beyond the axes of rank-{} mesh {}", name, i,
                  parallelTypeName(pt), mesh->rank(), mesh->toString());
    int64_t axis = mesh->axisOfParallelType(pt);
    MF_USER_CHECK(id->extent().isStatic() && id->extent().value() == mesh->size(axis), ErrorKind::Placement,
                  "{}: loop axis {} ({}) has extent {} but mesh axis {} of {} has {} devices", name, i,
                  parallelTypeName(pt), id->extent().toString(), axis, mesh->toString(), mesh->size(axis));
  }
}

// "f32[?t, 4, r64]"
std::string typeText(DataType dt, const std::vector<InferredDim>& dims) {
  std::vector<std::string> s;
  for (const InferredDim& d : dims) s.push_back((d.type == IterType::Reduction ? "r" : "") + d.extent.toString());
  return fmt::format("{}[{}]", dtypeName(dt), fmt::join(s, ", "));
}

// The stored output of `e` must be what inference gives for its operands now: a pass that swaps
// an operand (replaceOperand) for one of another shape or dtype breaks the op. Trailing
// Partial dims (addPartialDim) are the output's placement, not its type, and are not compared.
void verifyExprType(const Fusion& f, const Expr* e) {
  const TensorView* out = e->output();
  InferredOutput want;
  try {
    want = inferOutput(f, e->kind(), e->inputs(), e->attrs());
  } catch (const UserError& err) {
    MF_CHECK(false, "{}: the op does not accept its operands: {}", out->describe(), err.message());
  }
  std::vector<InferredDim> have;
  const size_t typed = out->logical().size() - static_cast<size_t>(out->numPartialDims());
  for (size_t i = 0; i < typed; ++i) have.push_back({out->logical()[i]->extent(), out->logical()[i]->iterType()});
  MF_CHECK(out->dtype() == want.dtype && have == want.logical, "{}: the output is {} but {} of its operands gives {}",
           out->describe(), typeText(out->dtype(), have), e->name(), typeText(want.dtype, want.logical));
}

}  // namespace

void requireOutputs(const Fusion& f, std::string_view where) {
  MF_USER_CHECK(!f.outputs().empty(), ErrorKind::Value,
                "{}the fusion has no outputs: nothing it computes would be returned (mark results with `output %x` "
                "or add_output)",
                where);
}

// An output written into an input's buffer must be laid out as that input on every rank: same
// dtype, same global shape, same mesh and placements (once the two have meshes).
static void verifyAliases(const Fusion& f) {
  for (const auto& [o, i] : f.outputAliases()) {
    const TensorView* out = f.outputs().at(o);
    const TensorView* in = f.inputs().at(i);
    MF_CHECK(out->dtype() == in->dtype(), "alias {} into {}: the dtypes differ", f.displayName(out), f.displayName(in));
    if (out->mesh() == nullptr || in->mesh() == nullptr) continue;
    MF_USER_CHECK(*out->mesh() == *in->mesh() && placementsOf(out) == placementsOf(in), ErrorKind::Placement,
                  "output {} updates input {} in place but is laid out as {} on {} where the input is {} on {}",
                  f.displayName(out), f.displayName(in), placementsToString(placementsOf(out)),
                  out->mesh()->toString(), placementsToString(placementsOf(in)), in->mesh()->toString());
  }
}

void verify(const Fusion& f, const VerifyOptions& o) {
  std::set<const Val*> defined(f.inputs().begin(), f.inputs().end());
  for (const TensorView* in : f.inputs()) {
    MF_CHECK(in->definition() == nullptr, "input {} has a definition", f.displayName(in));
    verifyTensor(f, in, o);
  }
  for (const Expr* e : f.exprs()) {
    for (const Val* v : e->inputs()) {
      if (v == nullptr || v->valKind() == ValKind::Scalar) continue;
      MF_CHECK(v->fusion() == &f, "{}: an operand belongs to another fusion", e->output()->describe());
      MF_CHECK(defined.count(v), "{}: uses {} before its definition", e->output()->describe(), f.displayName(v));
    }
    for (const TensorView* out : e->outputs()) {
      MF_CHECK(out->definition() == e, "{}'s output {} has another definition", e->name(), f.displayName(out));
      MF_CHECK(defined.insert(out).second, "{} is defined twice", f.displayName(out));
      verifyTensor(f, out, o);
    }
    verifyExprType(f, e);
  }
  for (const TensorView* out : f.outputs())
    MF_CHECK(defined.count(out), "output {} is never defined", f.displayName(out));
  verifyAliases(f);
}

}  // namespace meshfuse
