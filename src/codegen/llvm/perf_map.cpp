// Perf map listener (contract in perf_map.h).
#include "codegen/llvm/perf_map.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <mutex>

#include <llvm/ExecutionEngine/JITEventListener.h>
#include <llvm/Object/SymbolSize.h>

namespace meshfuse::cpu {
namespace {

class PerfMapListener final : public llvm::JITEventListener {
 public:
  void notifyObjectLoaded(ObjectKey, const llvm::object::ObjectFile& obj,
                          const llvm::RuntimeDyld::LoadedObjectInfo& info) override {
    // The object as loaded: its symbols' addresses are where the code now runs.
    llvm::object::OwningBinary<llvm::object::ObjectFile> loaded = info.getObjectForDebug(obj);
    if (loaded.getBinary() == nullptr) return;
    std::string lines;
    for (const auto& [sym, size] : llvm::object::computeSymbolSizes(*loaded.getBinary())) {
      llvm::Expected<llvm::object::SymbolRef::Type> type = sym.getType();
      llvm::Expected<llvm::StringRef> name = sym.getName();
      llvm::Expected<uint64_t> addr = sym.getAddress();
      if (!type || !name || !addr) {  // a symbol LLVM cannot describe: leave it unnamed
        llvm::consumeError(type.takeError());
        llvm::consumeError(name.takeError());
        llvm::consumeError(addr.takeError());
        continue;
      }
      if (*type != llvm::object::SymbolRef::ST_Function || size == 0) continue;
      lines += fmt::format("{:x} {:x} meshfuse:{}\n", *addr, size, name->str());
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (file_ == nullptr) file_ = std::fopen(fmt::format("/tmp/perf-{}.map", ::getpid()).c_str(), "a");
    if (file_ == nullptr) return;  // profiling aid only: no map, no names
    std::fputs(lines.c_str(), file_);
    std::fflush(file_);
  }

  ~PerfMapListener() override {
    if (file_ != nullptr) std::fclose(file_);
  }

 private:
  std::mutex mu_;
  std::FILE* file_ = nullptr;
};

}  // namespace

std::unique_ptr<llvm::JITEventListener> makePerfMapListener() { return std::make_unique<PerfMapListener>(); }

}  // namespace meshfuse::cpu
