// Recursive-descent parser of the .mf text form (grammar by example in printer.h).
#include "meshfuse/ir/parser.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>

#include "ir/lexer.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/printer.h"
#include "meshfuse/ir/verifier.h"

namespace meshfuse {
namespace {

struct ParsedDim {
  Extent extent;
  bool reduction = false;
};

struct ParsedType {
  Token at;
  DataType dtype;
  std::vector<ParsedDim> dims;
  bool has_mesh = false;
  Token mesh;
  std::vector<std::pair<Token, ScheduleStep>> steps;
  bool has_provenance = false;
  std::string provenance;
};

class Parser {
 public:
  Parser(std::string_view text, std::string_view filename)
      : file_(filename), toks_(lex(text, filename)), fusion_(std::make_unique<Fusion>()) {}

  std::unique_ptr<Fusion> parse() {
    expectIdent("fusion");
    expectPunct("{");
    while (!isPunct("}")) {
      MF_USER_CHECK(peek().kind != Token::End, ErrorKind::Parse,
                    "{}: expected '}}' to close the fusion but found end of input", where(peek()));
      statement();
    }
    const Token& close = expectPunct("}");
    requireOutputs(*fusion_, where(close) + ": ");
    if (peek().kind != Token::End) fail(peek(), "end of input after the fusion");
    return std::move(fusion_);
  }

 private:
  // ---- token helpers --------------------------------------------------------------------
  const Token& peek(size_t k = 0) const { return toks_[std::min(pos_ + k, toks_.size() - 1)]; }
  const Token& next() { return toks_[std::min(pos_++, toks_.size() - 1)]; }
  bool isPunct(std::string_view p) const { return peek().kind == Token::Punct && peek().text == p; }
  bool isIdent(std::string_view p) const { return peek().kind == Token::Ident && peek().text == p; }
  std::string where(const Token& t) const { return fmt::format("{}:{}:{}", file_, t.line, t.col); }
  [[noreturn]] void fail(const Token& t, std::string_view expected) const {
    userError(ErrorKind::Parse, "{}: expected {} but found {}", where(t), expected, t.describe());
  }
  const Token& expectPunct(std::string_view p) {
    if (!isPunct(p)) fail(peek(), fmt::format("'{}'", p));
    return next();
  }
  const Token& expectIdent(std::string_view p) {
    if (!isIdent(p)) fail(peek(), fmt::format("'{}'", p));
    return next();
  }
  const Token& expectKind(Token::Kind k, std::string_view what) {
    if (peek().kind != k) fail(peek(), what);
    return next();
  }
  int64_t expectInt(std::string_view what) { return intOf(expectKind(Token::Int, what)); }
  // Numbers are converted here so that a malformed or out-of-range one is a located ParseError.
  int64_t intOf(const Token& t) const {
    try {
      size_t used = 0;
      int64_t v = std::stoll(t.text, &used);
      if (used == t.text.size()) return v;
    } catch (const std::exception&) {
    }
    userError(ErrorKind::Parse, "{}: {} is not a 64-bit integer", where(t), t.describe());
  }
  double floatOf(const Token& t) const {
    if (t.text == "inf") return std::numeric_limits<double>::infinity();
    if (t.text == "-inf") return -std::numeric_limits<double>::infinity();
    if (t.text == "nan") return std::numeric_limits<double>::quiet_NaN();
    // strtod, not stod: stod rejects subnormals (ERANGE), which the printer writes (5e-324).
    errno = 0;
    char* end = nullptr;
    double v = std::strtod(t.text.c_str(), &end);
    bool whole = end == t.text.c_str() + t.text.size();
    bool overflow = errno == ERANGE && std::isinf(v);
    bool underflow_to_zero = errno == ERANGE && v == 0;  // a nonzero literal below the subnormals
    MF_USER_CHECK(whole && !overflow && !underflow_to_zero, ErrorKind::Parse,
                  "{}: {} is not a valid floating-point number{}", where(t), t.describe(),
                  whole ? " (out of the range of a double)" : "");
    return v;
  }

  // Re-throws a user error from the IR with this token's location.
  template <typename F>
  auto at(const Token& t, F&& f) {
    try {
      return f();
    } catch (const UserError& e) {
      throw UserError(e.kind(), fmt::format("{}: {}", where(t), e.message()));
    }
  }

