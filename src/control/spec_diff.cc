#include "control/spec_diff.h"

#include <algorithm>

#include "refit/checkpoint.h"  // shard_rule_name

namespace refit {
namespace {

// The rules of `side` when it sent one per spec; else null.
const std::vector<ShardRule>* rules_of(const NamedSpecs& side) {
  const bool sent = side.rules != nullptr && !side.rules->empty() && side.rules->size() == side.specs->size();
  return sent ? side.rules : nullptr;
}

// "'w' bfloat16[4, 4]": the name quoted, since a name may hold spaces; with
// its rule, "'w' bfloat16[4, 4] (rule column)", when `rules` are given.
std::string shown(const std::vector<TensorSpec>& specs, const std::vector<ShardRule>* rules, std::size_t i) {
  const TensorSpec& s = specs[i];
  std::string out = "'" + s.name + "'" + s.ToString().substr(s.name.size());  // ToString: "name bfloat16[4, 4]"
  if (rules != nullptr) out += " (rule " + std::string(shard_rule_name((*rules)[i])) + ")";
  return out;
}

// "name", "dtype and shape", ...: the fields of `a` and `b` that differ;
// their rules too when both are given.
std::string differing_fields(const TensorSpec& a, const TensorSpec& b, const ShardRule* rule_a,
                             const ShardRule* rule_b) {
  std::vector<std::string> fields;
  if (a.name != b.name) fields.push_back("name");
  if (a.dtype != b.dtype) fields.push_back("dtype");
  if (a.shape != b.shape) fields.push_back("shape");
  if (rule_a != nullptr && rule_b != nullptr && *rule_a != *rule_b) fields.push_back("rule");
  std::string out;
  for (std::size_t i = 0; i < fields.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == fields.size() ? " and " : ", ") + fields[i];
  }
  return out;
}

std::string tensors(std::size_t n) { return std::to_string(n) + (n == 1 ? " tensor" : " tensors"); }

}  // namespace

std::string first_spec_difference(const NamedSpecs& a, const NamedSpecs& b) {
  const std::vector<TensorSpec>& x = *a.specs;
  const std::vector<TensorSpec>& y = *b.specs;
  // Rules are shown, and compared, only when both sides sent them.
  const std::vector<ShardRule>* xr = rules_of(a);
  const std::vector<ShardRule>* yr = rules_of(b);
  if (xr == nullptr || yr == nullptr) xr = yr = nullptr;
  const std::size_t common = std::min(x.size(), y.size());
  for (std::size_t i = 0; i < common; ++i) {
    const std::string fields =
        differing_fields(x[i], y[i], xr != nullptr ? &(*xr)[i] : nullptr, yr != nullptr ? &(*yr)[i] : nullptr);
    if (fields.empty()) continue;
    return "tensor " + std::to_string(i) + " differs in " + fields + ": " + a.rank + " has " + shown(x, xr, i) +
           ", " + b.rank + " has " + shown(y, yr, i);
  }
  if (x.size() == y.size()) return "";
  const bool a_longer = x.size() > y.size();
  const NamedSpecs& longer = a_longer ? a : b;
  return a.rank + " has " + tensors(x.size()) + ", " + b.rank + " has " + std::to_string(y.size()) +
         ": the first one more is tensor " + std::to_string(common) + " " +
         shown(*longer.specs, a_longer ? xr : yr, common) + " of " + longer.rank;
}

}  // namespace refit
