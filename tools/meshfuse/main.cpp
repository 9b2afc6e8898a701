// The `meshfuse` command-line tool: print, transform, dump and run .mf fusions.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <iostream>
#include <new>
#include <sstream>

#include "autodiff_commands.h"
#include "cli_common.h"
#include "cli_options.h"
#include "opt_host.h"
#include "train_command.h"
#include "meshfuse/executor.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/ir/printer.h"
#include "meshfuse/ir/verifier.h"
#include "meshfuse/npy.h"
#include "codegen/kernel_dump.h"
#include "lower/pipeline.h"
#include "meshfuse/reference.h"
#include "runtime/host_ir_evaluator.h"

namespace mf = meshfuse;
namespace cli = meshfuse::cli;

namespace {

// The message of an exception that is neither a UserError nor an InternalError (the file system,
// the allocator, a library): reported with a non-zero exit status, never an abort.
std::string otherError(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) return "meshfuse: error: out of memory";
  return fmt::format("meshfuse: error: {}", e.what());
}

// Single-device execution with the reference executor.
void runReference(const mf::Fusion& fusion, const cli::ShardedRunOptions& o, const std::string& save_dir) {
  mf::SymbolBindings sizes = cli::completeBindings(fusion, o.sizes, /*warn=*/true);
  std::vector<mf::Tensor> inputs = cli::makeInputs(fusion, o.npy_inputs, sizes, o.seed);
  std::vector<mf::Tensor> outputs = mf::evaluateReference(fusion, inputs);
  if (!save_dir.empty()) cli::createOutputDirectory(save_dir);
  for (size_t i = 0; i < outputs.size(); ++i) {
    const mf::TensorView* tv = fusion.outputs()[i];
    std::cout << fmt::format("output {} {}: {}{}  {}\n", i, fusion.displayName(tv), mf::dtypeName(tv->dtype()),
                             outputs[i].shapeString(), cli::summary(outputs[i]));
    if (!save_dir.empty()) mf::writeNpy(fmt::format("{}/output{}.npy", save_dir, i), outputs[i]);
  }
}

// `run --timing`: this rank's program compiled (passes timed) and run twice through the CPU
// backend, the first run compiling the kernels; rank 0 prints the report.
void reportTiming(const mf::Fusion& definition, const cli::ShardedRunOptions& o, mf::PipelineOptions pipeline) {
  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  std::unique_ptr<mf::Communicator> comm = mf::makeDefaultCommunicator();
  std::ostringstream passes;
  pipeline.timing = &passes;
  std::unique_ptr<mf::Backend> owned = mf::makeCpuBackend();
  mf::Backend* backend = owned.get();
  mf::MultiDeviceExecutor exec(definition.clone(), *comm, std::move(owned),
                               {.pipeline = pipeline, .trace = true});
  // (A single-device fusion compiles to the program of a one-device mesh.)
  std::vector<mf::ShardedTensor> inputs = mf::inputLayouts(definition);
  auto t0 = Clock::now();
  const mf::CompiledProgram& compiled = exec.plan(inputs);
  auto t1 = Clock::now();
  mf::SymbolBindings sizes = cli::completeBindings(definition, o.sizes, /*warn=*/false);
  std::vector<mf::Tensor> full = cli::makeInputs(definition, o.npy_inputs, sizes, o.seed);
  for (size_t i = 0; i < full.size(); ++i) {
    const mf::TensorView* tv = compiled.fusion->inputs()[i];
    inputs[i].global_shape = full[i].shape();
    if (tv->mesh() == nullptr || tv->mesh()->contains(comm->rank()))
      inputs[i].local = mf::shardForRank(tv, full[i], comm->rank());
  }
  auto t2 = Clock::now();
  exec.run(inputs);
  auto t3 = Clock::now();
  const mf::Backend::Stats cold = backend->stats();
  exec.run(inputs);
  auto t4 = Clock::now();
  const mf::Backend::Stats warm = backend->stats();
  if (comm->rank() != 0) return;
  std::cout << "== timing (rank 0, " << backend->name() << " backend)\n" << passes.str();
  std::cout << fmt::format("compile (passes, segmentation, host IR) {:>10.3f} ms\n", ms(t0, t1));
  std::cout << fmt::format("run 1 (cold)                          {:>10.3f} ms  ({} kernels compiled in {:.3f} ms)\n",
                           ms(t2, t3), cold.kernels_compiled, cold.compile_seconds * 1e3);
  std::cout << fmt::format("run 2 (cached)                        {:>10.3f} ms  ({} kernels compiled)\n", ms(t3, t4),
                           warm.kernels_compiled - cold.kernels_compiled);
  for (const mf::TraceEvent& e : exec.lastTrace())
    if (e.kind == mf::TaskKind::Compute || e.kind == mf::TaskKind::Communication)
      std::cout << fmt::format("  {:<60} {:>10.3f} ms\n", e.name, (e.end_us - e.begin_us) / 1e3);
}