  // ---- statements -----------------------------------------------------------------------
  // `alias %out into %in`: output %out updates input %in in place (Fusion::aliasOutputToInput).
  void aliasDecl() {
    next();
    const Token& out = expectKind(Token::Value, "an output name like %3");
    auto index = [&](const Token& t, const std::vector<TensorView*>& list, const char* what) {
      auto it = std::find(list.begin(), list.end(), lookup(t));
      MF_USER_CHECK(it != list.end(), ErrorKind::Value, "{}: alias: %{} is not {}", where(t), t.text, what);
      return static_cast<int64_t>(it - list.begin());
    };
    int64_t o = index(out, fusion_->outputs(), "an output (list it in `output` first)");
    MF_USER_CHECK(isIdent("into"), ErrorKind::Parse, "{}: expected 'into' but found {}", where(peek()),
                  peek().describe());
    next();
    const Token& in = expectKind(Token::Value, "an input name like %p");
    int64_t i = index(in, fusion_->inputs(), "an input");
    at(out, [&] { fusion_->aliasOutputToInput(o, i); });
  }

  // `reshard by bytes`: decompose-reshardings routes conversions by fewest bytes
  // (Fusion::reshardByBytes).
  void reshardDecl() {
    next();
    expectIdent("by");
    expectIdent("bytes");
    fusion_->setReshardByBytes(true);
  }

  void statement() {
    if (isIdent("mesh")) return meshDecl();
    if (isIdent("output")) return outputDecl();
    if (isIdent("alias")) return aliasDecl();
    if (isIdent("reshard")) return reshardDecl();
    const Token& name = expectKind(Token::Value, "'mesh', 'output', 'alias', 'reshard' or a value name like %3");
    MF_USER_CHECK(!names_.count(name.text), ErrorKind::Name, "{}: duplicate name %{}", where(name), name.text);
    expectPunct("=");
    names_[name.text] = isIdent("input") ? inputDef(name) : opDef(name);
  }

  // `output %a, %b`.
  void outputDecl() {
    next();
    do {
      const Token& t = expectKind(Token::Value, "a value name like %3");
      Val* v = lookup(t);
      MF_USER_CHECK(v->valKind() == ValKind::TensorView, ErrorKind::Value, "{}: output %{} is not a tensor", where(t),
                    t.text);
      at(t, [&] { fusion_->addOutput(static_cast<TensorView*>(v)); });
    } while (isPunct(",") && (next(), true));
  }

  // `%x = input f32[...]{placements}`: Partial (reduction) dims, if any, last.
  TensorView* inputDef(const Token& name) {
    next();
    ParsedType type = tensorType();
    std::vector<Extent> shape;
    bool after_reduction = false;
    for (const ParsedDim& d : type.dims) {
      MF_USER_CHECK(d.reduction || !after_reduction, ErrorKind::Parse,
                    "{}: reduction (Partial) dims of an input must come last", where(type.at));
      after_reduction |= d.reduction;
      if (!d.reduction) shape.push_back(d.extent);
    }
    TensorView* tv = at(name, [&] { return fusion_->defineTensor(shape, type.dtype, userName(name)); });
    for (const ParsedDim& d : type.dims) {
      if (!d.reduction) continue;
      MF_USER_CHECK(d.extent.isStatic(), ErrorKind::Parse, "{}: a Partial dim needs a constant extent", where(type.at));
      tv->addPartialDim(d.extent.value());
    }
    applySharding(tv, type);
    return tv;
  }

  // `%y = op(operands..., name=value...)` with an optional `: type` giving Partial dims and placements.
  TensorView* opDef(const Token& name) {
    const Token& op_tok = expectKind(Token::Ident, "'input' or an op name");
    std::optional<OpKind> kind = parseOpKind(op_tok.text);
    MF_USER_CHECK(kind.has_value(), ErrorKind::Parse, "{}: unknown op '{}'", where(op_tok), op_tok.text);
    const OpInfo& info = opInfo(*kind);
    std::vector<Val*> operands;
    Attributes attrs;
    arguments(info, operands, attrs);
    TensorView* out = at(op_tok, [&] { return fusion_->apply(*kind, operands, attrs, userName(name)); });
    if (isPunct(":")) {
      next();
      ParsedType type = tensorType();
      addPartialDims(out, type, info);
      applySharding(out, type);
    }
    return out;
  }

