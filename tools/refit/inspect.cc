// `refit inspect PATH`: what a checkpoint holds and how refit would move it.
//
// Prints every tensor (name, dtype, shape, bytes, TP shard rule), the totals
// (per dtype and overall), and for each engine rank of an engine with
// --engine-ranks TP ranks the bucket plan of its stream (make_plan on
// engine_stream(model, rank, ranks) at --bucket-size): buckets, bytes,
// chunked tensors, digest, and with --buckets every bucket. --json prints
// the same as one JSON object. An error names the file, tensor and broken
// rule, or the plan setting.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "command.h"
#include "flags.h"
#include "refit/checkpoint.h"
#include "refit/format.h"
#include "refit/plan.h"
#include "refit/roles.h"
#include "refit/transfer_defaults.h"
#include "refit/transports.h"

namespace refit::cli {
namespace {

using Json = nlohmann::json;

struct InspectOptions {
  std::string path;  // a .safetensors file, a checkpoint directory, or its index
  int engine_ranks = 1;
  std::uint64_t bucket_size = RankOptions{}.bucket_size;
  std::string transport = RankOptions{}.transport;  // resolves an auto bucket size
  std::vector<std::string> shard_rules;  // "GLOB=RULE" rows placed before the default table
  bool json = false;
  bool buckets = false;  // text: list every bucket of every rank
};

std::string shape_text(const Json& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i].get<std::int64_t>());
  return out + "]";
}

std::string u64(const Json& j, const char* key) { return std::to_string(j.at(key).get<std::uint64_t>()); }

void print_text(const Json& r, bool buckets) {
  std::printf("checkpoint %s: %s, %s, %s (%s bytes)\n", r["path"].get<std::string>().c_str(),
              format_count(r["files"].size(), "file").c_str(), format_count(r["tensors"].size(), "tensor").c_str(),
              format_bytes(r["total_bytes"].get<std::uint64_t>()).c_str(), u64(r, "total_bytes").c_str());
  for (const Json& f : r["files"]) {
    std::printf("  %s: %s, %s bytes on disk\n", f["path"].get<std::string>().c_str(),
                format_count(f["tensors"].get<std::uint64_t>(), "tensor").c_str(), u64(f, "file_bytes").c_str());
    for (const auto& [k, v] : f["metadata"].items()) {
      std::printf("    metadata %s = %s\n", k.c_str(), v.get<std::string>().c_str());
    }
  }

  std::size_t name_w = 4;
  for (const Json& t : r["tensors"]) name_w = std::max(name_w, t["name"].get<std::string>().size());
  std::printf("\n%-*s  %-13s  %-20s  %14s  %s\n", static_cast<int>(name_w), "name", "dtype", "shape", "bytes", "rule");
  for (const Json& t : r["tensors"]) {
    std::printf("%-*s  %-13s  %-20s  %14s  %s\n", static_cast<int>(name_w), t["name"].get<std::string>().c_str(),
                t["dtype"].get<std::string>().c_str(), shape_text(t["shape"]).c_str(), u64(t, "bytes").c_str(),
                t["rule"].get<std::string>().c_str());
  }

  std::printf("\nby dtype:\n");
  for (const Json& d : r["dtypes"]) {
    std::printf("  %-13s %6zu tensors  %s\n", d["dtype"].get<std::string>().c_str(), d["tensors"].get<std::size_t>(),
                format_bytes(d["bytes"].get<std::uint64_t>()).c_str());
  }
  std::printf("by shard rule:\n");
  for (const Json& d : r["rules"]) {
    std::printf("  %-13s %6zu tensors  %s\n", d["rule"].get<std::string>().c_str(), d["tensors"].get<std::size_t>(),
                format_bytes(d["bytes"].get<std::uint64_t>()).c_str());
  }

  std::printf("\nplan: %s, bucket size %s\n", format_count(r["engine_ranks"].get<std::uint64_t>(), "engine rank").c_str(),
              format_bytes(r["bucket_size"].get<std::uint64_t>()).c_str());
  std::printf("%11s %8s %14s %8s %8s %16s\n", "engine rank", "tensors", "bytes", "buckets", "chunked", "digest");
  for (const Json& p : r["plans"]) {
    std::printf("%11d %8zu %14s %8zu %8zu %16s\n", p["rank"].get<int>(), p["tensors"].get<std::size_t>(),
                format_bytes(p["bytes"].get<std::uint64_t>()).c_str(), p["buckets"].get<std::size_t>(),
                p["chunked_tensors"].get<std::size_t>(), p["digest"].get<std::string>().c_str());
  }
  if (!buckets) return;
  for (const Json& p : r["plans"]) {
    std::printf("\nengine rank %d buckets:\n%8s %14s %8s %10s  %s\n", p["rank"].get<int>(), "bucket", "bytes",
                "entries", "completes", "first tensor");
    std::size_t j = 0;
    for (const Json& b : p["bucket_list"]) {
      std::printf("%8zu %14s %8zu %10zu  %s\n", j++, u64(b, "bytes").c_str(), b["entries"].get<std::size_t>(),
                  b["completes"].get<std::size_t>(), b["first_tensor"].get<std::string>().c_str());
    }
  }
}

