#include "report_table.h"

#include <string>
#include <string_view>

#include "refit/format.h"
#include "refit/plan.h"

namespace refit::cli {

namespace {

// --delta: what crossed the links per refit, and how its buckets went.
void print_delta_table(const nlohmann::json& r, std::FILE* out) {
  const nlohmann::json refits = r.value("refits", nlohmann::json::array());
  if (refits.empty() || !refits[0].contains("encodings")) return;
  std::fprintf(out, "\n%8s %14s %9s %13s %13s\n", "version", "wire bytes", "of bytes", "full buckets",
               "delta buckets");
  for (const auto& f : refits) {
    const double bytes = static_cast<double>(f.value("bytes", 0ull));
    const auto wire = f.value("wire_bytes", 0ull);
    const nlohmann::json encodings = f.value("encodings", nlohmann::json::object());
    std::fprintf(out, "%8llu %14s %8.3fx %13llu %13llu\n", static_cast<unsigned long long>(f.value("version", 0ull)),
                 format_bytes(wire).c_str(), bytes > 0 ? static_cast<double>(wire) / bytes : 0.0,
                 static_cast<unsigned long long>(encodings.value("full", 0ull)),
                 static_cast<unsigned long long>(encodings.value("words", 0ull)));
  }
}

// Many engines: each engine's relay parent, the versions it committed, its
// rate in the last refit, and why it was lost, if it was.
void print_engines_table(const nlohmann::json& r, std::FILE* out) {
  const nlohmann::json engines = r.value("engines", nlohmann::json::array());
  if (engines.size() < 2) return;
  const nlohmann::json parents = r.value("relay", nlohmann::json::object()).value("parents", nlohmann::json::array());
  std::fprintf(out, "\n%7s %7s %9s %13s %8s  %s\n", "engine", "fed by", "versions", "last version", "GB/s", "lost");
  for (std::size_t k = 0; k < engines.size(); ++k) {
    const nlohmann::json& e = engines[k];
    const nlohmann::json versions = e.value("versions", nlohmann::json::array());
    const std::string parent = k < parents.size() && parents[k].is_number() ? std::to_string(parents[k].get<int>())
                                                                            : std::string("trainers");
    const std::string lost = e.contains("lost") && e["lost"].is_string() ? e["lost"].get<std::string>() : "";
    std::fprintf(out, "%7zu %7s %9zu %13llu %8.2f  %s\n", k, parent.c_str(), versions.size(),
                 versions.empty() ? 0ull : versions.back().get<unsigned long long>(), e.value("gbps", 0.0),
                 lost.c_str());
  }
}

}  // namespace

void print_report_table(const nlohmann::json& r, std::FILE* out) {
  auto u = [&](const char* k) { return r.value(k, 0ull); };
  const std::size_t refits = r.value("refits", nlohmann::json::array()).size();
  // A job that failed before its first refit measured nothing: no table. Its
  // error is said once, on stderr (refit <command>: error: ...).
  if (r.contains("error") && refits == 0) return;
  const std::uint64_t engines = r.value("engines_count", 1ull);
  const std::string engine_ranks = format_count(u("engine_ranks_count"), "engine rank");
  const std::string fed = engines > 1 ? format_count(engines, "engine") + " of " + engine_ranks : engine_ranks;
  std::fprintf(out, "refit: model %s (%s, %s), %s -> %s, transport %s (%s, %s), bucket %s, pool %s\n",
               r.value("model", std::string("?")).c_str(), format_count(u("tensors"), "tensor").c_str(),
               format_bytes(u("model_bytes")).c_str(), format_count(u("trainer_ranks_count"), "trainer rank").c_str(),
               fed.c_str(),
               r.value("transport", std::string("?")).c_str(), r.value("device", std::string("cpu")).c_str(),
               r.value("mode", std::string("staged")).c_str(), format_bytes(u("bucket_size")).c_str(),
               format_count(u("pool_slots"), "slot").c_str());
  std::fprintf(out, "\n%8s %14s %10s %8s %9s\n", "version", "bytes", "seconds", "GB/s", "verified");
  for (const auto& f : r.value("refits", nlohmann::json::array())) {
    std::fprintf(out, "%8llu %14s %10.4f %8.2f %9s\n", static_cast<unsigned long long>(f.value("version", 0ull)),
                 format_bytes(f.value("bytes", 0ull)).c_str(), f.value("seconds", 0.0), f.value("gbps", 0.0),
                 f.value("verified", false) ? "yes" : "no");
  }
  print_delta_table(r, out);
  print_engines_table(r, out);
  std::fprintf(out, "\n%11s %8s %8s %8s %14s\n", engines > 1 ? "engine/rank" : "engine rank", "buckets", "batches",
               "tensors", "bytes");
  for (const auto& k : r.value("ranks", nlohmann::json::array())) {
    const std::string rank = std::to_string(k.value("rank", 0));
    const std::string who = engines > 1 ? std::to_string(k.value("engine", 0)) + "/" + rank : rank;
    std::fprintf(out, "%11s %8llu %8llu %8llu %14s\n", who.c_str(),
                 static_cast<unsigned long long>(k.value("buckets", 0ull)),
                 static_cast<unsigned long long>(k.value("batches", 0ull)),
                 static_cast<unsigned long long>(k.value("tensors", 0ull)), format_bytes(k.value("bytes", 0ull)).c_str());
  }
  std::fprintf(out, "\naligned batches per refit: %llu (bucket boundaries %s across engine ranks)\n",
               static_cast<unsigned long long>(u("aligned_batches")),
               r.value("divergent_boundaries", false) ? "differ" : "agree");
  if (r.contains("reads")) {
    std::fprintf(out, "readers: %llu reads of served tensors, %llu torn (%s weights)\n",
                 static_cast<unsigned long long>(u("reads")), static_cast<unsigned long long>(u("torn_reads")),
                 r.value("shadow", false) ? "shadow" : "live");
  }
  if (r.contains("error")) {
    std::fprintf(out, "FAILED after %s (the error is the last line on stderr)\n",
                 format_count(refits, "refit").c_str());
  } else if (r.value("verified", false)) {
    std::fprintf(out, "verified: every byte of every refit on every engine rank\n");
  } else {
    std::fprintf(out, "NOT verified\n");
  }
}

Status report_status(const nlohmann::json& report) {
  if (!report.contains("error")) return Status::Ok();
  return status_from_text(report["error"].is_string() ? report["error"].get<std::string>() : report["error"].dump());
}

}  // namespace refit::cli