  // `(positional..., key=value...)`: a key names an operand or an attribute of the op.
  void arguments(const OpInfo& info, std::vector<Val*>& operands, Attributes& attrs) {
    bool named = false;  // a `name=` argument was seen: positional operands must come first
    expectPunct("(");
    while (!isPunct(")")) {
      if (!operands.empty() || !attrs.empty()) {
        if (!isPunct(",")) fail(peek(), "',' or ')'");
        next();
      }
      if (peek().kind == Token::Ident && peek(1).kind == Token::Punct && peek(1).text == "=") {
        namedArgument(info, operands, attrs);
        named = true;
      } else {
        MF_USER_CHECK(!named, ErrorKind::Parse, "{}: {}: a positional operand after named arguments", where(peek()),
                      info.name);
        operands.push_back(operandValue());
      }
    }
    expectPunct(")");
  }

  void namedArgument(const OpInfo& info, std::vector<Val*>& operands, Attributes& attrs) {
    const Token& key = next();
    next();
    int64_t operand = info.findOperand(key.text);
    if (operand >= 0) {
      MF_USER_CHECK(static_cast<size_t>(operand) >= operands.size() || operands[operand] == nullptr, ErrorKind::Parse,
                    "{}: {}: operand '{}' is given twice", where(key), info.name, key.text);
      const Token& vt = expectKind(Token::Value, "a value name");
      operands.resize(std::max<size_t>(operands.size(), operand + 1), nullptr);
      operands[operand] = lookup(vt);
      return;
    }
    const AttrSpec* spec = info.findAttr(key.text);
    MF_USER_CHECK(spec != nullptr, ErrorKind::Value, "{}: {} has no operand or attribute named '{}'", where(key),
                  info.name, key.text);
    MF_USER_CHECK(!attrs.count(key.text), ErrorKind::Parse, "{}: {}: attribute '{}' is given twice", where(key),
                  info.name, key.text);
    attrs[key.text] = attrValue(*spec);
  }

  void meshDecl() {
    expectIdent("mesh");
    const Token& name = expectKind(Token::Mesh, "a mesh name like @tp");
    MF_USER_CHECK(!meshes_.count(name.text), ErrorKind::Name, "{}: duplicate mesh name @{}", where(name), name.text);
    expectPunct("=");
    const Token& start = peek();
    std::vector<int64_t> devices, shape;
    int64_t leaf_depth = -1;
    nestedList(devices, shape, 0, leaf_depth);
    int64_t index = at(start, [&] { return fusion_->addMesh(DeviceMesh(devices, shape), name.text); });
    meshes_[name.text] = index;
  }

  // Parses a (possibly nested) list of device ids; records the shape and checks it is regular:
  // device ids all sit at one depth (leaf_depth), and lists at one depth have one length.
  int nestedList(std::vector<int64_t>& devices, std::vector<int64_t>& shape, size_t depth, int64_t& leaf_depth) {
    const Token& open = expectPunct("[");
    int64_t count = 0;
    while (!isPunct("]")) {
      if (count > 0) expectPunct(",");
      bool nested = isPunct("[");
      int64_t here = nested ? -2 : static_cast<int64_t>(depth);  // -2: not a leaf list
      MF_USER_CHECK(
          nested ? leaf_depth < 0 || leaf_depth > static_cast<int64_t>(depth) : leaf_depth < 0 || leaf_depth == here,
          ErrorKind::Mesh, "{}: malformed mesh: mixes device ids and nested lists", where(peek()));
      if (nested) {
        // Checked before recursing: a mesh nested thousands deep must not overflow the stack.
        MF_USER_CHECK(static_cast<int64_t>(depth) + 1 < DeviceMesh::kMaxRank, ErrorKind::Mesh,
                      "{}: malformed mesh: nested more than {} deep, but at most {} mesh axes (DIDz, DIDy, DIDx) are "
                      "supported",
                      where(peek()), DeviceMesh::kMaxRank, DeviceMesh::kMaxRank);
        nestedList(devices, shape, depth + 1, leaf_depth);
      } else {
        leaf_depth = here;
        devices.push_back(expectInt("a device id or '['"));
      }
      ++count;
    }
    expectPunct("]");
    if (shape.size() <= depth) shape.resize(depth + 1, -1);
    MF_USER_CHECK(shape[depth] == -1 || shape[depth] == count, ErrorKind::Mesh,
                  "{}: malformed mesh: ragged nesting (a list of {} where the first list at this level had {})",
                  where(open), count, shape[depth]);
    shape[depth] = count;
    return 0;
  }