// Every subcommand and the options it fills (CLI11 writes into these fields while parsing).
struct Cli {
  CLI::App app{
      "meshfuse: a sharding-aware tensor compiler.\n"
      "Reads single-device fusions written as .mf text (docs/text-format.md) whose inputs may carry\n"
      "placements on a device mesh, derives the multi-device program and runs it (under mpirun for\n"
      "several ranks)."};
  CLI::App *print = nullptr, *opt = nullptr, *opt_host = nullptr, *dump = nullptr, *gradcheck = nullptr,
           *train = nullptr, *coll = nullptr, *run = nullptr;
  std::string file;
  std::vector<std::string> size_args;
  bool split = false;
  // opt
  std::vector<std::string> passes;
  bool dump_each = false, timing = false;
  cli::OptHostOptions opt_host_opts;
  // dump
  std::string stage = "hostir";
  int64_t dump_rank = 0;
  mf::cli::AutodiffCliOptions ad_opts;
  // grad-check
  mf::GradCheckOptions gc_opts;
  double gc_low = -1, gc_high = 1;
  uint64_t gc_seed = 0;
  // train
  mf::cli::TrainCliOptions train_opts;
  // collectives
  int64_t report_rank = -1;
  bool verify_collectives = false;
  // run
  cli::ShardedRunOptions run_opts;
  std::string save_dir;
  bool reference = false, run_timing = false;
  // the compile options of every subcommand that compiles (meshfuse/options.h's table)
  mf::PipelineOptions pipeline;

  void addFile(CLI::App* sub) { sub->add_option("FILE", file, "the .mf file ('-' for standard input)")->required(); }
  void addSizes(CLI::App* sub) {
    sub->add_option("--size", size_args, "bind a symbolic size, e.g. --size t=128 (repeatable; default 8)");
  }
  void addAutodiff(CLI::App* sub) {  // dump --stage=backward and grad-check (docs/training.md)
    sub->add_option("--wrt", ad_opts.wrt,
                    "inputs to differentiate with respect to, by name or index (comma-separated; default: every "
                    "floating-point input)")
        ->delimiter(',');
    sub->add_option("--outputs", ad_opts.outputs,
                    "outputs to differentiate, by name or index (default: every floating-point output)")
        ->delimiter(',');
    sub->add_flag("--save-all", ad_opts.save_all,
                  "save every intermediate backward reads (default: save GEMM and attention outputs, recompute "
                  "the rest in backward)");
  }
  void addPrintAndOpt();
  void addDump();
  void addGradCheck();
  void addTrain();
  void addCollectives();
  void addRun();
  // Handles one piece of the input (one case with --split-input-file). Returns the exit status,
  // and whether the command is done (run and train handle one piece only).
  std::pair<int, bool> handle(const std::string& piece);
  int dumpStage(std::unique_ptr<mf::Fusion> fusion);
};

void Cli::addPrintAndOpt() {
  print = app.add_subcommand("print", "Parse and verify FILE.mf, then print it in canonical form");
  addFile(print);
  opt = app.add_subcommand("opt", "Run fusion passes on FILE.mf and print the result");
  addFile(opt);
  std::string pass_help = "passes to run, in order (comma-separated):";
  for (const mf::FusionPass& p : mf::fusionPasses()) pass_help += "\n  " + p.name + ": " + p.description;
  opt->add_option("--pass", passes, pass_help)->delimiter(',')->required();
  opt->add_flag("--dump-after-each", dump_each,
                "print the IR after every pass, each headed by a line '# ----- IR after PASS' (so the output reads "
                "back with --split-input-file)");
  opt->add_flag("--timing", timing, "print each pass's wall time to stderr");
  opt_host = cli::addOptHost(app, opt_host_opts);
}

