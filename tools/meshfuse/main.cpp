// The `meshfuse` command-line tool: print, transform, dump and run .mf fusions.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/ir/printer.h"
#include "meshfuse/ir/verifier.h"
#include "meshfuse/npy.h"
#include "meshfuse/pipeline.h"
#include "meshfuse/reference.h"

namespace mf = meshfuse;

namespace {

std::string readText(const std::string& path) {
  if (path == "-") return std::string(std::istreambuf_iterator<char>(std::cin), {});
  std::ifstream in(path);
  MF_USER_CHECK(in.good(), mf::ErrorKind::Runtime, "cannot open {}", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::unique_ptr<mf::Fusion> load(const std::string& path) {
  auto fusion = mf::parseFusion(readText(path), path == "-" ? "<stdin>" : path);
  mf::verify(*fusion);
  return fusion;
}

// Random (seeded) or .npy inputs for `fusion`; unbound symbolic sizes come from --size.
std::vector<mf::Tensor> makeInputs(const mf::Fusion& f, const std::vector<std::string>& npy_files,
                                   const std::map<std::string, int64_t>& sizes, uint64_t seed) {
  std::vector<mf::Tensor> inputs;
  if (!npy_files.empty()) {
    MF_USER_CHECK(npy_files.size() == f.inputs().size(), mf::ErrorKind::Value,
                  "--inputs: the fusion takes {} inputs but {} files were given", f.inputs().size(), npy_files.size());
    for (size_t i = 0; i < npy_files.size(); ++i) {
      mf::Tensor t = mf::readNpy(npy_files[i]);
      mf::DataType want = f.inputs()[i]->dtype();
      if (t.dtype() != want && mf::isFloatingPoint(t.dtype()) && mf::isFloatingPoint(want))
        t = mf::Tensor::fromValues(want, t.shape(), t.toValues());
      inputs.push_back(std::move(t));
    }
    return inputs;
  }
  mf::SymbolBindings bindings(sizes.begin(), sizes.end());
  for (size_t i = 0; i < f.inputs().size(); ++i) {
    const mf::TensorView* tv = f.inputs()[i];
    std::vector<int64_t> shape;
    for (const mf::Extent& e : tv->shape()) {
      if (!e.isStatic() && !bindings.count(e.symbol())) {
        bindings[e.symbol()] = 8;
        std::cerr << fmt::format("note: size ?{} is not given; using 8 (set it with --size {}=N)\n", e.symbol(), e.symbol());
      }
      shape.push_back(e.evaluate(bindings));
    }
    inputs.push_back(mf::Tensor::random(tv->dtype(), shape, seed + i));
  }
  return inputs;
}

std::map<std::string, int64_t> parseSizes(const std::vector<std::string>& args) {
  std::map<std::string, int64_t> sizes;
  for (const std::string& a : args) {
    size_t eq = a.find('=');
    MF_USER_CHECK(eq != std::string::npos && eq > 0, mf::ErrorKind::Value, "--size {}: expected NAME=N, e.g. t=128", a);
    try {
      sizes[a.substr(0, eq)] = std::stoll(a.substr(eq + 1));
    } catch (const std::exception&) {
      mf::userError(mf::ErrorKind::Value, "--size {}: '{}' is not an integer", a, a.substr(eq + 1));
    }
  }
  return sizes;
}

std::string summary(const mf::Tensor& t) {
  std::vector<double> v = t.toValues();
  double sum = 0, sq = 0, lo = INFINITY, hi = -INFINITY;
  for (double x : v) sum += x, sq += x * x, lo = std::min(lo, x), hi = std::max(hi, x);
  double n = std::max<double>(1, static_cast<double>(v.size()));
  double mean = sum / n;
  return fmt::format("mean {:.6g}  std {:.6g}  min {:.6g}  max {:.6g}  sum {:.8g}", mean,
                     std::sqrt(std::max(0.0, sq / n - mean * mean)), lo, hi, sum);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"meshfuse: a sharding-aware tensor compiler.\n"
               "Reads single-device fusions written as .mf text (see docs/text-format.md)."};
  app.set_version_flag("--version", "meshfuse 0.1.0");
  app.require_subcommand(1);

  std::string file;
  auto* print = app.add_subcommand("print", "Parse and verify FILE.mf, then print it in canonical form");
  print->add_option("FILE", file, "the .mf file ('-' for standard input)")->required();

  std::vector<std::string> passes;
  bool dump_each = false, timing = false;
  auto* opt = app.add_subcommand("opt", "Run fusion passes on FILE.mf and print the result");
  opt->add_option("FILE", file, "the .mf file ('-' for standard input)")->required();
  std::string pass_help = "passes to run, in order (comma-separated):";
  for (const mf::FusionPass& p : mf::fusionPasses()) pass_help += "\n  " + p.name + ": " + p.description;
  opt->add_option("--pass", passes, pass_help)->delimiter(',')->required();
  opt->add_flag("--dump-after-each", dump_each, "print the IR after every pass");
  opt->add_flag("--timing", timing, "print each pass's wall time to stderr");

  uint64_t seed = 0;
  std::vector<std::string> size_args;
  std::vector<std::string> npy_inputs;
  std::string save_dir;
  auto* run = app.add_subcommand("run", "Execute FILE.mf on one device (reference executor) with seeded random inputs");
  run->add_option("FILE", file, "the .mf file ('-' for standard input)")->required();
  run->add_option("--seed", seed, "seed of the random inputs (input i uses seed+i)")->capture_default_str();
  run->add_option("--size", size_args, "bind a symbolic size, e.g. --size t=128 (repeatable)");
  run->add_option("--inputs", npy_inputs, "read the inputs from .npy files instead (comma-separated)")->delimiter(',');
  run->add_option("--save-outputs", save_dir, "write each output to DIR/output<i>.npy");

  CLI11_PARSE(app, argc, argv);

  std::unique_ptr<mf::Fusion> fusion;
  try {
    fusion = load(file);
    if (*print) {
      std::cout << mf::printFusion(*fusion);
    } else if (*opt) {
      mf::PipelineOptions o;
      if (dump_each) o.dump = &std::cout;
      if (timing) o.timing = &std::cerr;
      mf::runPasses(*fusion, passes, o);
      if (!dump_each) std::cout << mf::printFusion(*fusion);
    } else if (*run) {
      std::vector<mf::Tensor> inputs = makeInputs(*fusion, npy_inputs, parseSizes(size_args), seed);
      std::vector<mf::Tensor> outputs = mf::evaluateReference(*fusion, inputs);
      if (!save_dir.empty()) std::filesystem::create_directories(save_dir);
      for (size_t i = 0; i < outputs.size(); ++i) {
        const mf::TensorView* tv = fusion->outputs()[i];
        std::cout << fmt::format("output {} {}: {}{}  {}\n", i, fusion->displayName(tv), mf::dtypeName(tv->dtype()),
                                 outputs[i].shapeString(), summary(outputs[i]));
        if (!save_dir.empty()) mf::writeNpy(fmt::format("{}/output{}.npy", save_dir, i), outputs[i]);
      }
    }
  } catch (const mf::UserError& e) {
    std::cerr << "meshfuse: " << mf::errorKindName(e.kind()) << ": " << e.message() << "\n";
    return 1;
  } catch (const mf::InternalError& e) {
    std::cerr << e.what() << "\n";
    if (fusion) std::cerr << "IR at the time of the error:\n" << mf::printFusion(*fusion);
    return 2;
  }
  return 0;
}
