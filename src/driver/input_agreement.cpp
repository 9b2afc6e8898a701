// Do the ranks agree on what they were given? (input_agreement.h)
#include "driver/input_agreement.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>

#include "meshfuse/error.h"
#include "meshfuse/executor.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/placement.h"

namespace meshfuse {
namespace {

std::string clean(std::string s) {
  std::replace(s.begin(), s.end(), '\t', ' ');
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

std::string encode(const AgreementFields& fields) {
  std::string out;
  for (const auto& [label, value] : fields) out += (out.empty() ? "" : "\n") + clean(label) + "\t" + clean(value);
  return out;
}

AgreementFields decode(const std::string& data) {
  AgreementFields fields;
  size_t start = 0;
  while (start < data.size()) {
    size_t end = data.find('\n', start);
    if (end == std::string::npos) end = data.size();
    const std::string line = data.substr(start, end - start);
    const size_t tab = line.find('\t');
    if (tab != std::string::npos) fields.emplace_back(line.substr(0, tab), line.substr(tab + 1));
    start = end + 1;
  }
  return fields;
}

int64_t digest(const std::string& data) {  // FNV-1a: the same on every rank and build
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : data) h = (h ^ c) * 1099511628211ull;
  return static_cast<int64_t>(h);
}

std::string ranksText(const std::vector<int64_t>& ranks) {
  return fmt::format("rank{} {}", ranks.size() == 1 ? "" : "s", fmt::join(ranks, ", "));
}

// Every rank's `count` int64 values (`mine` on this rank), in team order.
std::vector<int64_t> allgatherInt64(Communicator& comm, Backend& backend, const std::vector<int64_t>& mine,
                                    const Team& team) {
  const int64_t count = static_cast<int64_t>(mine.size());
  Tensor host(DataType::Int64, {count});
  std::memcpy(host.data(), mine.data(), mine.size() * sizeof(int64_t));
  // Host memory for a host backend (not the backend's allocator, whose use is the program's);
  // device memory where the communicator moves device buffers.
  const bool host_backend = backend.device() == Device::Cpu;
  Tensor send = host_backend ? host : backend.upload(host);
  const int64_t all = count * static_cast<int64_t>(team.size());
  Tensor recv = host_backend ? Tensor(DataType::Int64, {all}) : backend.allocate(DataType::Int64, {all});
  comm.allgather(send.data(), recv.data(), count, DataType::Int64, team)->wait();
  Tensor got = recv.device() == Device::Cpu ? recv : backend.download(recv);
  const int64_t* p = static_cast<const int64_t*>(got.data());
  return std::vector<int64_t>(p, p + all);
}

}  // namespace

std::string describeDisagreement(const std::vector<std::pair<int64_t, AgreementFields>>& per_rank) {
  // A rank that failed is the news, not the fields the others passed.
  std::map<std::string, std::vector<int64_t>> failed;
  for (const auto& [rank, fields] : per_rank)
    for (const auto& [label, value] : fields)
      if (label == "error") failed[value].push_back(rank);
  if (!failed.empty()) {
    std::vector<std::string> parts;
    for (const auto& [message, ranks] : failed)
      parts.push_back(fmt::format("{} failed: {}", ranksText(ranks), message));
    return fmt::format("{}", fmt::join(parts, "; "));
  }
  // Label by label, in the order the ranks list them: which ranks have which value.
  std::vector<std::string> labels;
  for (const auto& [rank, fields] : per_rank)
    for (const auto& [label, value] : fields)
      if (std::find(labels.begin(), labels.end(), label) == labels.end()) labels.push_back(label);
  std::vector<std::string> diffs;
  for (const std::string& label : labels) {
    std::vector<std::pair<std::string, std::vector<int64_t>>> values;  // in order of first appearance
    for (const auto& [rank, fields] : per_rank) {
      auto it = std::find_if(fields.begin(), fields.end(), [&](const auto& f) { return f.first == label; });
      const std::string value = it == fields.end() ? "(missing)" : it->second;
      if (value == "?") continue;  // not known on that rank: agrees with any value
      auto v = std::find_if(values.begin(), values.end(), [&](const auto& x) { return x.first == value; });
      if (v == values.end()) {
        values.push_back({value, {rank}});
      } else {
        v->second.push_back(rank);
      }
    }
    if (values.size() < 2) continue;
    // The usual value: that of the most ranks (ties: the one the lowest rank has).
    auto usual = std::max_element(values.begin(), values.end(), [](const auto& a, const auto& b) {
      return a.second.size() != b.second.size() ? a.second.size() < b.second.size() : a.second[0] > b.second[0];
    });
    for (const auto& [value, ranks] : values)
      if (value != usual->first)
        diffs.push_back(fmt::format("{} is {} on {} but {} on {}", label, value, ranksText(ranks), usual->first,
                                    ranksText(usual->second)));
  }
  return diffs.empty() ? "" : fmt::format("the ranks disagree: {}", fmt::join(diffs, "; "));
}

void agreeOnFields(Communicator& comm, Backend& backend, const std::string& what, const AgreementFields& fields,
                   const Team& team) {
  const std::string data = encode(fields);
  const std::vector<int64_t> heads =
      allgatherInt64(comm, backend, {digest(data), static_cast<int64_t>(data.size())}, team);
  bool same = true;
  int64_t longest = 0;
  for (size_t r = 0; r < team.size(); ++r) {
    same &= heads[2 * r] == heads[0];
    longest = std::max(longest, heads[2 * r + 1]);
  }
  if (same) return;
  std::vector<int64_t> words(static_cast<size_t>((longest + 7) / 8), 0);
  std::memcpy(words.data(), data.data(), data.size());
  const std::vector<int64_t> bodies = allgatherInt64(comm, backend, words, team);
  std::vector<std::pair<int64_t, AgreementFields>> per_rank;
  for (size_t r = 0; r < team.size(); ++r) {
    const char* body = reinterpret_cast<const char*>(bodies.data() + r * words.size());
    per_rank.emplace_back(team[r], decode(std::string(body, static_cast<size_t>(heads[2 * r + 1]))));
  }
  const std::string why = describeDisagreement(per_rank);
  MF_USER_CHECK(why.empty(), ErrorKind::Value, "{}: {}", what, why);
}

// ---- MultiDeviceExecutor::agreeOnInputs (ExecutorOptions::check_inputs) ---------------------------

namespace {

// The shape of `rank`'s block of a tensor of global `shape` laid out as `in` (torch.chunk's
// blocks), or nullopt when the layout does not fit the shape (the run names that error).
std::optional<std::vector<int64_t>> blockShape(const ShardedTensor& in, const std::vector<int64_t>& shape,
                                               int64_t rank) {
  try {
    Fusion f;
    TensorView* tv = f.defineTensor(std::vector<Extent>(shape.begin(), shape.end()), DataType::Float, "x");
    applyPlacements(tv, in.mesh, in.placements);
    return localShape(tv, {}, rank);
  } catch (const UserError&) {
    return std::nullopt;
  }
}

// What a rank says about each input, in words every rank given the same inputs says alike: a rank
// outside an input's mesh (no local block) states the dtype the definition expects, and the global
// shape only when it was given one ("?": it agrees with any). A local block that is not this
// rank's block of the global shape (uneven shards: torch.chunk's) is said too, so that every
// rank raises the error, not the one given the odd block alone.
AgreementFields describeInputs(const Fusion& definition, const std::vector<ShardedTensor>& inputs, int64_t rank) {
  AgreementFields fields = {{"number of inputs", std::to_string(inputs.size())}};
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ShardedTensor& in = inputs[i];
    const TensorView* tv = i < definition.inputs().size() ? definition.inputs()[i] : nullptr;
    const std::string label =
        fmt::format("input {}", i) + (tv != nullptr ? fmt::format(" ({})", definition.displayName(tv)) : "");
    const bool held = in.local.defined();
    fields.emplace_back(label + " dtype", held            ? std::string(dtypeName(in.local.dtype()))
                                          : tv != nullptr ? std::string(dtypeName(tv->dtype()))
                                                          : "?");
    fields.emplace_back(label + " placements",
                        in.mesh.size() == 0
                            ? "none (as the definition says)"
                            : fmt::format("{} on mesh {}", placementsToString(in.placements), in.mesh.toString()));
    std::vector<int64_t> global = in.global_shape;
    bool known = !global.empty();
    if (!known && held) {  // the local block times the shards along each dim
      global = in.local.shape();
      known = in.placements.size() == static_cast<size_t>(in.mesh.rank());
      for (size_t a = 0; known && a < in.placements.size(); ++a) {
        const Placement& p = in.placements[a];
        if (p.kind != Placement::Shard) continue;
        const int64_t d = p.dim < 0 ? p.dim + static_cast<int64_t>(global.size()) : p.dim;
        known = d >= 0 && d < static_cast<int64_t>(global.size());
        if (known) global[d] *= in.mesh.size(static_cast<int64_t>(a));
      }
      if (!known) {  // placements that do not fit: say the local shape (the run names the error)
        fields.emplace_back(label + " local shape", fmt::format("[{}]", fmt::join(in.local.shape(), ", ")));
        continue;
      }
      // A static size is the definition's, whatever the blocks imply (uneven blocks of it are
      // checked below, on every rank alike).
      if (tv != nullptr && tv->rank() == static_cast<int64_t>(global.size()))
        for (size_t d = 0; d < global.size(); ++d)
          if (tv->shape()[d].isStatic()) global[d] = tv->shape()[d].value();
    }
    std::string shape = known ? fmt::format("[{}]", fmt::join(global, ", ")) : "?";
    if (known && held && in.mesh.size() > 0)
      if (std::optional<std::vector<int64_t>> want = blockShape(in, global, rank); want && *want != in.local.shape())
        shape += fmt::format(" with local shape [{}] (not [{}])", fmt::join(in.local.shape(), ", "),
                             fmt::join(*want, ", "));
    fields.emplace_back(label + " global shape", shape);
  }
  return fields;
}

// A cheap key of what describeInputs() depends on (checked once per key).
uint64_t signatureOf(const std::vector<ShardedTensor>& inputs) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](int64_t v) { h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull; };
  mix(static_cast<int64_t>(inputs.size()));
  for (const ShardedTensor& in : inputs) {
    mix(in.local.defined() ? static_cast<int64_t>(in.local.dtype()) : -1);
    if (in.local.defined())
      for (int64_t s : in.local.shape()) mix(s);
    mix(-2);
    for (int64_t s : in.global_shape) mix(s);
    mix(-3);
    for (int64_t d : in.mesh.devices()) mix(d);
    mix(-4);
    for (int64_t s : in.mesh.shape()) mix(s);
    mix(-5);
    for (const Placement& p : in.placements) mix(static_cast<int64_t>(p.kind) * 1000 + p.dim);
    mix(-6);
  }
  return h;
}

}  // namespace

void MultiDeviceExecutor::agreeOnInputs(const std::vector<ShardedTensor>& inputs) {
  const uint64_t key = signatureOf(inputs);
  if (agreed_.count(key)) return;
  Team world(static_cast<size_t>(comm_.size()));
  for (size_t r = 0; r < world.size(); ++r) world[r] = static_cast<int64_t>(r);
  agreeOnFields(comm_, *backend_, "MultiDeviceExecutor", describeInputs(*definition_, inputs, comm_.rank()), world);
  agreed_.insert(key);
}

}  // namespace meshfuse