void Cli::addDump() {
  dump = app.add_subcommand("dump", "Compile FILE.mf and print one stage of the pipeline");
  addFile(dump);
  std::vector<std::string> stages = mf::pipelineStages();
  stages.insert(stages.end(), {"kernels", "llvm", "cuda", "backward"});
  dump->add_option("--stage", stage,
                   "fusion | propagated | decomposed | segmented | hostir (one rank's program) | kernels (kernel IR "
                   "of the rank's segments, for its local shapes) | llvm (their CPU LLVM IR, optimized) | cuda (their "
                   "CUDA C as NVRTC compiles it, with each kernel's launch geometry on an H100) | backward (the "
                   "forward fusion with what backward saves, '# -----', the backward fusion of gradients; see --wrt)")
      ->check(CLI::IsMember(stages))
      ->capture_default_str();
  addSizes(dump);
  dump->add_option("--rank", dump_rank,
                   "the rank whose host program (--stage=hostir; -1: all ranks together) or kernels (--stage=kernels, "
                   "llvm, cuda) are printed; one of the ranks of the fusion's meshes")
      ->capture_default_str();
  addAutodiff(dump);
}

void Cli::addGradCheck() {
  gradcheck = app.add_subcommand(
      "grad-check",
      "Differentiate FILE.mf (the backward fusion, run on the reference executor) and compare each gradient with\n"
      "central finite differences of the forward, both in f64 on the reference executor, for seeded random\n"
      "inputs and the scalar L = sum_i <r_i, output_i> (r_i random). Prints the worst relative error per\n"
      "--wrt input (max |derived - fd| / max(max |fd|, 1e-2)); exits 1 when one is above --tolerance");
  addFile(gradcheck);
  addSizes(gradcheck);
  addAutodiff(gradcheck);
  gradcheck->add_option("--tolerance", gc_opts.tolerance, "largest relative error that passes")->capture_default_str();
  gradcheck->add_option("--step", gc_opts.step, "finite-difference step h (times max(1, |x|))")->capture_default_str();
  gradcheck->add_option("--seed", gc_seed, "seed of the random inputs")->capture_default_str();
  gradcheck->add_option("--low", gc_low, "floating-point inputs are uniform in [low, high]")->capture_default_str();
  gradcheck->add_option("--high", gc_high, "see --low")->capture_default_str();
}

void Cli::addTrain() {
  train = app.add_subcommand(
      "train",
      "Train FILE.mf: forward, backward (autodiff) and an in-place optimizer step per step, on one fixed batch of\n"
      "seeded random data (parameters uniform in [-init-scale, init-scale), other inputs in [-1, 1)). Sharded\n"
      "over the MPI ranks by the inputs' placements (launch with mpirun -np N), else on one device. Prints the\n"
      "loss per step on rank 0 (docs/training.md)");
  addFile(train);
  addSizes(train);
  mf::cli::TrainCliOptions& t = train_opts;
  train->add_option("--steps", t.steps, "training steps")->capture_default_str();
  train->add_option("--optimizer", t.optimizer, "sgd (torch.optim.SGD) or adamw (torch.optim.AdamW)")
      ->check(CLI::IsMember({"sgd", "adamw"}))
      ->capture_default_str();
  train->add_option("--lr", t.lr, "learning rate")->capture_default_str();
  train->add_option("--momentum", t.momentum, "sgd momentum")->capture_default_str();
  train->add_option("--weight-decay", t.weight_decay, "sgd: L2 added to the gradient; adamw: decoupled")
      ->capture_default_str();
  train->add_option("--wrt", t.wrt,
                    "the parameters: inputs by name or index (comma-separated; default: every floating-point input)")
      ->delimiter(',');
  train->add_option("--loss", t.loss,
                    "the loss output, by name or index (default: the only floating-point scalar output)");
  train->add_option("--seed", t.seed, "seed of the random data and initial parameters")->capture_default_str();
  train->add_option("--init-scale", t.init_scale, "parameters start uniform in [-scale, scale)")
      ->capture_default_str();
}

void Cli::addCollectives() {
  coll = app.add_subcommand("collectives",
                            "Print each rank's collectives (kind, mesh axis, team, bytes, why) without running");
  addFile(coll);
  addSizes(coll);
  coll->add_option("--rank", report_rank, "only this rank (default: every rank of the meshes)");
  coll->add_flag("--verify", verify_collectives,
                 "also prove that every rank's program matches the others' (check-collectives: per team the same "
                 "collectives in the same order, kind, size, dtype, reduce op and root; every send has its recv; "
                 "no deadlock), as every run does before its first launch");
}

