#include "control/spec_json.h"

namespace refit {

Json specs_to_json(const std::vector<TensorSpec>& specs) {
  Json out = Json::array();
  for (const TensorSpec& s : specs) out.push_back(Json::array({s.name, std::string(dtype_name(s.dtype)), s.shape}));
  return out;
}

StatusOr<std::vector<TensorSpec>> specs_from_json(const Json& json, const std::string& what) {
  if (!json.is_array()) return InvalidArgument(what + ": tensor specs must be a JSON array");
  std::vector<TensorSpec> specs;
  specs.reserve(json.size());
  for (std::size_t i = 0; i < json.size(); ++i) {
    const Json& e = json[i];
    std::string at = what + ": tensor spec " + std::to_string(i);
    if (!e.is_array() || e.size() != 3 || !e[0].is_string() || !e[1].is_string() || !e[2].is_array()) {
      return InvalidArgument(at + " is not [name, dtype, [dims]]");
    }
    TensorSpec spec;
    spec.name = e[0].get<std::string>();
    auto dtype = parse_dtype(e[1].get<std::string>());
    if (!dtype.ok()) return dtype.status().WithContext(at + " ('" + spec.name + "')");
    spec.dtype = *dtype;
    for (const Json& d : e[2]) {
      if (!d.is_number_integer()) return InvalidArgument(at + " ('" + spec.name + "') has a non-integer dimension");
      spec.shape.push_back(d.get<std::int64_t>());
    }
    RETURN_IF_ERROR(validate_spec(spec).WithContext(at));
    specs.push_back(std::move(spec));
  }
  return specs;
}

Status check_plan_bounds(const std::vector<TensorSpec>& specs, std::uint64_t bucket_size, const std::string& what) {
  if (bucket_size == 0) return InvalidArgument(what + ": bucket_size is 0");
  std::uint64_t buckets = 0;
  for (const TensorSpec& s : specs) {
    const std::uint64_t bytes = s.nbytes();
    buckets += bytes / bucket_size + 1;
    if (buckets > kMaxPlanBuckets) {
      return InvalidArgument(what + ": the stream needs more than " + std::to_string(kMaxPlanBuckets) +
                             " buckets of " + std::to_string(bucket_size) + " bytes (tensor '" + s.name + "' alone is " +
                             std::to_string(bytes) + " bytes); refusing to plan it");
    }
  }
  return Status::Ok();
}

}  // namespace refit
