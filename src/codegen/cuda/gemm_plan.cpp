// Gemm segment -> cuBLASLt problem (see gemm_plan.h for the transposition argument).
#include "codegen/cuda/gemm_plan.h"

#include <algorithm>
#include <map>

#include "meshfuse/error.h"
#include "meshfuse/ir/expr.h"
#include "meshfuse/ir/val.h"

namespace meshfuse::cuda {
namespace {

int64_t product(const std::vector<int64_t>& s, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to; ++i) p *= s[i];
  return p;
}

int inputIndex(const Segment& seg, const Val* v) {
  auto it = std::find(seg.inputs.begin(), seg.inputs.end(), v);
  return it == seg.inputs.end() ? -1 : static_cast<int>(it - seg.inputs.begin());
}

[[noreturn]] void cannotFuse(const Expr* e, const std::string& why) {
  userError(ErrorKind::Unsupported, "cuBLASLt cannot apply {} in a GEMM epilogue ({}); it belongs in a kernel segment",
            e->name(), why);
}

}  // namespace

const char* gemmEpilogueName(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::None: return "none";
    case GemmEpilogue::Bias: return "bias";
    case GemmEpilogue::Gelu: return "gelu";
    case GemmEpilogue::GeluBias: return "gelu+bias";
    case GemmEpilogue::Relu: return "relu";
    case GemmEpilogue::ReluBias: return "relu+bias";
  }
  return "?";
}

std::string GemmPlan::describe() const {
  return fmt::format("{} m={} n={} k={} {}{} lda={} ldb={} ldd={} batch={} strides=({}, {}, {}) epilogue={}{}",
                     dtypeName(dtype), m, n, k, trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', lda, ldb, ldd, batch,
                     stride_a, stride_b, stride_d, gemmEpilogueName(epilogue),
                     alpha == 1 && beta == 0 ? "" : fmt::format(" alpha={} beta={}", alpha, beta));
}

namespace {

// The problem of linear(x [..., K], w [N, K]): column-major D^T [N, rows] = w x^T.
void planLinear(GemmPlan& p, const std::vector<int64_t>& xs, const std::vector<int64_t>& ws) {
  MF_CHECK(!xs.empty() && ws.size() == 2, "linear of shapes [{}] and [{}]", fmt::join(xs, ", "), fmt::join(ws, ", "));
  const int64_t K = xs.back(), N = ws[0];
  p.m = N;
  p.n = product(xs, 0, xs.size() - 1);
  p.k = K;
  p.trans_a = true;
  p.lda = K;
  p.ldb = K;
  p.ldd = N;
}

// The problem of matmul(x [..., M, K], w [(...,) K, N]): a strided batch, or (one w for every
// batch) just more rows.
void planMatmul(GemmPlan& p, const std::vector<int64_t>& xs, const std::vector<int64_t>& ws) {
  MF_CHECK(xs.size() >= 2 && ws.size() >= 2, "matmul of shapes [{}] and [{}]", fmt::join(xs, ", "),
           fmt::join(ws, ", "));
  const int64_t M = xs[xs.size() - 2], K = xs.back(), N = ws.back();
  const int64_t batch = product(xs, 0, xs.size() - 2);
  p.m = N;
  p.k = K;
  p.lda = N;
  p.ldb = K;
  p.ldd = N;
  if (ws.size() == 2) {
    p.n = batch * M;
  } else {
    p.n = M;
    p.batch = batch;
    p.stride_a = K * N;
    p.stride_b = M * K;
    p.stride_d = M * N;
  }
}

// The segment's ops after the GEMM, as cuBLASLt's epilogue: in order, at most one bias, then at
// most one activation. A bias reaches the add either as a segment input of shape [..., 1, N] or
// through a broadcast_in_dim of a [N] segment input onto the last dim. Anything else is an error
// naming the op (the segmenter should have left it to a kernel segment).
class EpiloguePlanner {
 public:
  EpiloguePlanner(const Segment& seg, const std::vector<std::vector<int64_t>>& shapes, GemmPlan& p)
      : seg_(seg), shapes_(shapes), p_(p) {}

  void run() {
    const Val* prev = seg_.exprs.front()->output();
    for (size_t i = 1; i < seg_.exprs.size(); ++i) {
      const Expr* e = seg_.exprs[i];
      if (e->kind() == OpKind::BroadcastInDim) {
        broadcast(e);
        continue;
      }
      if (std::find(seg_.outputs.begin(), seg_.outputs.end(), prev) != seg_.outputs.end())
        cannotFuse(e, "the value before it is also needed outside the segment");
      MF_CHECK(e->input(size_t{0}) == prev || (e->inputs().size() > 1 && e->input(size_t{1}) == prev),
               "epilogue op {} does not consume the GEMM", e->name());
      if (e->kind() == OpKind::Add) {
        add(e, e->input(size_t{0}) == prev ? e->input(size_t{1}) : e->input(size_t{0}));
      } else if (e->kind() == OpKind::Gelu || e->kind() == OpKind::Relu) {
        activation(e);
      } else {
        cannotFuse(e, "not a bias add or a gelu/relu");
      }
      prev = e->output();
    }
    MF_CHECK(seg_.outputs.size() == 1 && seg_.outputs[0] == prev, "a Gemm segment whose output is not its last op's");
    if (p_.bias_input < 0) return;
    MF_CHECK(isBias(p_.bias_input), "bias of shape [{}] for {} output features",
             fmt::join(shapes_[p_.bias_input], ", "), p_.m);
    p_.epilogue = p_.epilogue == GemmEpilogue::Gelu   ? GemmEpilogue::GeluBias
                  : p_.epilogue == GemmEpilogue::Relu ? GemmEpilogue::ReluBias
                                                      : GemmEpilogue::Bias;
  }

