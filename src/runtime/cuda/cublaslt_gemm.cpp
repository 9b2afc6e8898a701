// cuBLASLt execution of GemmPlans (see cublaslt_gemm.h).
#include "runtime/cuda/cublaslt_gemm.h"

#include "meshfuse/error.h"
#include "runtime/cuda/cuda_libraries.h"

namespace meshfuse::cuda {
namespace {

void checkCublas(cublasStatus_t s, const char* call) {
  MF_USER_CHECK(s == CUBLAS_STATUS_SUCCESS, ErrorKind::Runtime, "cuBLASLt error in {}: {} ({})", call,
                dyn::cublasLtGetStatusString(s), dyn::cublasLtGetStatusName(s));
}
#define MF_CUBLAS_CHECK(call) checkCublas((call), #call)

cudaDataType_t cudaType(DataType dt) {
  switch (dt) {
    case DataType::Float: return CUDA_R_32F;
    case DataType::BFloat16: return CUDA_R_16BF;
    case DataType::Half: return CUDA_R_16F;
    default: MF_CHECK(false, "no cuBLASLt type for {}", dtypeName(dt));
  }
}

cublasLtEpilogue_t epilogueOf(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::None: return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::Bias: return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::Gelu: return CUBLASLT_EPILOGUE_GELU;
    case GemmEpilogue::GeluBias: return CUBLASLT_EPILOGUE_GELU_BIAS;
    case GemmEpilogue::Relu: return CUBLASLT_EPILOGUE_RELU;
    case GemmEpilogue::ReluBias: return CUBLASLT_EPILOGUE_RELU_BIAS;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// The largest power of two up to 16 dividing the address: cuBLASLt picks kernels by alignment.
uint32_t alignmentOf(const void* p) {
  auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 16;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

template <typename T>
void setDesc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v) {
  MF_CUBLAS_CHECK(dyn::cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
}
template <typename T>
void setLayout(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, const T& v) {
  MF_CUBLAS_CHECK(dyn::cublasLtMatrixLayoutSetAttribute(l, attr, &v, sizeof(v)));
}
template <typename T>
void setPref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const T& v) {
  MF_CUBLAS_CHECK(dyn::cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof(v)));
}

}  // namespace

std::string cublasLtVersionString() { return std::to_string(dyn::cublasLtGetVersion()); }

struct CublasLtGemm::Prepared {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  ~Prepared() {
    if (a) dyn::cublasLtMatrixLayoutDestroy(a);
    if (b) dyn::cublasLtMatrixLayoutDestroy(b);
    if (d) dyn::cublasLtMatrixLayoutDestroy(d);
    if (op) dyn::cublasLtMatmulDescDestroy(op);
  }
};

CublasLtGemm::CublasLtGemm(bool allow_tf32) : allow_tf32_(allow_tf32) {
  cublasLtHandle_t h = nullptr;
  MF_CUBLAS_CHECK(dyn::cublasLtCreate(&h));
  handle_ = h;
}

CublasLtGemm::~CublasLtGemm() {
  cache_.clear();
  if (handle_ != nullptr) dyn::cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

CublasLtGemm::Prepared& CublasLtGemm::prepare(const GemmPlan& p, const void* a, const void* b, const void* bias,
                                              const void* d, size_t workspace_bytes) {
  const std::string key = fmt::format("{} align=({},{},{},{}) ws={}", p.describe(), alignmentOf(a), alignmentOf(b),
                                      bias ? alignmentOf(bias) : 0, alignmentOf(d), workspace_bytes);
  auto it = cache_.find(key);
  if (it != cache_.end()) return *it->second;

  auto pr = std::make_unique<Prepared>();
  const cudaDataType_t t = cudaType(p.dtype);
  // f32 in full precision unless TF32 was asked for: results then match the CPU backend's.
  const cublasComputeType_t compute =
      p.dtype == DataType::Float && allow_tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  MF_CUBLAS_CHECK(dyn::cublasLtMatmulDescCreate(&pr->op, compute, CUDA_R_32F));
  setDesc(pr->op, CUBLASLT_MATMUL_DESC_TRANSA, p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  setDesc(pr->op, CUBLASLT_MATMUL_DESC_TRANSB, p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
  setDesc(pr->op, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogueOf(p.epilogue));
  if (bias != nullptr) setDesc(pr->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);

  // Stored (pre-op) shapes: op(A) is m x k, so A is k x m when transposed.
  MF_CUBLAS_CHECK(dyn::cublasLtMatrixLayoutCreate(&pr->a, t, p.trans_a ? p.k : p.m, p.trans_a ? p.m : p.k, p.lda));
  MF_CUBLAS_CHECK(dyn::cublasLtMatrixLayoutCreate(&pr->b, t, p.trans_b ? p.n : p.k, p.trans_b ? p.k : p.n, p.ldb));
  MF_CUBLAS_CHECK(dyn::cublasLtMatrixLayoutCreate(&pr->d, t, p.m, p.n, p.ldd));
  if (p.batch > 1) {
    const int32_t count = static_cast<int32_t>(p.batch);
    for (auto [layout, stride] : {std::pair{pr->a, p.stride_a}, {pr->b, p.stride_b}, {pr->d, p.stride_d}}) {
      setLayout(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, count);
      setLayout(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, static_cast<int64_t>(stride));
    }
  }

  cublasLtMatmulPreference_t pref = nullptr;
  MF_CUBLAS_CHECK(dyn::cublasLtMatmulPreferenceCreate(&pref));
  auto destroy = [](cublasLtMatmulPreference_t q) { dyn::cublasLtMatmulPreferenceDestroy(q); };
  std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, decltype(destroy)> pref_guard(pref, destroy);
  setPref(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(workspace_bytes));
  setPref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignmentOf(a));
  setPref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignmentOf(b));
  setPref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignmentOf(d));
  setPref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignmentOf(d));

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  MF_CUBLAS_CHECK(dyn::cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), pr->op, pr->a, pr->b, pr->d,
                                                 pr->d, pref, 1, &result, &found));
  MF_USER_CHECK(found > 0, ErrorKind::Unsupported, "cuBLASLt has no algorithm for the GEMM {}", key);
  pr->algo = result.algo;
  pr->workspace = result.workspaceSize;
  return *cache_.emplace(key, std::move(pr)).first->second;
}

void CublasLtGemm::run(const GemmPlan& p, const void* a, const void* b, const void* bias, void* d,
                       cudaStream_t stream, void* workspace, size_t workspace_bytes) {
  if (p.m == 0 || p.n == 0 || p.batch == 0) return;
  MF_CHECK(p.k > 0, "a GEMM with an empty contraction (k = 0) must be a fill, not a cuBLASLt call");
  std::lock_guard<std::mutex> lk(mu_);
  Prepared& pr = prepare(p, a, b, bias, d, workspace_bytes);
  // The bias pointer is part of the descriptor: set it for this call (same alignment as cached).
  if (bias != nullptr) setDesc(pr.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  const float alpha = static_cast<float>(p.alpha), beta = static_cast<float>(p.beta);
  MF_CUBLAS_CHECK(dyn::cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), pr.op, &alpha, a, pr.a, b, pr.b, &beta, d,
                                 pr.d, d, pr.d, &pr.algo, workspace, pr.workspace, stream));
}

}  // namespace meshfuse::cuda
