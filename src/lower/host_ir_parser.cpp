// The host-IR text parser: reads printHostModule's text (grammar in docs/host-ir.md).
//
// The file holds the decomposed fusion, then `hostir [rank R] { inputs ... ; NODES ; outputs ... }`.
// Nodes name the fusion's tensors by their printed names and its segments by index (the fusion
// is segmented as lower-to-host-ir segments it). Each node line is read into a HostNode and then
// printed again: a line that does not print back as written (a wrong type, segment call or
// name) is a ParseError quoting both, so what parses is exactly what the printer writes.
#include <algorithm>
#include <cctype>
#include <map>
#include <optional>

#include "lower/lower_segment.h"
#include "meshfuse/error.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/parser.h"

namespace meshfuse {
namespace {

struct Line {
  int64_t number = 0;
  std::string text;  // without indentation
};

std::string trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
  return b == std::string_view::npos ? std::string() : std::string(s.substr(b, e - b + 1));
}

// Reads one line's tokens; every failure names the file, the line and the text.
class Cursor {
 public:
  Cursor(const Line& line, std::string_view path) : line_(line), path_(path), s_(line.text) {}

  [[noreturn]] void fail(const std::string& what) const {
    userError(ErrorKind::Parse, "{}:{}: {} in `{}`", path_, line_.number, what, line_.text);
  }
  void spaces() {
    while (pos_ < s_.size() && s_[pos_] == ' ') ++pos_;
  }
  bool done() {
    spaces();
    return pos_ == s_.size();
  }
  char peek() {
    spaces();
    return pos_ < s_.size() ? s_[pos_] : '\0';
  }
  bool eat(std::string_view token) {
    spaces();
    if (s_.substr(pos_, token.size()) != token) return false;
    pos_ += token.size();
    return true;
  }
  void expect(std::string_view token) {
    if (!eat(token)) fail(fmt::format("expected '{}'", token));
  }
  int64_t integer() {
    spaces();
    size_t start = pos_;
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    if (pos_ == start || s_[pos_ - 1] == '-') fail("expected an integer");
    return std::stoll(std::string(s_.substr(start, pos_ - start)));
  }
  std::string word() {  // letters, digits, '_' and '.'
    spaces();
    size_t start = pos_;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_' ||
                                s_[pos_] == '.'))
      ++pos_;
    if (pos_ == start) fail("expected a name");
    return std::string(s_.substr(start, pos_ - start));
  }
  std::string_view rest() {
    spaces();
    return s_.substr(pos_);
  }
  // Moves past the next `ch` (to the end when there is none).
  void skipPast(char ch) {
    size_t at = s_.find(ch, pos_);
    pos_ = at == std::string_view::npos ? s_.size() : at + 1;
  }

 private:
  const Line& line_;
  std::string_view path_;
  std::string_view s_;
  size_t pos_ = 0;
};

// An index as indexExpr prints it: "2*i0 - 2*r + i1 - 2". `i` is the one loop variable of a
// single-coefficient index; `iK` the K-th of the `depth` enclosing loops.
struct Index {
  std::vector<int64_t> loop_coeffs;
  int64_t rank_coeff = 0, offset = 0;
  int64_t rank_axis = -1;  // the mesh axis of the rank index: `r` is axis 0, `rK` axis K
};

bool isDigit(char d) { return std::isdigit(static_cast<unsigned char>(d)) != 0; }

Index parseIndex(Cursor& c, size_t depth) {
  Index x;
  int64_t sign = c.eat("-") ? -1 : 1;
  while (true) {
    int64_t coeff = 1;
    const bool number = std::isdigit(static_cast<unsigned char>(c.peek()));
    if (number) coeff = c.integer();
    if (!number || c.eat("*")) {
      std::string var = c.word();
      if (var[0] == 'r' && std::all_of(var.begin() + 1, var.end(), isDigit)) {
        const int64_t axis = var.size() == 1 ? 0 : std::stoll(var.substr(1));
        if (x.rank_axis >= 0 && x.rank_axis != axis) c.fail("an index over the rank along two mesh axes");
        x.rank_axis = axis;
        x.rank_coeff += sign * coeff;
      } else if (var == "i") {
        x.loop_coeffs.resize(std::max<size_t>(x.loop_coeffs.size(), 1));
        x.loop_coeffs[0] += sign * coeff;
      } else if (var.size() > 1 && var[0] == 'i' && std::all_of(var.begin() + 1, var.end(), isDigit)) {
        size_t k = std::stoul(var.substr(1));
        if (k >= depth) c.fail(fmt::format("loop variable {} outside {} loops", var, depth));
        x.loop_coeffs.resize(depth);
        x.loop_coeffs[k] += sign * coeff;
      } else {
        c.fail(fmt::format("unknown index variable '{}'", var));
      }
    } else {
      x.offset += sign * coeff;
    }
    if (c.eat("+")) {
      sign = 1;
    } else if (c.eat("-")) {
      sign = -1;
    } else {
      return x;
    }
  }
}

