// LLJIT for the host (contract in jit.h).
#include "codegen/llvm/jit.h"
#include "codegen/kernel_ir.h"
#include "codegen/llvm/perf_map.h"

#include <llvm/Analysis/CGSCCPassManager.h>
#include <llvm/Analysis/LoopAnalysisManager.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/JITEventListener.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/RTDyldObjectLinkingLayer.h>
#include <llvm/ExecutionEngine/SectionMemoryManager.h>
#include <llvm/ExecutionEngine/Orc/ThreadSafeModule.h>
#include <llvm/IR/PassManager.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>

#include "meshfuse/error.h"

namespace meshfuse::cpu {
namespace {

template <typename T>
T unwrap(llvm::Expected<T> v, const char* what) {
  if (!v) {
    std::string msg = llvm::toString(v.takeError());
    MF_CHECK(false, "{}: {}", what, msg);
  }
  return std::move(*v);
}

void check(llvm::Error e, const char* what) {
  if (e) {
    std::string msg = llvm::toString(std::move(e));
    MF_CHECK(false, "{}: {}", what, msg);
  }
}

llvm::orc::JITTargetMachineBuilder hostBuilder() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
  });
  llvm::orc::JITTargetMachineBuilder b = unwrap(llvm::orc::JITTargetMachineBuilder::detectHost(), "detecting the host");
  b.setCodeGenOptLevel(llvm::CodeGenOpt::Aggressive);
  return b;
}

}  // namespace

Jit::Jit(bool perf_map) {
  llvm::orc::JITTargetMachineBuilder b = hostBuilder();
  tm_ = unwrap(b.createTargetMachine(), "creating the host TargetMachine");
  llvm::orc::LLJITBuilder builder;
  builder.setJITTargetMachineBuilder(b);
  if (perf_map) {
    // LLJIT's own linking layer on this host (RuntimeDyld), with the listener that names kernels.
    perf_map_ = makePerfMapListener();
    builder.setObjectLinkingLayerCreator([listener = perf_map_.get()](llvm::orc::ExecutionSession& es,
                                                                      const llvm::Triple&) {
      auto layer = std::make_unique<llvm::orc::RTDyldObjectLinkingLayer>(
          es, [] { return std::make_unique<llvm::SectionMemoryManager>(); });
      layer->registerJITEventListener(*listener);
      return llvm::Expected<std::unique_ptr<llvm::orc::ObjectLayer>>(std::move(layer));
    });
  }
  jit_ = unwrap(builder.create(), "creating the JIT");
  // Kernels may call libm (pow): resolve symbols from this process.
  jit_->getMainJITDylib().addGenerator(
      unwrap(llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(jit_->getDataLayout().getGlobalPrefix()),
             "opening this process's symbols"));
}

Jit::~Jit() = default;

void Jit::optimize(llvm::Module& m) {
  m.setDataLayout(tm_->createDataLayout());
  m.setTargetTriple(tm_->getTargetTriple().str());
  for (llvm::Function& f : m) {
    if (f.isDeclaration()) continue;
    f.addFnAttr("target-cpu", tm_->getTargetCPU());
    f.addFnAttr("target-features", tm_->getTargetFeatureString());
  }
  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  llvm::PipelineTuningOptions tuning;
  tuning.LoopVectorization = true;
  tuning.SLPVectorization = true;
  llvm::PassBuilder pb(tm_.get(), tuning);
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3).run(m, mam);
}

std::vector<KernelFn> Jit::compile(EmittedModule em) {
  std::lock_guard<std::mutex> lock(mu_);
  optimize(*em.module);
  check(jit_->addIRModule(llvm::orc::ThreadSafeModule(std::move(em.module), std::move(em.context))),
        "adding a kernel module to the JIT");
  std::vector<KernelFn> out;
  for (const std::string& name : em.functions) {
    if (name.empty()) {
      out.push_back(nullptr);
      continue;
    }
    llvm::orc::ExecutorAddr addr = unwrap(jit_->lookup(name), "compiling a kernel");
    out.push_back(addr.toPtr<KernelFn>());
  }
  return out;
}

std::string Jit::optimizedIr(EmittedModule em) {
  std::lock_guard<std::mutex> lock(mu_);
  optimize(*em.module);
  std::string s;
  llvm::raw_string_ostream os(s);
  em.module->print(os, nullptr);
  return os.str();
}

std::string Jit::describeTarget() const { return tm_->getTargetTriple().str() + ", cpu " + tm_->getTargetCPU().str(); }

}  // namespace meshfuse::cpu

namespace meshfuse {

// The optimized LLVM IR of `program` as the CPU backend compiles it (`meshfuse dump --stage=llvm`).
std::string cpuLlvmIr(const kir::Program& program) {
  cpu::Jit jit;
  return jit.optimizedIr(cpu::emitModule(program, "mf"));
}

}  // namespace meshfuse
