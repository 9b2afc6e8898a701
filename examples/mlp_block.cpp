// The C++ API end to end: define a GPT-style MLP block (linear -> gelu -> linear + residual),
// print its IR, run it on one device and print a summary of the result.
//   build/mlp_example [tokens]
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "meshfuse/ir/printer.h"
#include "meshfuse/ops.h"
#include "meshfuse/reference.h"

using namespace meshfuse;

int main(int argc, char** argv) {
  const int64_t hidden = 64, tokens = argc > 1 ? std::atoll(argv[1]) : 32;
  try {
    Fusion fusion;
    TensorView* inp = fusion.defineTensor({-1, hidden}, DataType::Float, "inp");  // [t, h], t symbolic
    TensorView* up_w = fusion.defineTensor({4 * hidden, hidden}, DataType::Float, "up_w");
    TensorView* down_w = fusion.defineTensor({hidden, 4 * hidden}, DataType::Float, "down_w");
    TensorView* up = ops::gelu(ops::linear(inp, up_w), "tanh");
    TensorView* out = ops::add(ops::linear(up, down_w), inp);
    fusion.addOutput(out);
    std::cout << printFusion(fusion);

    std::vector<Tensor> inputs = {Tensor::random(DataType::Float, {tokens, hidden}, 1),
                                  Tensor::random(DataType::Float, {4 * hidden, hidden}, 2),
                                  Tensor::random(DataType::Float, {hidden, 4 * hidden}, 3)};
    Tensor result = evaluateReference(fusion, inputs).at(0);
    double sum = 0;
    for (double v : result.toValues()) sum += v;
    std::printf("output %s  sum %.6f\n", result.shapeString().c_str(), sum);
  } catch (const UserError& e) {
    std::cerr << errorKindName(e.kind()) << ": " << e.message() << "\n";
    return 1;
  }
  return 0;
}