// The report (see README for the fields).
StatusOr<Json> inspect_report(const InspectOptions& options) {
  std::vector<ShardRulePattern> user;
  for (const std::string& row : options.shard_rules) {
    ASSIGN_OR_RETURN(ShardRulePattern p, parse_shard_rule_pattern(row));
    user.push_back(std::move(p));
  }
  if (options.engine_ranks < 1) {
    return InvalidArgument("--engine-ranks must be at least 1, got " + std::to_string(options.engine_ranks));
  }
  ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::Open(options.path));
  ASSIGN_OR_RETURN(Model model, model_from_checkpoint(ckpt, shard_rules_with_defaults(user)));

  Json r;
  r["path"] = options.path;
  r["files"] = Json::array();
  for (const SafetensorsFile& f : ckpt.files()) {
    r["files"].push_back({{"path", f.path()},
                          {"tensors", f.tensors().size()},
                          {"file_bytes", f.file_size()},
                          {"header_bytes", f.header().header_bytes},
                          {"metadata", f.metadata()}});
  }
  r["tensors"] = Json::array();
  std::vector<std::pair<std::string, std::pair<std::size_t, std::uint64_t>>> dtypes;  // first-appearance order
  std::map<std::string, std::pair<std::size_t, std::uint64_t>> rules;
  for (std::size_t i = 0; i < model.weights.size(); ++i) {
    const Weight& w = model.weights[i];
    const std::string dtype(dtype_name(w.spec.dtype));
    const std::string rule(shard_rule_name(w.rule));
    r["tensors"].push_back({{"name", w.spec.name},
                            {"dtype", dtype},
                            {"safetensors_dtype", std::string(safetensors_dtype_name(w.spec.dtype))},
                            {"shape", w.spec.shape},
                            {"bytes", w.spec.nbytes()},
                            {"rule", rule},
                            {"file", ckpt.tensors()[i].file}});
    auto d = std::find_if(dtypes.begin(), dtypes.end(), [&](const auto& e) { return e.first == dtype; });
    if (d == dtypes.end()) d = dtypes.insert(dtypes.end(), {dtype, {0, 0}});
    d->second.first += 1;
    d->second.second += w.spec.nbytes();
    rules[rule].first += 1;
    rules[rule].second += w.spec.nbytes();
  }
  r["tensor_count"] = model.weights.size();
  r["total_bytes"] = model.total_bytes();
  r["dtypes"] = Json::array();
  for (const auto& [dtype, n] : dtypes) r["dtypes"].push_back({{"dtype", dtype}, {"tensors", n.first}, {"bytes", n.second}});
  r["rules"] = Json::array();
  for (const auto& [rule, n] : rules) r["rules"].push_back({{"rule", rule}, {"tensors", n.first}, {"bytes", n.second}});

  r["engine_ranks"] = options.engine_ranks;
  const std::uint64_t bucket_size = effective_bucket_size(options.bucket_size, options.transport);
  r["bucket_size"] = bucket_size;
  r["plans"] = Json::array();
  for (int rank = 0; rank < options.engine_ranks; ++rank) {
    StatusOr<Plan> plan = make_plan(engine_stream(model, rank, options.engine_ranks), bucket_size);
    if (!plan.ok()) {
      return plan.status().WithContext("plan of engine rank " + std::to_string(rank) + " of " +
                                       std::to_string(options.engine_ranks) + " for checkpoint '" + options.path + "'");
    }
    std::size_t chunked = 0;
    for (const TensorSpec& s : plan->specs) chunked += s.nbytes() > plan->bucket_size ? 1 : 0;
    Json list = Json::array();
    for (const Bucket& b : plan->buckets) {
      list.push_back({{"bytes", b.bytes},
                      {"entries", b.entries.size()},
                      {"completes", b.completes.size()},
                      {"first_tensor", b.entries.empty() ? std::string() : plan->specs[b.entries.front().tensor].name}});
    }
    r["plans"].push_back({{"rank", rank},
                          {"tensors", plan->specs.size()},
                          {"bytes", plan->total_bytes},
                          {"buckets", plan->buckets.size()},
                          {"chunked_tensors", chunked},
                          {"largest_chunked_tensor", plan->largest_chunked_tensor},
                          {"digest", plan->digest_hex()},
                          {"bucket_list", std::move(list)}});
  }
  return r;
}

Status run_inspect(const InspectOptions& options) {
  ASSIGN_OR_RETURN(Json report, inspect_report(options));
  if (options.json) {
    std::printf("%s\n", report.dump(2).c_str());
  } else {
    print_text(report, options.buckets);
  }
  return Status::Ok();
}

}  // namespace

void add_inspect_command(CLI::App& app, CommandTable& table) {
  auto o = std::make_shared<InspectOptions>();
  CLI::App* cmd =
      app.add_subcommand("inspect", "Print a checkpoint's tensors, totals and bucket plan per engine rank");
  cmd->add_option("path", o->path, "Checkpoint: a .safetensors file, or a directory with an index")->required();
  cmd->add_option("--engine-ranks", o->engine_ranks, "Engine ranks (TP size) to plan for")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  add_bucket_size_flag(*cmd, o->bucket_size);
  // Any transport refit knows, built here or not: a plan for a GPU job may
  // be inspected on a machine without one.
  std::vector<std::string> known;
  for (const TransportAvailability& t : transport_availability(transport_names(), Status::Ok())) known.push_back(t.name);
  cmd->add_option("--transport", o->transport,
                  "The transport the plan is for (what --bucket-size auto stands for): " + join_names(known))
      ->check(CLI::IsMember(known))
      ->capture_default_str();
  cmd->add_option("--rule", o->shard_rules, "A TP shard rule GLOB=RULE ahead of the default rules (repeatable; default: none)")->check(ShardRuleRow());
  cmd->add_flag("--json", o->json, "Print a JSON report instead of the tables");
  cmd->add_flag("--buckets", o->buckets, "List every bucket of every engine rank");
  table.push_back({cmd, [o] { return run_inspect(*o); }});
}

}  // namespace refit::cli
