// The sharded trainers' fields as JSON: see shard_json.h.
#include "control/shard_json.h"

namespace refit {
namespace {

constexpr std::uint64_t kMaxTextBytes = 4096;  // addresses, descriptors, digests, devices

bool is_u64(const Json& j) { return j.is_number_unsigned() || (j.is_number_integer() && j.get<std::int64_t>() >= 0); }

// Object `j`'s member `field` as an integer >= 0, or an error naming it.
StatusOr<std::uint64_t> u64_member(const Json& j, const char* field, const std::string& where) {
  auto it = j.find(field);
  if (it == j.end() || !is_u64(*it)) return InvalidArgument(where + ": field '" + field + "' must be an integer >= 0");
  return it->get<std::uint64_t>();
}

StatusOr<std::string> text_member(const Json& j, const char* field, const std::string& where) {
  auto it = j.find(field);
  if (it == j.end() || !it->is_string() || it->get_ref<const std::string&>().size() > kMaxTextBytes) {
    return InvalidArgument(where + ": field '" + field + "' must be a string of at most " +
                           std::to_string(kMaxTextBytes) + " bytes");
  }
  return it->get<std::string>();
}

Status require_array(const Json& json, const std::string& what) {
  if (!json.is_array()) return InvalidArgument(what + ": expected an array");
  return Status::Ok();
}

}  // namespace

Json parts_to_json(const std::vector<Part>& parts) {
  Json out = Json::array();
  for (const Part& p : parts) out.push_back(Json::array({p.index, p.bytes}));
  return out;
}

StatusOr<std::vector<Part>> parts_from_json(const Json& json, const std::string& what) {
  RETURN_IF_ERROR(require_array(json, what));
  std::vector<Part> parts;
  for (std::size_t i = 0; i < json.size(); ++i) {
    const Json& p = json[i];
    if (!p.is_array() || p.size() != 2 || !is_u64(p[0]) || !is_u64(p[1]) || p[1].get<std::uint64_t>() == 0) {
      return InvalidArgument(what + ": element " + std::to_string(i) + ": expected [index, bytes] with bytes > 0");
    }
    parts.push_back(Part{p[0].get<std::uint64_t>(), p[1].get<std::uint64_t>()});
    if (i > 0 && parts[i].index <= parts[i - 1].index) {
      return InvalidArgument(what + ": element " + std::to_string(i) + ": indices must ascend (" +
                             std::to_string(parts[i].index) + " after " + std::to_string(parts[i - 1].index) + ")");
    }
  }
  return parts;
}

Json feeds_to_json(const std::vector<Feed>& feeds) {
  Json out = Json::array();
  for (const Feed& f : feeds) {
    out.push_back(Json{{"engine_rank", f.engine_rank}, {"plan_digest", f.plan_digest}, {"parts", parts_to_json(f.parts)}});
  }
  return out;
}

StatusOr<std::vector<Feed>> feeds_from_json(const Json& json, const std::string& what) {
  RETURN_IF_ERROR(require_array(json, what));
  std::vector<Feed> feeds;
  for (std::size_t i = 0; i < json.size(); ++i) {
    const std::string where = what + ": element " + std::to_string(i);
    if (!json[i].is_object()) return InvalidArgument(where + ": expected an object");
    Feed f;
    ASSIGN_OR_RETURN(f.engine_rank, u64_member(json[i], "engine_rank", where));
    ASSIGN_OR_RETURN(f.plan_digest, text_member(json[i], "plan_digest", where));
    auto parts = json[i].find("parts");
    if (parts == json[i].end()) return InvalidArgument(where + ": no field 'parts'");
    ASSIGN_OR_RETURN(f.parts, parts_from_json(*parts, where + ": field 'parts'"));
    if (i > 0 && f.engine_rank <= feeds.back().engine_rank) {
      return InvalidArgument(where + ": engine ranks must ascend (" + std::to_string(f.engine_rank) + " after " +
                             std::to_string(feeds.back().engine_rank) + ")");
    }
    feeds.push_back(std::move(f));
  }
  return feeds;
}

Json bucket_parts_to_json(const std::vector<std::vector<Part>>& buckets) {
  Json out = Json::array();
  for (const auto& bucket : buckets) out.push_back(parts_to_json(bucket));
  return out;
}

StatusOr<std::vector<std::vector<Part>>> bucket_parts_from_json(const Json& json, const std::string& what) {
  RETURN_IF_ERROR(require_array(json, what));
  std::vector<std::vector<Part>> buckets;
  for (std::size_t j = 0; j < json.size(); ++j) {
    ASSIGN_OR_RETURN(auto parts, parts_from_json(json[j], what + ": bucket " + std::to_string(j)));
    buckets.push_back(std::move(parts));
  }
  return buckets;
}

Json targets_to_json(const std::vector<EngineTarget>& targets) {
  Json out = Json::array();
  for (const EngineTarget& t : targets) {
    Json target{{"engine_rank", t.engine_rank}, {"address", t.address}, {"descriptor", t.descriptor},
                {"device", t.device}};
    if (t.engine != 0) target["engine"] = t.engine;
    out.push_back(std::move(target));
  }
  return out;
}

StatusOr<std::vector<EngineTarget>> targets_from_json(const Json& json, const std::string& what) {
  RETURN_IF_ERROR(require_array(json, what));
  std::vector<EngineTarget> targets;
  for (std::size_t i = 0; i < json.size(); ++i) {
    const std::string where = what + ": element " + std::to_string(i);
    if (!json[i].is_object()) return InvalidArgument(where + ": expected an object");
    EngineTarget t;
    ASSIGN_OR_RETURN(t.engine_rank, u64_member(json[i], "engine_rank", where));
    ASSIGN_OR_RETURN(t.address, text_member(json[i], "address", where));
    ASSIGN_OR_RETURN(t.descriptor, text_member(json[i], "descriptor", where));
    ASSIGN_OR_RETURN(t.device, text_member(json[i], "device", where));
    if (json[i].contains("engine")) {
      ASSIGN_OR_RETURN(t.engine, u64_member(json[i], "engine", where));
    }
    targets.push_back(std::move(t));
  }
  return targets;
}

}  // namespace refit
