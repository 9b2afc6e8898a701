// Reverse-mode autodiff through the C++ API: an MLP with a mean-squared loss, differentiated with
// respect to its weights, and the derived gradients checked against finite differences.
//   build/tests/autodiff_mlp_example
// differentiate() returns two ordinary fusions: the forward, extended with what backward needs,
// and the backward (saved tensors + a seed in, one gradient per weight out). Here they run on the
// reference executor; MultiDeviceExecutor runs them sharded like any fusion (docs/training.md).
#include <cstdio>
#include <iostream>

#include "meshfuse/autodiff.h"
#include "meshfuse/grad_check.h"
#include "meshfuse/ir/printer.h"
#include "meshfuse/ops.h"

using namespace meshfuse;

int main() {
  try {
    Fusion mlp;
    TensorView* x = mlp.defineTensor({Extent::symbolic("t"), 8}, DataType::Float, "x");
    TensorView* target = mlp.defineTensor({Extent::symbolic("t"), 8}, DataType::Float, "target");
    TensorView* w1 = mlp.defineTensor({16, 8}, DataType::Float, "w1");
    TensorView* b1 = mlp.defineTensor({16}, DataType::Float, "b1");
    TensorView* w2 = mlp.defineTensor({8, 16}, DataType::Float, "w2");
    TensorView* h = ops::gelu(ops::linear(x, w1, b1), "tanh");
    TensorView* err = ops::sub(ops::linear(h, w2), target);
    TensorView* loss = ops::mean(ops::mul(err, err), {0, 1});  // a scalar: its seed is 1
    mlp.rename(loss, "loss");
    mlp.addOutput(loss);

    Gradients g = differentiate(mlp, /*outputs=*/{0}, /*wrt=*/{2, 3, 4});
    std::cout << describeSaves(g) << printFusion(*g.backward);

    // Derived gradients vs central finite differences, both in f64 on the reference executor.
    GradCheckResult r = gradCheck(mlp, {0}, {2, 3, 4}, randomInputs(mlp, {{"t", 4}}, /*seed=*/0));
    for (const auto& in : r.inputs)
      std::printf("d loss / d %s: worst relative error %.2g %s\n", in.name.c_str(), in.rel_err, in.pass ? "ok" : "FAILED");
    return r.pass ? 0 : 1;
  } catch (const UserError& e) {
    std::cerr << errorKindName(e.kind()) << ": " << e.message() << "\n";
    return 1;
  }
}