 private:
  bool isBias(int b) const {
    if (b < 0 || seg_.inputs[b]->dtype() != p_.dtype) return false;
    const std::vector<int64_t>& s = shapes_[b];
    return !s.empty() && s.back() == p_.m && product(s, 0, s.size()) == p_.m;
  }

  void broadcast(const Expr* e) {
    const int b = inputIndex(seg_, e->input(size_t{0}));
    const auto& dims = e->attr<std::vector<int64_t>>("broadcast_dims");
    const int64_t out_rank = static_cast<int64_t>(e->attr<std::vector<int64_t>>("shape").size());
    if (!isBias(b) || shapes_[b].size() != 1 || dims.size() != 1 || dims[0] != out_rank - 1)
      cannotFuse(e, "only the broadcast of a bias onto the output's last dim");
    broadcast_bias_.emplace(e->output(), b);
  }

  void add(const Expr* e, const Val* other) {
    auto bc = broadcast_bias_.find(other);
    const int b = bc != broadcast_bias_.end() ? bc->second : inputIndex(seg_, other);
    if (activation_ || p_.bias_input >= 0 || !isBias(b))
      cannotFuse(e, fmt::format("only one add of a [{}] {} bias before the activation", p_.m, dtypeName(p_.dtype)));
    p_.bias_input = b;
  }

  void activation(const Expr* e) {
    if (activation_) cannotFuse(e, "a second activation");
    if (e->kind() == OpKind::Gelu && e->attr<std::string>("approximate") != "tanh")
      cannotFuse(e, "cuBLASLt's GELU is the tanh approximation; this one is exact (erf)");
    activation_ = true;
    p_.epilogue = e->kind() == OpKind::Gelu ? GemmEpilogue::Gelu : GemmEpilogue::Relu;
  }

  const Segment& seg_;
  const std::vector<std::vector<int64_t>>& shapes_;
  GemmPlan& p_;
  std::map<const Val*, int> broadcast_bias_;  // broadcast_in_dim output -> the [N] input it expands
  bool activation_ = false;
};

}  // namespace

GemmPlan planGemm(const Segment& seg, const std::vector<std::vector<int64_t>>& shapes) {
  MF_CHECK(seg.kind == Segment::Kind::Gemm && !seg.exprs.empty(), "planGemm of a {} segment",
           segmentKindName(seg.kind));
  MF_CHECK(shapes.size() == seg.inputs.size(), "{} shapes for {} inputs", shapes.size(), seg.inputs.size());
  const Expr* g = seg.exprs.front();
  MF_CHECK(g->kind() == OpKind::Linear || g->kind() == OpKind::Matmul, "a Gemm segment starting with {}", g->name());
  GemmPlan p;
  const int x = inputIndex(seg, g->input(size_t{0})), w = inputIndex(seg, g->input(size_t{1}));
  MF_CHECK(x >= 0 && w >= 0, "the GEMM's operands are not inputs of its segment");
  p.dtype = seg.inputs[x]->dtype();
  MF_USER_CHECK(p.dtype == seg.inputs[w]->dtype(), ErrorKind::Dtype, "{}: operands of dtypes {} and {}", g->name(),
                dtypeName(p.dtype), dtypeName(seg.inputs[w]->dtype()));
  MF_USER_CHECK(p.dtype == DataType::Float || p.dtype == DataType::BFloat16 || p.dtype == DataType::Half,
                ErrorKind::Dtype, "{} on {}: the CUDA backend's GEMMs take f32, bf16 or f16", g->name(),
                dtypeName(p.dtype));
  // Row-major x w is column-major w^T x^T: the weight is cuBLASLt's A, the activation its B.
  p.a_input = w;
  p.b_input = x;
  if (g->kind() == OpKind::Linear) {
    planLinear(p, shapes[x], shapes[w]);
    if (const Val* bias = g->input("bias")) p.bias_input = inputIndex(seg, bias);
  } else {
    planMatmul(p, shapes[x], shapes[w]);
  }
  EpiloguePlanner(seg, shapes, p).run();
  return p;
}

std::vector<KirGemmCall> planKirGemm(const kir::Gemm& g) {
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: kir's B is cuBLASLt's A.
  GemmPlan p;
  p.dtype = DataType::Float;
  p.m = g.n;
  p.n = g.m;
  p.k = g.k;
  p.trans_a = g.b.trans;
  p.lda = g.b.ld;
  p.a_input = static_cast<int>(g.b.buffer);
  p.trans_b = g.a.trans;
  p.ldb = g.a.ld;
  p.b_input = static_cast<int>(g.a.buffer);
  p.ldd = g.c.ld;
  p.alpha = g.alpha;
  p.beta = g.beta;
  std::vector<kir::Gemm::BatchDim> outer = g.batch;
  if (!outer.empty()) {
    const kir::Gemm::BatchDim last = outer.back();
    outer.pop_back();
    p.batch = last.extent;
    p.stride_a = last.stride_b;
    p.stride_b = last.stride_a;
    p.stride_d = last.stride_c;
  }
  int64_t entries = 1;
  for (const kir::Gemm::BatchDim& d : outer) entries *= d.extent;
  std::vector<KirGemmCall> calls;
  for (int64_t t = 0; t < entries; ++t) {
    KirGemmCall c{p, g.b.offset, g.a.offset, g.c.offset};
    int64_t rest = t;
    for (size_t d = outer.size(); d-- > 0;) {
      const int64_t j = rest % outer[d].extent;
      rest /= outer[d].extent;
      c.a_offset += j * outer[d].stride_b;
      c.b_offset += j * outer[d].stride_a;
      c.d_offset += j * outer[d].stride_c;
    }
    calls.push_back(c);
  }
  return calls;
}

}  // namespace meshfuse::cuda