  // ---- pieces ---------------------------------------------------------------------------
  std::string userName(const Token& t) const {
    bool numeric = std::all_of(t.text.begin(), t.text.end(), [](char c) { return c >= '0' && c <= '9'; });
    return numeric ? "" : t.text;
  }

  Val* lookup(const Token& t) {
    auto it = names_.find(t.text);
    MF_USER_CHECK(it != names_.end(), ErrorKind::Name, "{}: undefined value %{}", where(t), t.text);
    return it->second;
  }

  Val* operandValue() {
    const Token& t = peek();
    if (t.kind == Token::Value) return lookup(next());
    if (t.kind == Token::Int) return fusion_->scalar(static_cast<double>(intOf(next())), DataType::Int64);
    if (t.kind == Token::Float) return fusion_->scalar(floatOf(next()), DataType::Float);
    if (isIdent("true") || isIdent("false")) return fusion_->scalar(next().text == "true" ? 1.0 : 0.0, DataType::Bool);
    fail(t, "an operand (a value name or a number)");
  }

  AttrValue attrValue(const AttrSpec& spec) {
    const Token& t = peek();
    switch (spec.type) {
      case AttrType::Int: return static_cast<int64_t>(expectInt("an integer"));
      case AttrType::Float:
        if (t.kind == Token::Int || t.kind == Token::Float) return floatOf(next());
        fail(t, "a number");
      case AttrType::Bool:
        if (isIdent("true") || isIdent("false")) return next().text == "true";
        fail(t, "true or false");
      case AttrType::Str: return expectKind(Token::String, "a string").text;
      case AttrType::Dtype: {
        const Token& d = expectKind(Token::Ident, "a dtype (f32, bf16, f16, i64, bool)");
        std::optional<DataType> dt = parseDtype(d.text);
        MF_USER_CHECK(dt.has_value(), ErrorKind::Dtype, "{}: unknown dtype '{}' (expected f32, bf16, f16, i64 or bool)",
                      where(d), d.text);
        return *dt;
      }
      case AttrType::Ints: {
        std::vector<int64_t> v;
        expectPunct("[");
        while (!isPunct("]")) {
          if (!v.empty()) expectPunct(",");
          v.push_back(expectInt("an integer"));
        }
        expectPunct("]");
        return v;
      }
    }
    fail(t, "an attribute value");
  }

  ParsedType tensorType() {
    ParsedType p;
    p.at = peek();
    const Token& d = expectKind(Token::Ident, "a dtype (f32, bf16, f16, i64, bool)");
    std::optional<DataType> dt = parseDtype(d.text);
    MF_USER_CHECK(dt.has_value(), ErrorKind::Dtype, "{}: unknown dtype '{}' (expected f32, bf16, f16, i64 or bool)",
                  where(d), d.text);
    p.dtype = *dt;
    expectPunct("[");
    while (!isPunct("]")) {
      if (!p.dims.empty()) expectPunct(",");
      p.dims.push_back(dim());
    }
    expectPunct("]");
    if (peek().kind == Token::Mesh) {
      p.has_mesh = true;
      p.mesh = next();
    }
    if (isPunct("{")) {
      next();
      while (!isPunct("}")) {
        if (!p.steps.empty()) expectPunct(",");
        p.steps.push_back(step());
      }
      expectPunct("}");
    }
    if (isIdent("from")) {
      next();
      p.has_provenance = true;
      p.provenance = expectKind(Token::String, "a provenance string").text;
    }
    return p;
  }

