// NVRTC compilation, the disk cache and library loading (see nvrtc_compiler.h).
#include "runtime/cuda/nvrtc_compiler.h"

#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <vector>

#include "meshfuse/error.h"
#include "runtime/cuda/cuda_error.h"
#include "runtime/cuda/cuda_libraries.h"

namespace meshfuse::cuda {
namespace {

void checkNvrtc(nvrtcResult r, const char* call) {
  MF_USER_CHECK(r == NVRTC_SUCCESS, ErrorKind::Runtime, "NVRTC error in {}: {}", call, dyn::nvrtcGetErrorString(r));
}

std::string numbered(const std::string& source) {
  std::istringstream in(source);
  std::string line, out;
  for (int n = 1; std::getline(in, line); ++n) out += fmt::format("{:4} | {}\n", n, line);
  return out;
}

std::string readFile(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return "";
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Another rank may write the same entry at the same time: each writes its own temporary file
// and renames it into place, which is atomic, so a reader sees a whole file or none.
void writeAtomically(const std::filesystem::path& p, const std::string& data) {
  std::error_code ec;
  std::filesystem::create_directories(p.parent_path(), ec);
  if (ec) return;  // an unwritable cache only costs recompilation
  std::filesystem::path tmp = p;
  tmp += fmt::format(".tmp.{}.{}", ::getpid(), std::random_device{}());
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out) return;
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    if (!out) return;
  }
  std::filesystem::rename(tmp, p, ec);
  if (ec) std::filesystem::remove(tmp, ec);
}

}  // namespace