class HostParser {
 public:
  HostParser(HostProgram& p, std::string_view path) : p_(p), path_(path) {
    for (const TensorView* tv : p.fusion->tensorViews()) tensors_[p.fusion->displayName(tv)] = tv;
  }

  // Reads nodes from lines_[next_] up to a closing `}` at `depth` (or the `outputs` line at 0).
  std::vector<HostNode> nodes(size_t depth) {
    std::vector<HostNode> out;
    while (next_ < lines_.size()) {
      const Line& line = lines_[next_];
      if (line.text == "}" || (depth == 0 && line.text.starts_with("outputs"))) return out;
      ++next_;
      out.push_back(node(line, depth));
    }
    userError(ErrorKind::Parse, "{}: the host program ends inside a loop or without its outputs line", path_);
  }

  std::vector<Line> lines_;
  size_t next_ = 0;

 private:
  BlockRef ref(Cursor& c, size_t depth) {
    c.expect("%");
    std::string name = "%" + c.word();
    auto it = tensors_.find(name);
    if (it == tensors_.end()) c.fail(fmt::format("unknown tensor {}", name));
    BlockRef b = BlockRef::of(it->second, c.eat("~") ? c.integer() : 0);
    if (!c.eat("[")) return b;
    Index x;
    if (c.eat("(")) {
      x = parseIndex(c, depth);
      c.expect(")");
      c.expect("%");
      c.integer();  // (the block count, repeated after `of`)
    } else {
      x = parseIndex(c, depth);
    }
    c.expect("of");
    b.blocks = c.integer();
    if (c.eat("x")) {  // "of 2x4": 2 blocks of 4 sub-blocks
      b.sub_blocks = c.integer();
      b.blocks *= b.sub_blocks;
    }
    b.heads = c.eat("heads");  // "of 4 heads": a head group
    if (b.heads) checkHeadGroups(c, b.tv, b.blocks);
    c.expect("]");
    b.loop_coeffs = x.loop_coeffs;
    b.rank_coeff = x.rank_coeff;
    b.offset = x.offset;
    if (x.rank_coeff != 0) b.mesh_axis = x.rank_axis;
    return b;
  }

  // Head groups (BlockRef::heads, BufferNode::head_groups) cut a tensor's static [batch, heads]
  // into groups of whole heads of one batch entry or of whole batch entries (headGroupShape).
  void checkHeadGroups(Cursor& c, const TensorView* tv, int64_t groups) const {
    const std::vector<Extent> s = tv->allocatedShape();
    const std::string what = fmt::format("{} head groups of {}", groups, tv->fusion()->displayName(tv));
    if (s.size() < 2 || !s[0].isStatic() || !s[1].isStatic()) c.fail(what + ", whose [batch, heads] are not static");
    const int64_t heads = s[1].value(), all = s[0].value() * heads;
    if (groups < 1 || all % groups != 0 || (heads % (all / groups) != 0 && (all / groups) % heads != 0))
      c.fail(fmt::format("{}: its {} (batch, head) pairs ([batch {}, heads {}]) do not split into {} groups of whole "
                         "heads of one batch entry or whole batch entries",
                         what, all, s[0].value(), heads, groups));
  }

  hir::EventNode event(Cursor& c, size_t depth) {
    hir::EventNode n;
    c.expect("e");
    n.event = c.integer();
    c.expect("[");
    Index x = parseIndex(c, depth);
    if (x.rank_coeff != 0) c.fail("an event index cannot use the rank index r");
    n.coeffs = x.loop_coeffs;
    n.offset = x.offset;
    c.expect("]");
    return n;
  }

