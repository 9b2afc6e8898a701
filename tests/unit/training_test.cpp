// In-place updates (Fusion::aliasOutputToInput), the optimizer fusions against hand-computed
// torch.optim formulas, and TrainingExecutor against a hand-computed gradient descent.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "meshfuse/executor.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/ir/printer.h"
#include "meshfuse/ops.h"
#include "meshfuse/optimizer.h"
#include "meshfuse/training_executor.h"
#include "test_helpers.h"
#include "runtime/backend.h"
#include "lower/host_ir.h"

namespace meshfuse {
namespace {

using testing_helpers::userErrorMessage;

// m2 = m * 0.5 + g (updates m in place) and y = m2 * g (reads the new m, through m2), or, with
// `read_old`, y = m2 * m (also reads the old m, in the kernel that overwrites it).
std::unique_ptr<Fusion> momentumLike(bool read_old = false) {
  auto f = std::make_unique<Fusion>();
  TensorView* m = f->defineTensor({4, 8}, DataType::Float, "m");
  TensorView* g = f->defineTensor({4, 8}, DataType::Float, "g");
  TensorView* m2 = ops::add(ops::mul(m, 0.5), g);
  f->rename(m2, "m2");
  f->addOutput(m2);
  f->addOutput(read_old ? ops::mul(m2, m) : ops::mul(m2, g));
  return f;
}

TEST(InPlace, AliasedOutputIsWrittenIntoTheInputBuffer) {
  std::unique_ptr<Fusion> f = momentumLike();
  f->aliasOutputToInput(0, 0);
  std::unique_ptr<Communicator> comm = makeSelfCommunicator();
  Tensor m = Tensor::random(DataType::Float, {4, 8}, 1), g = Tensor::random(DataType::Float, {4, 8}, 2);
  Tensor m0 = m.clone();
  DeviceMesh one({0});
  std::vector<ShardedTensor> in = {{m, one, {Placement::replicate()}}, {g, one, {Placement::replicate()}}};
  MultiDeviceExecutor exec(std::move(f), *comm);
  int64_t aliased_peak = peakMemoryBytes(exec.programFor(in), {});
  std::vector<ShardedTensor> out = exec.run(in);
  EXPECT_EQ(out[0].local.data(), m.data());  // the same buffer: no copy, no allocation
  for (int64_t i = 0; i < 32; ++i) {
    EXPECT_FLOAT_EQ(m.get(i), static_cast<float>(m0.get(i) * 0.5 + g.get(i)));
    EXPECT_FLOAT_EQ(out[1].local.get(i), static_cast<float>(m.get(i) * g.get(i)));
  }
  MultiDeviceExecutor plain(momentumLike(), *comm);
  int64_t plain_peak = peakMemoryBytes(plain.programFor(in), {});
  EXPECT_EQ(plain_peak - aliased_peak, 4 * 8 * 4);  // the aliased output costs nothing
}

// A CPU backend whose memory counts as a device's: inputs are uploaded (copied) and outputs
// downloaded, as on a GPU.
class CopyingDeviceBackend final : public Backend {
 public:
  std::string name() const override { return "copying device"; }
  Device device() const override { return Device::Cuda; }
  Tensor allocate(DataType dtype, const std::vector<int64_t>& shape) override { return asDevice(Tensor(dtype, shape)); }
  void runSegment(const Segment& seg, const std::vector<const Tensor*>& inputs, const std::vector<Tensor*>& outputs,
                  const ShapeFn& shape_of) override {
    inner_->runSegment(seg, inputs, outputs, shape_of);
  }
  void copy(Tensor& dst, const Tensor& src) override { inner_->copy(dst, src); }
  void accumulate(Tensor& dst, const Tensor& src) override { inner_->accumulate(dst, src); }
  Tensor upload(const Tensor& t) override { return t.device() == Device::Cuda ? t : asDevice(t.clone()); }
  Tensor download(const Tensor& t) override {
    Tensor host = Tensor::empty(t.dtype(), t.shape());
    std::memcpy(host.data(), t.data(), t.nbytes());
    return host;
  }
  Streams& streams() override { return inner_->streams(); }

