// The C++ API end to end: the GPT-style MLP block of examples/mlp_block.mf (linear + bias ->
// gelu -> linear + bias, plus the residual), built with ops::, printed, and run on one device.
//   build/mlp_example [tokens [output.npy]]
// It prints the same text as `meshfuse print examples/mlp_block.mf` and computes the same result
// as `meshfuse run --reference examples/mlp_block.mf --size t=<tokens>` (input i is random with seed i);
// ctest's mlp_example checks both.
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "meshfuse/ir/printer.h"
#include "meshfuse/npy.h"
#include "meshfuse/ops.h"
#include "meshfuse/reference.h"

using namespace meshfuse;

int main(int argc, char** argv) {
  const int64_t hidden = 64, tokens = argc > 1 ? std::atoll(argv[1]) : 32;
  try {
    Fusion fusion;
    TensorView* inp = fusion.defineTensor({Extent::symbolic("t"), hidden}, DataType::Float, "inp");  // [t, h]
    TensorView* up_w = fusion.defineTensor({4 * hidden, hidden}, DataType::Float, "up_w");
    TensorView* up_b = fusion.defineTensor({4 * hidden}, DataType::Float, "up_b");
    TensorView* down_w = fusion.defineTensor({hidden, 4 * hidden}, DataType::Float, "down_w");
    TensorView* down_b = fusion.defineTensor({hidden}, DataType::Float, "down_b");
    TensorView* up = ops::linear(inp, up_w, up_b);
    TensorView* act = ops::gelu(up, "tanh");
    TensorView* down = ops::linear(act, down_w, down_b);
    TensorView* out = ops::add(down, inp);
    // The names the .mf file gives them (without names they print as %0, %1, ...).
    for (auto [tv, name] : {std::pair{up, "up"}, {act, "act"}, {down, "down"}, {out, "out"}}) fusion.rename(tv, name);
    fusion.addOutput(out);
    std::cout << printFusion(fusion);

    std::vector<Tensor> inputs;
    for (size_t i = 0; i < fusion.inputs().size(); ++i) {
      const TensorView* tv = fusion.inputs()[i];
      inputs.push_back(Tensor::random(tv->dtype(), tv->evaluateShape({{"t", tokens}}), i));
    }
    Tensor result = evaluateReference(fusion, inputs).at(0);
    double sum = 0;
    for (double v : result.toValues()) sum += v;
    std::printf("output %%out: f32%s  sum %.6f\n", result.shapeString().c_str(), sum);
    if (argc > 2) writeNpy(argv[2], result);
  } catch (const UserError& e) {
    std::cerr << errorKindName(e.kind()) << ": " << e.message() << "\n";
    return 1;
  }
  return 0;
}
