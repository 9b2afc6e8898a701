// Loading NVRTC, cuBLASLt and NCCL on first use (see cuda_libraries.h).
#include "runtime/cuda/cuda_libraries.h"

#include <dlfcn.h>

#include <mutex>
#include <string>
#include <vector>

#include "meshfuse/error.h"

#define MF_STR2(x) #x
#define MF_STR(x) MF_STR2(x)

namespace meshfuse::cuda {
namespace {

// The soname first (a copy already in the process, LD_LIBRARY_PATH, the loader's cache), then
// the directory the build found the library in.
void* openLibrary(const std::string& soname, const std::string& build_dir, const char* what) {
  std::vector<std::string> tried = {soname};
  if (!build_dir.empty()) tried.push_back(build_dir + "/" + soname);
  std::string errors;
  for (const std::string& path : tried) {
    if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    errors += fmt::format("\n  {}: {}", path, dlerror());
  }
  userError(ErrorKind::Runtime, "{} is not available: could not load {} (install it, or add its directory to "
            "LD_LIBRARY_PATH):{}", what, soname, errors);
}

template <typename Api, typename Fill>
const Api& load(Api& api, std::once_flag& once, const std::string& soname, const std::string& build_dir,
                const char* what, Fill&& fill) {
  std::call_once(once, [&] {
    void* h = openLibrary(soname, build_dir, what);
    fill(h);
  });
  return api;
}

template <typename F>
void bind(void* handle, const char* name, const char* what, F& slot) {
  void* sym = dlsym(handle, name);
  MF_USER_CHECK(sym != nullptr, ErrorKind::Runtime, "{} has no symbol {} (too old a version?)", what, name);
  slot = reinterpret_cast<F>(sym);
}

}  // namespace

#define MF_BIND(f) bind(h, #f, what, api.f);

const NvrtcApi& nvrtcApi() {
  static NvrtcApi api;
  static std::once_flag once;
  const char* what = "NVRTC (the CUDA runtime compiler)";
  return load(api, once, fmt::format("libnvrtc.so.{}", CUDART_VERSION / 1000), MESHFUSE_CUDA_LIBRARY_DIR, what,
              [&](void* h) { MF_NVRTC_API(MF_BIND) });
}

const CublasLtApi& cublasLtApi() {
  static CublasLtApi api;
  static std::once_flag once;
  const char* what = "cuBLASLt";
  return load(api, once, fmt::format("libcublasLt.so.{}", CUBLAS_VER_MAJOR), MESHFUSE_CUDA_LIBRARY_DIR, what,
              [&](void* h) { MF_CUBLASLT_API(MF_BIND) });
}

const NcclApi& ncclApi() {
  static NcclApi api;
  static std::once_flag once;
  const char* what = "NCCL";
  return load(api, once, fmt::format("libnccl.so.{}", NCCL_MAJOR), MESHFUSE_NCCL_LIBRARY_DIR, what,
              [&](void* h) { MF_NCCL_API(MF_BIND) });
}

#undef MF_BIND

}  // namespace meshfuse::cuda