uint64_t hash64(std::string_view text, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ (seed * 0x9e3779b97f4a7c15ull);  // FNV-1a, seeded
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string nvrtcVersionString() {
  int major = 0, minor = 0;
  checkNvrtc(dyn::nvrtcVersion(&major, &minor), "nvrtcVersion");
  return fmt::format("{}.{}", major, minor);
}

CompiledCode compileCuda(const std::string& source, const std::string& program_name, const CompileOptions& o) {
  // -lineinfo: compute-sanitizer and profilers map faults and samples to generated source lines.
  std::vector<std::string> opts = {o.ptx ? fmt::format("--gpu-architecture=compute_{}", o.arch)
                                         : fmt::format("--gpu-architecture=sm_{}", o.arch),
                                   "-std=c++17", "-lineinfo", "--device-as-default-execution-space"};
  const bool report = o.resource_usage && !o.ptx;
  if (report) opts.push_back("--ptxas-options=-v");
  std::string key_text = fmt::format("{}\n{}\n{}\n", nvrtcVersionString(), fmt::join(opts, " "), source);
  std::filesystem::path cached;
  if (!o.cache_dir.empty()) {
    cached = std::filesystem::path(o.cache_dir) /
             fmt::format("{}-{:016x}{:016x}.{}", program_name, hash64(key_text), hash64(key_text, 1),
                         o.ptx ? "ptx" : "cubin");
    std::string hit = readFile(cached);
    if (!hit.empty() && !report) return {std::move(hit), true, 0, "", {}};
  }

  auto start = std::chrono::steady_clock::now();
  nvrtcProgram prog = nullptr;
  checkNvrtc(dyn::nvrtcCreateProgram(&prog, source.c_str(), (program_name + ".cu").c_str(), 0, nullptr, nullptr),
             "nvrtcCreateProgram");
  std::unique_ptr<nvrtcProgram, void (*)(nvrtcProgram*)> guard(&prog, [](nvrtcProgram* p) { dyn::nvrtcDestroyProgram(p); });
  std::vector<const char*> argv;
  for (const std::string& s : opts) argv.push_back(s.c_str());
  nvrtcResult rc = dyn::nvrtcCompileProgram(prog, static_cast<int>(argv.size()), argv.data());
  size_t log_size = 0;
  dyn::nvrtcGetProgramLogSize(prog, &log_size);
  std::string log(log_size, '\0');
  if (log_size > 0) dyn::nvrtcGetProgramLog(prog, log.data());
  while (!log.empty() && log.back() == '\0') log.pop_back();  // the size counts the terminator
  MF_CHECK(rc == NVRTC_SUCCESS, "NVRTC could not compile the generated kernel {} for sm_{} ({}):\n{}\n{}", program_name,
           o.arch, dyn::nvrtcGetErrorString(rc), log, numbered(source));
  size_t size = 0;
  std::string image;
  if (o.ptx) {
    checkNvrtc(dyn::nvrtcGetPTXSize(prog, &size), "nvrtcGetPTXSize");
    image.resize(size);
    checkNvrtc(dyn::nvrtcGetPTX(prog, image.data()), "nvrtcGetPTX");
  } else {
    checkNvrtc(dyn::nvrtcGetCUBINSize(prog, &size), "nvrtcGetCUBINSize");
    image.resize(size);
    checkNvrtc(dyn::nvrtcGetCUBIN(prog, image.data()), "nvrtcGetCUBIN");
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!cached.empty()) writeAtomically(cached, image);
  CompiledCode code{std::move(image), false, seconds, log, {}};
  if (report) code.resources = parsePtxasResources(log);
  return code;
}

std::vector<KernelResources> parsePtxasResources(const std::string& log) {
  std::vector<KernelResources> out;
  auto kernel = [&](const std::string& name) -> KernelResources& {
    for (KernelResources& k : out)
      if (k.name == name) return k;
    out.push_back({name});
    return out.back();
  };
  auto number_before = [](const std::string& line, const std::string& what) -> int64_t {
    size_t at = line.find(what);
    if (at == std::string::npos) return -1;
    size_t end = at;
    while (end > 0 && line[end - 1] == ' ') --end;
    size_t begin = end;
    while (begin > 0 && std::isdigit(static_cast<unsigned char>(line[begin - 1]))) --begin;
    return begin < end ? std::stoll(line.substr(begin, end - begin)) : -1;
  };
  auto quoted = [](const std::string& line, size_t from) {
    size_t a = line.find_first_of("'\"", from);
    if (a == std::string::npos) return std::string();
    size_t b = line.find(line[a], a + 1);
    return b == std::string::npos ? std::string() : line.substr(a + 1, b - a - 1);
  };
  std::istringstream in(log);
  std::string line, current;
  while (std::getline(in, line)) {
    if (size_t at = line.find("Function properties for "); at != std::string::npos) {
      current = line.substr(at + std::strlen("Function properties for "));
      while (!current.empty() && (current.back() == '\r' || current.back() == ' ')) current.pop_back();
      kernel(current);
    } else if (size_t at = line.find("Compiling entry function"); at != std::string::npos) {
      current = quoted(line, at);
      kernel(current);
    }
    if (current.empty()) continue;
    if (int64_t v = number_before(line, "bytes stack frame"); v >= 0) kernel(current).stack_frame_bytes = v;
    if (int64_t v = number_before(line, "bytes spill stores"); v >= 0) kernel(current).spill_store_bytes = v;
    if (int64_t v = number_before(line, "bytes spill loads"); v >= 0) kernel(current).spill_load_bytes = v;
    if (size_t at = line.find("Used "); at != std::string::npos && line.find("registers") != std::string::npos)
      kernel(current).registers = std::stoll(line.substr(at + 5));
  }
  return out;
}

CudaLibrary::CudaLibrary(const std::string& image) {
  MF_CUDA_CHECK(cudaLibraryLoadData(&lib_, image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
}

CudaLibrary::~CudaLibrary() {
  if (lib_ != nullptr) (void)cudaLibraryUnload(lib_);
}

cudaKernel_t CudaLibrary::kernel(const std::string& name) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = kernels_.find(name);
  if (it != kernels_.end()) return it->second;
  cudaKernel_t k = nullptr;
  MF_CUDA_CHECK(cudaLibraryGetKernel(&k, lib_, name.c_str()));
  kernels_.emplace(name, k);
  return k;
}

cudaKernel_t KernelCache::get(const std::string& source, const std::string& name) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = libraries_.find(source);
  if (it == libraries_.end()) {
    CompiledCode code = compileCuda(source, name, options_);
    compiled_ += code.from_cache ? 0 : 1;
    seconds_ += code.seconds;
    it = libraries_.emplace(source, std::make_unique<CudaLibrary>(code.image)).first;
  }
  return it->second->kernel(name);
}

void launchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, void** args) {
  // The runtime accepts a cudaKernel_t wherever it takes a kernel function pointer.
  MF_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, block, args, shared_bytes, stream));
}

}  // namespace meshfuse::cuda