void Cli::addRun() {
  run = app.add_subcommand(
      "run",
      "Execute FILE.mf with seeded random inputs on --device: sharded over the MPI ranks when its inputs carry\n"
      "placements (launch with mpirun -np N), else on one device (the first line says which backend ran)");
  addFile(run);
  addSizes(run);
  run->add_option("--seed", run_opts.seed, "seed of the random inputs (input i uses seed+i)")->capture_default_str();
  run->add_option("--inputs", run_opts.npy_inputs, "read the full inputs from .npy files instead (comma-separated)")
      ->delimiter(',');
  run->add_option("--save-outputs", save_dir, "write each (gathered) output to DIR/output<i>.npy");
  run->add_flag("--check", run_opts.check,
                fmt::format("compare the sharded result with single-device execution (the reference executor): "
                            "element i passes when |out_i - ref_i| <= {:g} eps x (max|ref| + |ref_i|), eps the "
                            "dtype's machine epsilon (f32 2^-23, bf16 2^-7, f16 2^-10; i64/bool exact), because a "
                            "sharded program sums in another order, with an error that scales with the output's "
                            "largest values",
                            mf::kReferenceToleranceEps));
  run->add_flag("--print-hostir", run_opts.print_hostir, "print rank 0's host program before running");
  run->add_flag("--reference", reference,
                "ignore placements and --device: run on one device with the reference executor (no header line)");
  run->add_flag("--timing", run_timing,
                "then run again through the CPU backend and report (rank 0) each compile pass, kernel compilation, a "
                "cold and a cached run, and every segment's time in the cached run");
  run->add_option("--inject-failure-on-rank", run_opts.fail_on_rank,
                  "make this rank fail before running (to see that the other ranks exit instead of hanging)");
  run->add_option("--device", run_opts.device,
                  "where to run: cpu, cuda, auto (cuda when a GPU is present) or "
                  "reference (the reference executor's loops)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto", "reference"}))
      ->capture_default_str();
  run->add_option("--trace", run_opts.trace_file,
                  "write every rank's timeline (kernels, GEMMs, collectives per stream) as Chrome/Perfetto trace "
                  "JSON, and report the fraction of communication hidden behind compute; the timeline is of a warm "
                  "run (one warm-up run first, so that kernel compilation is not in it)");
}

// dump --stage=propagated|decomposed|segmented|hostir|kernels|llvm|cuda.
int Cli::dumpStage(std::unique_ptr<mf::Fusion> fusion) {
  mf::SymbolBindings sizes = cli::completeBindings(*fusion, run_opts.sizes, /*warn=*/false);
  mf::PipelineOptions o = pipeline;
  o.sizes = run_opts.sizes;  // chunk counts for the sizes given (symbolic otherwise)
  mf::CompiledProgram p = mf::compile(std::move(fusion), o, /*keep_stages=*/true);
  cli::checkRankOption(p, dump_rank, /*all_allowed=*/stage == "hostir");
  if (stage == "kernels" || stage == "llvm" || stage == "cuda") {
    std::cout << mf::dumpKernels(p, dump_rank, sizes,
                                 stage == "llvm"   ? mf::KernelDump::Llvm
                                 : stage == "cuda" ? mf::KernelDump::Cuda
                                                   : mf::KernelDump::KernelIr);
  } else if (stage == "hostir") {
    std::cout << (dump_rank < 0 ? p.host.toString() : mf::programForRank(p, dump_rank).toString());
  } else {
    std::cout << p.stages.at(stage);
  }
  return 0;
}

