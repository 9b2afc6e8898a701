// The reference backend: each segment's ops run one at a time through the reference
// executor's loops (GEMMs through cblas_dgemm). Slow, obviously correct: the oracle.
#include <map>

#include "meshfuse/ir/fusion.h"
#include "meshfuse/reference.h"
#include "driver/backends.h"
#include "runtime/backend.h"

namespace meshfuse {
namespace {

class ReferenceBackend final : public Backend {
 public:
  std::string name() const override { return "reference"; }
  Tensor allocate(DataType dtype, const std::vector<int64_t>& shape) override { return Tensor::empty(dtype, shape); }

  void runSegment(const Segment& seg, const std::vector<const Tensor*>& inputs, const std::vector<Tensor*>& outputs,
                  const ShapeFn& shape_of) override {
    std::map<const TensorView*, Tensor> values;
    for (size_t i = 0; i < inputs.size(); ++i) values[seg.inputs[i]] = *inputs[i];
    for (const Expr* e : seg.exprs) {
      std::vector<const Tensor*> operands;
      for (const Val* v : e->inputs())
        operands.push_back(v != nullptr && v->valKind() == ValKind::TensorView
                               ? &values.at(static_cast<const TensorView*>(v))
                               : nullptr);
      values[e->output()] = evaluateExpr(e, operands, shape_of(e->output()));
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      const Tensor& v = values.at(seg.outputs[i]);
      MF_CHECK(v.shape() == outputs[i]->shape(), "segment output {} has shape {} but its buffer {}",
               i, v.shapeString(), outputs[i]->shapeString());
      std::memcpy(outputs[i]->data(), v.data(), v.nbytes());
    }
  }
};

}  // namespace

std::unique_ptr<Backend> makeReferenceBackend() { return std::make_unique<ReferenceBackend>(); }

}  // namespace meshfuse