  void segmentCall(Cursor& c, hir::SegmentCall& n, size_t depth) {
    c.expect("#");
    n.segment = c.integer();
    if (n.segment < 0 || n.segment >= static_cast<int64_t>(p_.segments->size()))
      c.fail(fmt::format("segment #{} does not exist (the fusion has {} segments)", n.segment, p_.segments->size()));
    if (!c.eat("(")) return;  // "%y = op(...)": the whole tensors
    const Segment& seg = p_.segment(n);
    std::vector<BlockRef> views;
    for (bool outs : {false, true}) {
      if (outs) c.expect("-> (");
      if (c.eat(")")) continue;  // (a segment without inputs: a constant)
      do views.push_back(ref(c, depth));
      while (c.eat(","));
      c.expect(")");
    }
    if (views.size() != seg.inputs.size() + seg.outputs.size())
      c.fail(fmt::format("segment #{} has {} inputs and {} outputs", n.segment, seg.inputs.size(),
                         seg.outputs.size()));
    // Whole tensors, in the segment's order, print the same with or without views; a segment of
    // one expr prints `=` without them, so views were given.
    bool plain = seg.exprs.size() > 1 && views.size() == seg.inputs.size() + seg.outputs.size();
    for (size_t i = 0; plain && i < views.size(); ++i) {
      const TensorView* tv = i < seg.inputs.size() ? seg.inputs[i] : seg.outputs[i - seg.inputs.size()];
      plain = views[i].whole() && views[i].slot == 0 && views[i].tv == tv;
    }
    if (!plain) n.views = std::move(views);
    c.skipPast('}');  // "{ops}": checked by printing the node again
    n.accumulate = c.eat("accumulate");
    if (c.eat("rows (")) {
      n.query_blocks = refs(c, depth);
      c.expect("keys (");
      n.key_blocks = refs(c, depth);
    }
  }

  // "A, B)": block references up to a closing parenthesis.
  std::vector<BlockRef> refs(Cursor& c, size_t depth) {
    std::vector<BlockRef> out;
    do out.push_back(ref(c, depth));
    while (c.eat(","));
    c.expect(")");
    return out;
  }

  hir::Communication communication(Cursor& c, size_t depth) {
    hir::Communication n;
    c.expect("h");
    n.handle = c.integer();
    std::string kind = c.word();
    bool known = false;
#define MESHFUSE_X(e, s)      \
  if (kind == s) {            \
    n.kind = CommKind::e;     \
    known = true;             \
  }
    MESHFUSE_COMM_KINDS(MESHFUSE_X)
#undef MESHFUSE_X
    if (!known) c.fail(fmt::format("unknown communication '{}'", kind));
    n.in = ref(c, depth);
    c.expect("->");
    n.out = ref(c, depth);
    while (!c.done()) {
      if (c.eat("shift")) n.shift = c.integer();
      else if (c.eat("mirror")) n.mirror = true;
      else if (c.eat("along dim")) n.in_dim = c.integer();
      else if (c.eat("to rank")) n.send_to = c.integer();
      else if (c.eat("from rank")) n.recv_from = c.integer();
      else if (c.eat("axis")) n.mesh_axis = c.integer();
      else if (c.eat("from dim")) n.in_dim = c.integer();
      else if (c.eat("to dim")) n.out_dim = c.integer();
      else if (c.eat("root")) n.root = c.integer();
      else if (c.eat("team [")) {
        if (!c.eat("]")) {
          do n.team.push_back(c.integer());
          while (c.eat(","));
          c.expect("]");
        }
      } else c.fail("unexpected text");
    }
    return n;
  }

  HostNode loop(Cursor& c, size_t depth) {
    hir::ForLoop n;
    c.word();  // the variable's name: the printer derives it from the nesting
    c.expect("in [0,");
    n.trip_count = c.integer();
    c.expect(")");
    if (c.eat("on")) {
      n.stream_pool = c.integer();
      c.expect("streams");
    }
    c.expect("{");
    n.body = nodes(depth + 1);
    if (next_ == lines_.size()) userError(ErrorKind::Parse, "{}: a loop is not closed", path_);
    ++next_;  // its `}`
    return n;
  }

  HostNode buffer(Cursor& c, const std::string& head, size_t depth) {
    BlockRef b = ref(c, depth);
    if (!b.whole()) c.fail("an allocation is of a whole buffer");
    hir::BufferNode n{b.tv, b.slot, 1, 1};
    if (head == "deallocate") return hir::Deallocate{n};
    if (std::string_view r = c.rest(); r.find("(one head group of ") != r.npos) {
      n.head_groups = std::stoll(std::string(r.substr(r.find("(one head group of ") + 19)));
      checkHeadGroups(c, n.tv, n.head_groups);
    } else if (r.find("(one block of ") != r.npos) {
      n.chunk_blocks = std::stoll(std::string(r.substr(r.find("(one block of ") + 14)));
    } else if (const size_t at = r.find("(chunk i of "); at != r.npos) {
      // "(chunk i of 4 of each of 2 blocks)"
      std::string_view counts = r.substr(at + 12);
      n.chunk_blocks = std::stoll(std::string(counts));
      const size_t each = counts.find(" of each of ");
      if (each == counts.npos) c.fail("expected \"(chunk i of C of each of N blocks)\"");
      n.row_blocks = std::stoll(std::string(counts.substr(each + 12)));
    }
    return hir::Allocate{n};
  }

  template <typename Call>
  HostNode call(Cursor& c, size_t depth) {
    Call n;
    segmentCall(c, n, depth);
    return n;
  }

