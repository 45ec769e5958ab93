#include "control/report_builder.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "core/atomic_file.h"
#include "transport/transport.h"

namespace refit {

ReportBuilder::ReportBuilder(std::string path) : path_(std::move(path)) {
  report_["verified"] = false;
  report_["refits"] = Json::array();
  report_["failures"] = Json::array();  // refits that failed and were recovered from
  report_["ranks"] = Json::array();
  report_["trainer_ranks"] = Json::array();
  report_["committed_version"] = 0;
}

void ReportBuilder::set_topology(const Join& first, const Topology& topology, int engines, int relay_fanout) {
  engines_ = static_cast<std::size_t>(engines);
  ranks_per_engine_ = std::max<std::size_t>(1, topology.engine_setups.size() / engines_);
  Json list = Json::array(), parents = Json::array();
  for (std::size_t k = 0; k < engines_; ++k) {
    list.push_back(Json{{"engine", k}, {"ranks", ranks_per_engine_}, {"versions", Json::array()}, {"joined_at", 0},
                        {"lost", nullptr}});
    parents.push_back(k == 0 ? Json(nullptr) : Json((k - 1) / static_cast<std::size_t>(relay_fanout)));
  }
  report_["engines"] = std::move(list);
  report_["relay"] = Json{{"fanout", relay_fanout}, {"parents", std::move(parents)}};
  report_["transport"] = first.transport;
  report_["mode"] = first.mode;
  report_["device"] = first.device;
  report_["bucket_size"] = first.bucket_size;
  report_["pool_slots"] = first.pool_slots;
  report_["aligned_batches"] = topology.aligned_batches;
  report_["divergent_boundaries"] = topology.divergent_boundaries;
  report_["bytes_per_refit"] = topology.bytes_per_refit;
  report_["quantize"] = first.quantize;  // engine rank 0's conversions
  report_["quantized_tensors"] = first.quantized_tensors;
  bytes_per_refit_ = topology.bytes_per_refit;
  holdings_ = EngineHoldings(topology.engine_setups.size(), ranks_per_engine_);
  memory_path_field_ = transport_topology(first.transport).memory_path_report_field;
}

namespace {

// Which memory path the transport took (issue 5): "host-staged" when any
// rank's device memory went through pinned host buffers, else "cuda" when
// any rank's device memory was written directly, else "host".
std::string memory_path(const RecordCommit& commit) {
  std::string path = "host";
  for (const auto* list : {&commit.engines, &commit.trainers}) {
    for (const Done& done : *list) {
      const std::string p = done.memory_path.empty() ? "host" : done.memory_path;
      if (p == "host-staged" || (p == "cuda" && path == "host")) path = p;
    }
  }
  return path;
}

Json rank_stats(const std::vector<Done>& done) {
  Json out = Json::array();
  for (std::size_t r = 0; r < done.size(); ++r) {
    Json stats = done[r].stats;
    stats["rank"] = r;
    out.push_back(std::move(stats));
  }
  return out;
}

// A number field of a rank's stats, or 0.
std::uint64_t stat_u64(const Json& stats, const char* field) {
  if (!stats.is_object() || !stats.contains(field) || !stats[field].is_number_unsigned()) return 0;
  return stats[field].get<std::uint64_t>();
}

// The payload bytes every trainer rank wrote (their `engines[].bytes`,
// runtime/trainer_share.h) beyond the bytes of every engine rank's stream:
// 0 when each engine byte came from exactly one trainer rank.
std::uint64_t duplicate_bytes(const std::vector<Done>& trainers, std::uint64_t stream_bytes) {
  std::uint64_t sent = 0;
  for (const Done& done : trainers) {
    if (!done.stats.is_object() || !done.stats.contains("engines") || !done.stats["engines"].is_array()) continue;
    for (const Json& e : done.stats["engines"]) sent += stat_u64(e, "bytes");
  }
  return sent > stream_bytes ? sent - stream_bytes : 0;
}

// What crossed the trainers' links: every trainer rank's `wire_bytes` under
// --delta (encoded buckets count their encodings), its `bytes` otherwise.
std::uint64_t trainer_link_bytes(const std::vector<Done>& trainers) {
  std::uint64_t wire = 0;
  for (const Done& done : trainers) {
    const bool delta = done.stats.is_object() && done.stats.contains("wire_bytes");
    wire += stat_u64(done.stats, delta ? "wire_bytes" : "bytes");
  }
  return wire;
}

// --delta: the buckets sent as they are and delta-encoded, summed over the
// trainer ranks (their `encodings`); nullopt without --delta.
std::optional<Json> delta_encodings(const std::vector<Done>& trainers) {
  std::uint64_t full = 0, words = 0;
  bool any = false;
  for (const Done& done : trainers) {
    if (!done.stats.is_object() || !done.stats.contains("encodings")) continue;
    any = true;
    full += stat_u64(done.stats["encodings"], "full");
    words += stat_u64(done.stats["encodings"], "words");
  }
  if (!any) return std::nullopt;
  return Json{{"full", full}, {"words", words}};
}

}  // namespace

void ReportBuilder::record_commit(const RecordCommit& commit) {
  holdings_.committed(commit);
  report_["ranks"] = engine_rank_stats(commit.engines);
  report_["trainer_ranks"] = rank_stats(commit.trainers);
  std::uint64_t gathered = 0;
  for (const Done& done : commit.trainers) gathered += stat_u64(done.stats, "gathered_bytes");
  report_["gathered_bytes"] = gathered;
  const std::uint64_t duplicated = duplicate_bytes(commit.trainers, bytes_per_refit_);
  report_["duplicate_bytes"] = std::max(duplicated, report_.value("duplicate_bytes", std::uint64_t{0}));
  if (memory_path_field_ != nullptr) report_[memory_path_field_] = memory_path(commit);
  record_reads(commit.engines);
  const double seconds = commit.seconds;
  // What crossed every link: the trainers', and each relaying engine rank's
  // forwards (its `relay_bytes`).
  const std::uint64_t from_trainers = trainer_link_bytes(commit.trainers);
  std::uint64_t relayed = 0;
  for (const Done& done : commit.engines) relayed += stat_u64(done.stats, "relay_bytes");
  record_engines(commit);
  const std::uint64_t bytes = refit_bytes(commit);
  Json refit{{"version", commit.version},
             {"bytes", bytes},
             {"trainer_link_bytes", from_trainers},
             {"wire_bytes", from_trainers + relayed},
             {"seconds", seconds},
             {"gbps", seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0},
             {"verified", commit.verified}};
  if (!commit.only.empty()) refit["only"] = commit.only;
  if (std::optional<Json> encodings = delta_encodings(commit.trainers)) refit["encodings"] = std::move(*encodings);
  report_["refits"].push_back(std::move(refit));
  report_["committed_version"] = commit.version;
  if (!commit.verified) all_verified_ = false;
}

std::uint64_t ReportBuilder::refit_bytes(const RecordCommit& commit) const {
  if (commit.only.empty()) return bytes_per_refit_;
  for (std::size_t first = 0; first < commit.engines.size(); first += ranks_per_engine_) {
    if (commit.engines[first].stats.value("dropped", false)) continue;
    std::uint64_t bytes = 0;
    for (std::size_t g = first; g < std::min(first + ranks_per_engine_, commit.engines.size()); ++g) {
      bytes += stat_u64(commit.engines[g].stats, "refit_bytes");
    }
    return bytes;
  }
  return 0;
}

// Engine rank g's stats, named by engine and rank (k * R + r; engine
// `first_engine` onwards). Slots of engines never listed (none joined) are
// left out.
Json ReportBuilder::engine_rank_stats(const std::vector<Done>& done, std::size_t first_engine) const {
  Json out = Json::array();
  const Json& listed = report_.contains("engines") ? report_["engines"] : Json::array();
  for (std::size_t g = 0; g < done.size(); ++g) {
    const std::size_t k = first_engine + g / ranks_per_engine_;
    const bool known = std::any_of(listed.begin(), listed.end(),
                                   [&](const Json& e) { return e.value("engine", std::size_t{0}) == k; });
    if (!known && done[g].stats.is_object() && done[g].stats.value("dropped", false)) continue;
    Json stats = done[g].stats;
    stats["engine"] = k;
    stats["rank"] = g % ranks_per_engine_;
    out.push_back(std::move(stats));
  }
  return out;
}

// Many engines: each engine's committed versions, and its rate in this refit
// (its bytes over its slowest rank's time from go to sent, `refit_ms`).
void ReportBuilder::record_engines(const RecordCommit& commit) {
  if (!report_.contains("engines")) return;
  for (Json& engine : report_["engines"]) {
    const std::size_t k = engine.value("engine", std::size_t{0});
    double slowest_ms = 0;
    for (std::size_t r = 0; r < ranks_per_engine_; ++r) {
      const std::size_t g = k * ranks_per_engine_ + r;
      if (g < commit.engines.size()) slowest_ms = std::max(slowest_ms, commit.engines[g].stats.value("refit_ms", 0.0));
    }
    // Dropped (it holds none of the later versions), or refused before it joined.
    if (!engine["lost"].is_null() || engine["joined_at"].is_null()) continue;
    engine["versions"].push_back(commit.version);
    engine["gbps"] = slowest_ms > 0 ? static_cast<double>(refit_bytes(commit)) / (slowest_ms / 1e3) / 1e9 : 0.0;
  }
}

// Shadow weights and readers (issue 21): `shadow` when every engine rank
// serves from shadow weights (engine_holdings.h); with readers, their reads
// and torn reads summed over the engine ranks (each rank's are in `ranks`).
void ReportBuilder::record_reads(const std::vector<Done>& engines) {
  bool readers = false;
  std::uint64_t reads = 0, torn = 0;
  for (const Done& done : engines) {
    readers = readers || (done.stats.is_object() && done.stats.contains("reads"));
    reads += stat_u64(done.stats, "reads");
    torn += stat_u64(done.stats, "torn_reads");
  }
  report_["shadow"] = holdings_.all_shadow();
  if (readers) {
    report_["reads"] = reads;
    report_["torn_reads"] = torn;
  }
}

void ReportBuilder::record_failure(const RecordFailure& failure) {
  report_["failures"].push_back(Json{{"version", failure.version}, {"error", failure.error.ToString()}});
  if (!report_.contains("error")) report_["error"] = failure.error.ToString();
}

void ReportBuilder::record_go(std::uint64_t version) { holdings_.went(version); }

Json& ReportBuilder::engine_entry(std::uint64_t engine) {
  Json& list = report_["engines"];
  for (Json& e : list) {
    if (e.value("engine", std::uint64_t{0}) == engine) return e;
  }
  list.push_back(Json{{"engine", engine}, {"ranks", ranks_per_engine_}, {"versions", Json::array()},
                      {"joined_at", nullptr}, {"lost", nullptr}});
  return list.back();
}

void ReportBuilder::record_drop(const DropEngine& drop) {
  if (!report_.contains("engines")) return;
  Json& engine = engine_entry(drop.engine);
  engine["lost"] = drop.why.message();
  engine["lost_at"] = drop.version;
}

void ReportBuilder::record_tree(const std::vector<std::pair<std::uint64_t, std::optional<std::uint64_t>>>& tree) {
  Json live = Json::array();
  for (const auto& [engine, parent] : tree) {
    live.push_back(Json{{"engine", engine}, {"fed_by", parent ? Json(*parent) : Json(nullptr)}});
  }
  report_["relay"]["live"] = std::move(live);
}

void ReportBuilder::record_join(const RecordJoin& join) {
  if (!report_.contains("engines")) return;
  Json& engine = engine_entry(join.engine);
  engine["joined_at"] = join.version;
  engine["lost"] = nullptr;
  engine["fed_by"] = join.parent;
  holdings_.joined(join);
  if (join.version != 0) {
    engine["versions"].push_back(join.version);
    std::uint64_t bytes = 0;
    for (const Done& d : join.done) bytes += stat_u64(d.stats, "bytes");
    engine["catch_up"] = Json{{"version", join.version}, {"bytes", bytes}, {"verified", join.verified},
                              {"ranks", engine_rank_stats(join.done, join.engine)}};
    all_verified_ = all_verified_ && join.verified;
  }
}

void ReportBuilder::record_recovery(const RecordRecovery& recovery) {
  holdings_.recovered(recovery);
  Json engines = Json::array();
  for (std::size_t e = 0; e < recovery.engines.size(); ++e) {
    engines.push_back(Json{{"engine", e / ranks_per_engine_},
                           {"rank", e % ranks_per_engine_},
                           {"version", recovery.engines[e].version.value_or(0)},
                           {"weights_complete", recovery.engines[e].weights_complete.value_or(false)}});
  }
  report_["failures"].back()["engines_after"] = engines;
}

void ReportBuilder::record_release(const RecordRelease& release) {
  for (Json& refit : report_["refits"]) {
    if (refit["version"].get<std::uint64_t>() == release.version) refit["released_bytes"] = release.engine_bytes;
  }
}

std::uint64_t ReportBuilder::committed_version() const { return report_["committed_version"].get<std::uint64_t>(); }

Status ReportBuilder::persist_running(const std::string& when) const {
  if (path_.empty()) return Status::Ok();
  Json running = report_;
  running["engines_at_end"] = holdings_.json();
  running["verified"] = false;
  running["error"] =
      "unfinished: the coordinator wrote this report " + when + " and did not finish the job (it was killed, or is stopped)";
  return write_file_atomically(path_, running.dump(2) + "\n").WithContext("--report " + path_);
}

Json ReportBuilder::finish(const Status& status) {
  report_["engines_at_end"] = holdings_.json();
  if (!status.ok()) {
    report_["error"] = status.ToString();
    report_["verified"] = false;
  } else {
    report_["verified"] = all_verified_ && report_["failures"].empty() && !report_["refits"].empty();
  }
  return report_;
}

}  // namespace refit
