// `refit ceiling`: measures one copy ceiling now (refit/ceilings.h) and
// prints {"ceiling", "bytes", "gbps", ...} as one JSON line: "memcpy" (one
// host thread), "h2d" (pinned host to device 0), "d2d" (device 0 to device
// 0), "peer" (device --from to device --to; also "from", "to", "both_ways",
// "peer_access"; or over --pairs: "pairs", "peer_access"). The best of 5
// after a warm-up. Scripts that benchmark several processes
// (bench/push_bench.sh, bench/multi_gpu.sh) call it in the same run.
// Fails (exit 1) when the kind cannot be measured here, e.g. peer with fewer
// than two visible devices.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "command.h"
#include "flags.h"
#include "refit/ceilings.h"

namespace refit::cli {
namespace {

using Json = nlohmann::json;

constexpr int kRepeats = 5;

struct CeilingFlags {
  std::string kind = "memcpy";  // memcpy, h2d, d2d or peer
  std::uint64_t bytes = 1ull << 30;
  int from = 0, to = 1;  // peer
  bool both_ways = false;
  std::string pairs;  // peer: "0:2,1:3", instead of from/to
};

// "0:2,1:3": device pairs, from:to.
StatusOr<std::vector<std::pair<int, int>>> parse_pairs(const std::string& text) {
  std::vector<std::pair<int, int>> pairs;
  std::stringstream list(text);
  for (std::string item; std::getline(list, item, ',');) {
    int from = -1, to = -1;
    char colon = 0, extra = 0;
    std::stringstream one(item);
    if (!(one >> from >> colon >> to) || colon != ':' || (one >> extra)) {
      return InvalidArgument("--pairs \"" + text + "\": \"" + item + "\" is not FROM:TO");
    }
    pairs.emplace_back(from, to);
  }
  return pairs;
}

// Adds the peer figures of `f` (over `pairs` when there are any) to `out`.
Status measure_peer(const CeilingFlags& f, const std::vector<std::pair<int, int>>& pairs, Json& out) {
  StatusOr<PeerCeiling> peer = PeerCeiling{};
  if (pairs.empty()) {
    out["from"] = f.from;
    out["to"] = f.to;
    out["both_ways"] = f.both_ways;
    peer = measure_peer_copy_gbps(f.from, f.to, f.bytes, f.both_ways, kRepeats);
  } else {
    Json list = Json::array();
    for (const auto& [from, to] : pairs) list.push_back(Json::array({from, to}));
    out["pairs"] = list;
    peer = measure_peer_pairs_gbps(pairs, f.bytes, kRepeats);
  }
  if (!peer.ok()) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    return peer.status().WithContext("--kind peer (" +
                                     (visible == nullptr ? std::string("CUDA_VISIBLE_DEVICES unset")
                                                         : "CUDA_VISIBLE_DEVICES=\"" + std::string(visible) + "\"") +
                                     ")");
  }
  out["gbps"] = peer->gbps;
  out["peer_access"] = peer->peer_access;
  return Status::Ok();
}

Status run_ceiling(const CeilingFlags& f) {
  ASSIGN_OR_RETURN(const auto pairs, parse_pairs(f.pairs));
  Json out{{"ceiling", f.kind}, {"bytes", f.bytes}};
  if (f.kind == "memcpy") {
    out["gbps"] = std::max(measure_memcpy_gbps(f.bytes, kRepeats), measure_memcpy_gbps(f.bytes, kRepeats));
  } else if (f.kind == "peer") {
    RETURN_IF_ERROR(measure_peer(f, pairs, out));
  } else {
    ASSIGN_OR_RETURN(out["gbps"], f.kind == "h2d" ? measure_pinned_h2d_gbps(f.bytes, kRepeats)
                                                  : measure_device_copy_gbps(f.bytes, kRepeats));
  }
  std::printf("%s\n", out.dump().c_str());
  return Status::Ok();
}

}  // namespace

void add_ceiling_command(CLI::App& app, CommandTable& table) {
  auto f = std::make_shared<CeilingFlags>();
  CLI::App* cmd = app.add_subcommand("ceiling", "Measure a copy ceiling now (memcpy, h2d, d2d, peer) as JSON");
  cmd->group("");  // hidden: the benchmarks' helper
  cmd->add_option("--kind", f->kind, "memcpy, h2d, d2d or peer (device --from to device --to)")
      ->check(CLI::IsMember({"memcpy", "h2d", "d2d", "peer"}))
      ->capture_default_str();
  add_byte_size_option(*cmd, "--bytes", f->bytes, "Bytes per copy");
  cmd->add_option("--from", f->from, "peer: local CUDA device copied from")
      ->check(WholeInt(0, "a device index", "device indices"))
      ->capture_default_str();
  cmd->add_option("--to", f->to, "peer: local CUDA device copied to")
      ->check(WholeInt(0, "a device index", "device indices"))
      ->capture_default_str();
  cmd->add_flag("--both-ways", f->both_ways, "peer: half the bytes each way at the same time");
  cmd->add_option("--pairs", f->pairs,
                  "peer: copies over several device pairs at once, bytes / pairs each (\"0:2,1:3\"; "
                  "default: the one pair --from, --to)");
  table.push_back({cmd, [f] { return run_ceiling(*f); }});
}

}  // namespace refit::cli