 private:
  static Tensor asDevice(Tensor host) {
    return Tensor::wrap(host.data(), host.dtype(), host.shape(), std::make_shared<Tensor>(host), Device::Cuda);
  }
  std::unique_ptr<Backend> inner_ = makeCpuBackend();
};

TEST(InPlace, AnUploadedInputGetsItsNewValuesBack) {
  std::unique_ptr<Fusion> f = momentumLike();
  f->aliasOutputToInput(0, 0);
  std::unique_ptr<Communicator> comm = makeSelfCommunicator();
  Tensor m = Tensor::random(DataType::Float, {4, 8}, 1), g = Tensor::random(DataType::Float, {4, 8}, 2);
  Tensor m0 = m.clone();
  MultiDeviceExecutor exec(std::move(f), *comm, std::make_unique<CopyingDeviceBackend>());
  exec.run({{m, DeviceMesh({0}), {Placement::replicate()}}, {g, DeviceMesh({0}), {Placement::replicate()}}});
  for (int64_t i = 0; i < 32; ++i) EXPECT_FLOAT_EQ(m.get(i), static_cast<float>(m0.get(i) * 0.5 + g.get(i)));
}

TEST(InPlace, AliasRoundTripsThroughText) {
  std::unique_ptr<Fusion> f = momentumLike();
  f->aliasOutputToInput(0, 0);
  std::string text = printFusion(*f);
  EXPECT_NE(text.find("  alias %m2 into %m\n"), std::string::npos) << text;
  EXPECT_EQ(printFusion(*parseFusion(text)), text);
}

TEST(InPlace, AliasErrors) {
  std::unique_ptr<Fusion> f = momentumLike();
  TensorView* i = f->defineTensor({4, 8}, DataType::BFloat16, "h");
  (void)i;
  EXPECT_EQ(userErrorMessage(ErrorKind::Dtype, [&] { f->aliasOutputToInput(0, 2); }),
            "alias: output %m2 is f32 but input %h is bf16: an in-place update keeps the dtype");
  TensorView* s = f->defineTensor({8}, DataType::Float, "s");
  (void)s;
  EXPECT_EQ(userErrorMessage(ErrorKind::Shape, [&] { f->aliasOutputToInput(0, 3); }),
            "alias: output %m2 has shape [4, 8] but input %s has shape [8]: an in-place update keeps the shape");
  f->aliasOutputToInput(0, 0);
  EXPECT_EQ(userErrorMessage(ErrorKind::Value, [&] { f->aliasOutputToInput(1, 0); }),
            "alias: input %m is already updated by output %m2");
  EXPECT_EQ(userErrorMessage(ErrorKind::Value, [&] { f->aliasOutputToInput(5, 0); }),
            "alias: output index 5 is out of range (the fusion has 2 outputs)");
}

TEST(InPlace, AValueReadingTheOldContentsAfterTheUpdateIsRefused) {
  std::unique_ptr<Fusion> f = momentumLike(/*read_old=*/true);
  f->aliasOutputToInput(0, 0);
  std::unique_ptr<Communicator> comm = makeSelfCommunicator();
  MultiDeviceExecutor exec(std::move(f), *comm);
  std::string msg = userErrorMessage(ErrorKind::Unsupported, [&] {
    exec.run({{Tensor::random(DataType::Float, {4, 8}, 0), DeviceMesh({0}), {Placement::replicate()}},
              {Tensor::random(DataType::Float, {4, 8}, 1), DeviceMesh({0}), {Placement::replicate()}}});
  });
  EXPECT_EQ(msg,
            "output %m2 cannot update input %m in place: the kernel also computes %1 = mul(%m2, %m) from the "
            "input's old contents, after they may be overwritten");
}

TEST(InPlace, AReductionReadingTheUpdatedInputIsRefused) {
  auto f = std::make_unique<Fusion>();
  TensorView* m = f->defineTensor({4, 8}, DataType::Float, "m");
  TensorView* m2 = ops::sub(m, ops::mean(m, {0, 1}, /*keepdim=*/true));
  f->addOutput(m2);
  f->aliasOutputToInput(0, 0);
  std::unique_ptr<Communicator> comm = makeSelfCommunicator();
  MultiDeviceExecutor exec(std::move(f), *comm);
  std::string msg = userErrorMessage(ErrorKind::Unsupported, [&] {
    exec.run({{Tensor::random(DataType::Float, {4, 8}, 0), DeviceMesh({0}), {Placement::replicate()}}});
  });
  EXPECT_NE(msg.find("cannot update input %m in place"), std::string::npos) << msg;
}

// Runs one optimizer step on the given parameter/grad/state values (f32) and returns the
// updated inputs, checking that each was updated in its own buffer.
std::vector<Tensor> runStep(const OptimizerConfig& c, int64_t step, std::vector<Tensor> tensors) {
  OptimizerStep s = buildOptimizerStep(c, {{{static_cast<int64_t>(tensors[0].numel())}, DataType::Float}});
  std::unique_ptr<Communicator> comm = makeSelfCommunicator();
  DeviceMesh one({0});
  std::vector<ShardedTensor> in;
  for (const Tensor& t : tensors) in.push_back({t, one, {Placement::replicate()}});
  for (double v : optimizerScalars(c, step))
    in.push_back({Tensor::fromValues(DataType::Float, {}, {v}), one, {Placement::replicate()}});
  MultiDeviceExecutor exec(std::move(s.fusion), *comm);
  std::vector<ShardedTensor> out = exec.run(in);
  EXPECT_EQ(out[0].local.data(), tensors[0].data());
  return tensors;
}

TEST(Optimizers, SgdNesterovWithWeightDecayMatchesTorchFormulas) {
  SgdOptions o{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true};
  Tensor p = Tensor::fromValues(DataType::Float, {3}, {1.0, -2.0, 0.5});
  Tensor buf(DataType::Float, {3});
  std::vector<double> ref_p = {1.0, -2.0, 0.5}, ref_b = {0, 0, 0};
  for (int64_t t = 1; t <= 3; ++t) {
    Tensor g = Tensor::fromValues(DataType::Float, {3}, {0.3 * t, -0.1, 0.2 / t});
    runStep(o, t, {p, g, buf});
    for (int i = 0; i < 3; ++i) {  // torch.optim.SGD: d = g + wd p; b = mu b + d; d += mu b; p -= lr d
      double d = g.get(i) + 0.01 * ref_p[i];
      ref_b[i] = t == 1 ? d : 0.9 * ref_b[i] + d;
      ref_p[i] -= 0.1 * (d + 0.9 * ref_b[i]);
      EXPECT_NEAR(p.get(i), ref_p[i], 1e-6) << "step " << t;
      EXPECT_NEAR(buf.get(i), ref_b[i], 1e-6) << "step " << t;
    }
  }
}

TEST(Optimizers, AdamWMatchesTorchFormulas) {
  AdamWOptions o{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 0.0, .weight_decay = 0.1};
  Tensor p = Tensor::fromValues(DataType::Float, {2}, {0.5, -1.5});
  Tensor m(DataType::Float, {2}), v(DataType::Float, {2});
  std::vector<double> rp = {0.5, -1.5}, rm = {0, 0}, rv = {0, 0};
  for (int64_t t = 1; t <= 3; ++t) {
    Tensor g = Tensor::fromValues(DataType::Float, {2}, {0.2 * t, -0.4});
    runStep(o, t, {p, g, m, v});
    for (int i = 0; i < 2; ++i) {  // torch.optim.AdamW (decoupled decay, bias-corrected)
      rp[i] *= 1 - 0.01 * 0.1;
      rm[i] = 0.8 * rm[i] + 0.2 * g.get(i);
      rv[i] = 0.95 * rv[i] + 0.05 * g.get(i) * g.get(i);
      double mhat = rm[i] / (1 - std::pow(0.8, t)), vhat = rv[i] / (1 - std::pow(0.95, t));
      rp[i] -= 0.01 * mhat / std::sqrt(vhat);
      EXPECT_NEAR(p.get(i), rp[i], 1e-6) << "step " << t;
      EXPECT_NEAR(m.get(i), rm[i], 1e-6);
      EXPECT_NEAR(v.get(i), rv[i], 1e-6);
    }
  }
}

TEST(Optimizers, IntegerParameterIsRefused) {
  EXPECT_EQ(userErrorMessage(ErrorKind::Dtype,
                             [] {
                               buildOptimizerStep(SgdOptions{}, {{{4}, DataType::Float}, {{4}, DataType::Int64}});
                             }),
            "sgd: parameter 1 is i64: only floating-point tensors can be optimized");
  EXPECT_EQ(userErrorMessage(ErrorKind::Value, [] { checkOptimizerConfig(SgdOptions{.nesterov = true}); }),
            "SGD: nesterov momentum needs momentum > 0");
}

// loss = mean((x w^T - y)^2) over [n, k] x, [o, k] w.
std::unique_ptr<Fusion> regression(int64_t n, int64_t k, int64_t o) {
  auto f = std::make_unique<Fusion>();
  TensorView* x = f->defineTensor({n, k}, DataType::Float, "x");
  TensorView* y = f->defineTensor({n, o}, DataType::Float, "y");
  TensorView* w = f->defineTensor({o, k}, DataType::Float, "w");
  TensorView* e = ops::sub(ops::linear(x, w), y);
  f->addOutput(ops::mean(ops::mul(e, e), {0, 1}));
  return f;
}

TEST(TrainingExecutor, SgdStepsMatchHandComputedGradientDescent) {
  const int64_t n = 6, k = 3, o = 2;
  std::unique_ptr<Communicator> comm = makeSelfCommunicator();
  TrainingExecutor trainer(regression(n, k, o), 0, {2}, SgdOptions{.lr = 0.1, .momentum = 0.5}, *comm);
  Tensor x = Tensor::random(DataType::Float, {n, k}, 1), y = Tensor::random(DataType::Float, {n, o}, 2);
  Tensor w = Tensor::random(DataType::Float, {o, k}, 3);
  std::vector<double> rw = w.toValues(), buf(o * k, 0.0);
  void* address = w.data();
  for (int step = 0; step < 4; ++step) {
    std::vector<double> err(n * o), grad(o * k, 0.0);
    double loss = 0;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < o; ++c) {
        double z = -y.get(r * o + c);
        for (int64_t j = 0; j < k; ++j) z += x.get(r * k + j) * rw[c * k + j];
        err[r * o + c] = z;
        loss += z * z / (n * o);
      }
    for (int64_t c = 0; c < o; ++c)
      for (int64_t j = 0; j < k; ++j)
        for (int64_t r = 0; r < n; ++r) grad[c * k + j] += 2.0 / (n * o) * err[r * o + c] * x.get(r * k + j);
    double got = trainer.step({{x, {}, {}}, {y, {}, {}}, {w, {}, {}}});
    EXPECT_NEAR(got, loss, 1e-5) << "step " << step;
    for (int64_t i = 0; i < o * k; ++i) {
      buf[i] = 0.5 * buf[i] + grad[i];
      rw[i] -= 0.1 * buf[i];
      EXPECT_NEAR(w.get(i), rw[i], 1e-5) << "step " << step << " element " << i;
    }
  }
  EXPECT_EQ(w.data(), address);  // updated in place
  EXPECT_EQ(trainer.compilations(), 1);
  EXPECT_EQ(trainer.steps(), 4);
}

TEST(TrainingExecutor, Bf16ParameterKeepsAnF32Master) {
  std::unique_ptr<Communicator> comm = makeSelfCommunicator();
  auto f = std::make_unique<Fusion>();
  TensorView* w = f->defineTensor({4}, DataType::BFloat16, "w");
  TensorView* wf = ops::cast(w, DataType::Float);
  f->addOutput(ops::sum(ops::mul(wf, wf), {0}));
  TrainingExecutor trainer(std::move(f), 0, {0}, AdamWOptions{.lr = 1e-3}, *comm);
  Tensor wt = Tensor::fromValues(DataType::BFloat16, {4}, {1.0, -1.0, 0.5, 2.0});
  for (int s = 0; s < 3; ++s) trainer.step({{wt, {}, {}}});
  const ParameterState& st = trainer.state(0);
  ASSERT_EQ(st.names, (std::vector<std::string>{"master", "exp_avg", "exp_avg_sq"}));
  // Three AdamW steps of 1e-3 (sign of the gradient) are below bf16's resolution at 1.0: the
  // master moved, the bf16 parameter is the master rounded.
  EXPECT_NEAR(st.tensors[0].local.get(0), 1.0 * std::pow(1 - 1e-5, 3) - 3e-3, 1e-5);
  for (int64_t i = 0; i < 4; ++i) {
    Tensor rounded = Tensor::fromValues(DataType::BFloat16, {1}, {st.tensors[0].local.get(i)});
    EXPECT_EQ(wt.get(i), rounded.get(0));
  }
}

TEST(TrainingExecutor, BadParametersAndLossAreTypedErrors) {
  std::unique_ptr<Communicator> comm = makeSelfCommunicator();
  EXPECT_EQ(
      userErrorMessage(ErrorKind::Value, [&] { TrainingExecutor(regression(2, 2, 2), 0, {3}, SgdOptions{}, *comm); }),
      "TrainingExecutor: parameter 3 is not an input of the definition (it has 3 inputs)");
  auto f = std::make_unique<Fusion>();
  TensorView* i = f->defineTensor({4}, DataType::Int64, "ids");
  TensorView* w = f->defineTensor({4}, DataType::Float, "w");
  f->addOutput(ops::sum(ops::mul(w, ops::cast(i, DataType::Float)), {0}));
  f->addOutput(ops::mul(w, w));
  EXPECT_EQ(userErrorMessage(ErrorKind::Dtype, [&] { TrainingExecutor(f->clone(), 0, {0}, SgdOptions{}, *comm); }),
            "TrainingExecutor: parameter 0 (%ids) is i64: only floating-point inputs can be trained");
  EXPECT_EQ(userErrorMessage(ErrorKind::Shape, [&] { TrainingExecutor(f->clone(), 1, {1}, SgdOptions{}, *comm); }),
            "TrainingExecutor: the loss %3 has rank 1 but must be a scalar (reduce it with sum or mean)");
}

}  // namespace
}  // namespace meshfuse