  ParsedDim dim() {
    ParsedDim d;
    const Token& t = peek();
    if (t.kind == Token::Int) {
      d.extent = Extent(intOf(next()));
      return d;
    }
    if (t.kind == Token::Ident && t.text.size() > 1 && t.text[0] == 'r' &&
        std::all_of(t.text.begin() + 1, t.text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      Token digits = next();
      digits.text = digits.text.substr(1);
      d.reduction = true;
      d.extent = Extent(intOf(digits));
      return d;
    }
    if (t.kind == Token::Ident && t.text == "r") {  // r?t
      next();
      d.reduction = true;
    }
    if (!isPunct("?")) fail(peek(), "a dim (64, ?t, r64)");
    next();
    std::string sym = expectKind(Token::Ident, "a size name after '?'").text;
    int64_t num = 1, den = 1;
    if (isPunct("*")) {
      next();
      num = expectInt("an integer factor");
    }
    if (isPunct("/")) {
      next();
      den = expectInt("an integer divisor");
    }
    MF_USER_CHECK(num > 0 && den > 0, ErrorKind::Parse, "{}: size factors must be positive", where(t));
    d.extent = Extent::symbolic(sym, num, den);
    return d;
  }

  std::pair<Token, ScheduleStep> step() {
    const Token& t = expectKind(Token::Ident, "split, merge or parallelize");
    ScheduleStep s{};
    expectPunct("(");
    s.axis = expectInt("an axis");
    if (t.text == "split") {
      s.kind = ScheduleStep::Split;
      expectPunct(",");
      s.factor = expectInt("a split factor");
      if (isPunct(",")) {
        next();
        expectIdent("inner");
        s.inner_split = true;
      }
    } else if (t.text == "merge") {
      s.kind = ScheduleStep::Merge;
    } else if (t.text == "parallelize") {
      s.kind = ScheduleStep::Parallelize;
      expectPunct(",");
      const Token& pt = expectKind(Token::Ident, "a parallel type (DIDx, DIDy, DIDz, Stream, Serial)");
      std::optional<ParallelType> p = parseParallelType(pt.text);
      MF_USER_CHECK(p.has_value(), ErrorKind::Parse,
                    "{}: unknown parallel type '{}' (expected DIDx, DIDy, DIDz, Stream or Serial)", where(pt), pt.text);
      s.ptype = *p;
    } else {
      fail(t, "split, merge or parallelize");
    }
    expectPunct(")");
    return {t, s};
  }

  void applySharding(TensorView* tv, const ParsedType& type) {
    if (type.has_mesh) {
      auto it = meshes_.find(type.mesh.text);
      MF_USER_CHECK(it != meshes_.end(), ErrorKind::Name, "{}: undefined mesh @{}", where(type.mesh), type.mesh.text);
      at(type.mesh, [&] { tv->setDeviceMesh(fusion_->mesh(it->second)); });
    }
    for (const auto& step : type.steps) at(step.first, [&] { tv->applyStep(step.second); });
    if (type.has_mesh) {
      tv->setPinned(!type.has_provenance);
      tv->setProvenance(Provenance::literal(type.has_provenance ? type.provenance : ""));
    }
  }

  // The annotation must match the inferred type, except for trailing reduction dims beyond it:
  // those are Partial (pending-sum) dims of the op's output placement.
  void addPartialDims(TensorView* out, const ParsedType& type, const OpInfo& info) {
    auto dimText = [](bool reduction, const Extent& e) { return (reduction ? "r" : "") + e.toString(); };
    std::vector<std::string> dims;
    for (const ParsedDim& d : type.dims) dims.push_back(dimText(d.reduction, d.extent));
    std::string written = fmt::format("{}[{}]", dtypeName(type.dtype), fmt::join(dims, ", "));
    std::vector<std::string> inferred_dims;
    for (const IterDomain* id : out->logical()) inferred_dims.push_back(dimText(id->isReduction(), id->extent()));
    std::string inferred = fmt::format("{}[{}]", dtypeName(out->dtype()), fmt::join(inferred_dims, ", "));
    size_t n = inferred_dims.size();
    bool matches = type.dtype == out->dtype() && dims.size() >= n &&
                   std::equal(inferred_dims.begin(), inferred_dims.end(), dims.begin());
    for (size_t i = n; matches && i < type.dims.size(); ++i)
      matches = type.dims[i].reduction && type.dims[i].extent.isStatic();
    MF_USER_CHECK(matches, ErrorKind::Shape, "{}: the annotated type {} does not match the type {} that {} produces",
                  where(type.at), written, inferred, info.name);
    for (size_t i = n; i < type.dims.size(); ++i) out->addPartialDim(type.dims[i].extent.value());
  }

  std::string file_;
  std::vector<Token> toks_;
  size_t pos_ = 0;
  std::unique_ptr<Fusion> fusion_;
  std::map<std::string, Val*> names_;
  std::map<std::string, int64_t> meshes_;
};

}  // namespace

std::unique_ptr<Fusion> parseFusion(std::string_view text, std::string_view filename) {
  return Parser(text, filename).parse();
}

}  // namespace meshfuse