  HostNode node(const Line& line, size_t depth);

  HostProgram& p_;
  std::string_view path_;
  std::map<std::string, const TensorView*, std::less<>> tensors_;
};


HostNode HostParser::node(const Line& line, size_t depth) {
  Cursor c(line, path_);
  std::string head = c.word();
  if (head == "for") return loop(c, depth);
  std::optional<HostNode> n;
  if (head == "allocate" || head == "deallocate") {
    n = buffer(c, head, depth);
  } else if (head == "gemm") {
    n = call<hir::Gemm>(c, depth);
  } else if (head == "launch") {
    n = call<hir::LaunchKernel>(c, depth);
  } else if (head == "comm") {
    n = communication(c, depth);
  } else if (head == "wait") {
    c.expect("h");
    n = hir::Wait{c.integer()};
  } else if (head == "slice") {
    hir::ShardSlice s;
    s.out = ref(c, depth);
    c.expect("=");
    s.in = ref(c, depth);
    if (c.eat("partial")) {
      s.out_dim = hir::ShardSlice::kPartition;
    } else {
      c.expect("dim");
      s.out_dim = c.integer();
    }
    c.expect("axis");
    s.mesh_axis = c.integer();
    n = s;
  } else if (head == "copy" || head == "add") {
    hir::Copy s;
    s.accumulate = head == "add";
    s.in = ref(c, depth);
    c.expect("->");
    s.out = ref(c, depth);
    if (c.eat("along dim")) s.along_dim = c.integer();
    n = s;
  } else if (head == "stream") {
    hir::SetCurrentStream s;
    s.stream = c.integer();
    if (c.eat("+ i %")) s.stream_pool = c.integer();
    n = s;
  } else if (head == "record") {
    n = hir::RecordEvent{event(c, depth)};
  } else if (head == "wait_event") {
    n = hir::WaitEvent{event(c, depth)};
  } else if (head == "host_wait") {
    n = hir::HostWaitEvent{event(c, depth)};
  } else if (head == "sync") {
    n = hir::Synchronize{};
  } else {
    c.fail(fmt::format("unknown host node '{}'", head));
  }
  if (std::string printed = printHostNode(p_, *n); printed != line.text)
    c.fail(fmt::format("the node reads as `{}`, which is not what is written", printed));
  return std::move(*n);
}

}  // namespace

HostProgram parseHostModule(std::string_view text, std::string_view path) {
  // The fusion is everything before the line that starts the host program.
  std::vector<Line> lines;
  size_t start = std::string_view::npos, offset = 0;
  for (int64_t number = 1; offset <= text.size(); ++number) {
    size_t end = std::min(text.find('\n', offset), text.size());
    std::string t = trim(text.substr(offset, end - offset));
    if (start == std::string_view::npos && t.starts_with("hostir")) start = offset;
    if (start != std::string_view::npos && !t.empty() && t[0] != '#') lines.push_back({number, t});
    offset = end + 1;
  }
  MF_USER_CHECK(start != std::string_view::npos, ErrorKind::Parse,
                "{}: no host program (a line `hostir {{` or `hostir rank R {{` after the fusion)", path);
  HostProgram p;
  p.fusion = std::shared_ptr<Fusion>(parseFusion(text.substr(0, start), path));
  p.segments = std::make_shared<const std::vector<Segment>>(hostSegments(*p.fusion));
  Cursor header(lines[0], path);
  header.expect("hostir");
  if (header.eat("rank")) p.rank = header.integer();
  header.expect("{");
  if (!header.done()) header.fail("unexpected text");
  HostParser parser(p, path);
  parser.lines_ = std::move(lines);
  parser.next_ = 2;  // (the inputs line is checked with the whole text below)
  p.nodes = parser.nodes(0);
  // What parsed prints as the text read: the header, inputs and outputs lines, loop variables.
  std::string printed = p.toString();
  std::vector<std::string> expected;
  for (size_t o = 0; o < printed.size(); o = printed.find('\n', o) + 1)
    expected.push_back(trim(std::string_view(printed).substr(o, printed.find('\n', o) - o)));
  for (size_t i = 0; i < std::max(expected.size(), parser.lines_.size()); ++i) {
    const Line& got = parser.lines_.at(std::min(i, parser.lines_.size() - 1));
    MF_USER_CHECK(i < expected.size() && i < parser.lines_.size() && got.text == expected[i], ErrorKind::Parse,
                  "{}:{}: the host program reads back as `{}` here, not `{}`", path, got.number,
                  i < expected.size() ? expected[i] : "(its end)", i < parser.lines_.size() ? got.text : "(its end)");
  }
  return p;
}

}  // namespace meshfuse