std::pair<int, bool> Cli::handle(const std::string& piece) {
  std::unique_ptr<mf::Fusion> fusion;
  try {
    fusion = mf::parseFusion(piece, cli::displayPath(file));
    mf::verify(*fusion);
    if (*print || (*dump && stage == "fusion")) {  // the parsed fusion: nothing to compile
      std::cout << mf::printFusion(*fusion);
    } else if (*opt) {
      mf::PipelineOptions o = pipeline;
      if (dump_each) o.dump = &std::cout;
      if (timing) o.timing = &std::cerr;
      mf::runPasses(*fusion, passes, o);
      if (!dump_each) std::cout << mf::printFusion(*fusion);
    } else if (*dump && stage == "backward") {
      std::cout << mf::cli::dumpBackward(*fusion, ad_opts, pipeline);
    } else if (*dump) {
      return {dumpStage(std::move(fusion)), false};
    } else if (*gradcheck) {
      mf::SymbolBindings sizes = cli::completeBindings(*fusion, run_opts.sizes, /*warn=*/true);
      return {mf::cli::runGradCheck(*fusion, ad_opts, sizes, gc_opts, gc_low, gc_high, gc_seed) ? 0 : 1, false};
    } else if (*train) {
      mf::SymbolBindings sizes = cli::completeBindings(*fusion, run_opts.sizes, /*warn=*/true);
      return {mf::cli::runTrain(*fusion, train_opts, sizes, pipeline), true};
    } else if (*coll) {
      mf::SymbolBindings sizes = cli::completeBindings(*fusion, run_opts.sizes, /*warn=*/true);
      mf::PipelineOptions o = pipeline;
      o.sizes = sizes;  // chunk counts as `run` chooses them for these sizes
      mf::CompiledProgram p = mf::compile(std::move(fusion), o);
      std::cout << cli::collectiveReport(
          p, report_rank == -1 ? std::vector<int64_t>{} : std::vector<int64_t>{report_rank}, sizes);
      if (verify_collectives) std::cout << cli::verifyCollectives(p, sizes);
    } else if (*run) {
      int rc = 0;
      // A fusion without meshes runs on one device, on the --device asked for (the pipeline
      // compiles it for the mesh [0]); --reference alone means the reference executor's loops.
      if (reference) {
        runReference(*fusion, run_opts, save_dir);
      } else {
        run_opts.pipeline = pipeline;
        rc = cli::runSharded(*fusion, run_opts);
      }
      if (rc == 0 && run_timing) reportTiming(*fusion, run_opts, pipeline);
      return {rc, true};
    }
  } catch (const mf::UserError& e) {
    std::cout << std::flush;
    std::cerr << "meshfuse: " << mf::errorKindName(e.kind()) << ": " << e.message() << "\n";
    return {1, false};
  } catch (const mf::InternalError& e) {
    std::cout << std::flush;
    std::cerr << e.what() << "\n";
    if (fusion) std::cerr << "IR at the time of the error:\n" << mf::printFusion(*fusion);
    return {2, true};
  } catch (const std::exception& e) {
    std::cout << std::flush;
    std::cerr << otherError(e) << "\n";
    return {1, true};
  }
  return {0, false};
}

}  // namespace

int main(int argc, char** argv) {
  Cli c;
  c.app.set_version_flag("--version", "meshfuse 0.1.0");
  c.app.require_subcommand(1);
  c.addPrintAndOpt();
  c.addDump();
  c.addGradCheck();
  c.addTrain();
  c.addCollectives();
  c.addRun();
  // The compile options (overlap, fsdp, cp, ...), for every subcommand that compiles: made from
  // the one table Python's keyword arguments come from too (meshfuse/options.h).
  for (CLI::App* sub : {c.opt, c.dump, c.coll, c.run, c.train}) cli::addCompileOptions(*sub, c.pipeline);
  for (CLI::App* sub : {c.print, c.opt, c.dump, c.coll})
    sub->add_flag("--split-input-file", c.split,
                  "FILE holds several cases separated by lines '# -----' (the rest of such a line is a comment); "
                  "handle each on its own and print '# -----' between the results");

  CLI11_PARSE(c.app, argc, argv);
  if (*c.opt_host) return cli::runOptHost(c.opt_host_opts);

  std::vector<std::string> pieces;
  try {
    c.run_opts.sizes = cli::parseSizes(c.size_args);
    c.run_opts.save_dir = c.save_dir;
    pieces = cli::splitInput(cli::readText(c.file), c.split);
  } catch (const mf::UserError& e) {
    std::cerr << "meshfuse: " << mf::errorKindName(e.kind()) << ": " << e.message() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << otherError(e) << "\n";
    return 1;
  }
  int status = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (i > 0) std::cout << "# -----\n";
    auto [rc, done] = c.handle(pieces[i]);
    if (done) return rc;
    status = std::max(status, rc);
  }
  return status;
}
