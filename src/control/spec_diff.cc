#include "control/spec_diff.h"

#include <algorithm>

namespace refit {
namespace {

// "'w' bfloat16[4, 4]": the name quoted, since a name may hold spaces.
std::string shown(const TensorSpec& s) {
  return "'" + s.name + "'" + s.ToString().substr(s.name.size());  // ToString: "name bfloat16[4, 4]"
}

// "name", "dtype and shape", ...: the fields of `a` and `b` that differ.
std::string differing_fields(const TensorSpec& a, const TensorSpec& b) {
  std::vector<std::string> fields;
  if (a.name != b.name) fields.push_back("name");
  if (a.dtype != b.dtype) fields.push_back("dtype");
  if (a.shape != b.shape) fields.push_back("shape");
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
  const std::size_t common = std::min(x.size(), y.size());
  for (std::size_t i = 0; i < common; ++i) {
    const std::string fields = differing_fields(x[i], y[i]);
    if (fields.empty()) continue;
    return "tensor " + std::to_string(i) + " differs in " + fields + ": " + a.rank + " has " + shown(x[i]) + ", " +
           b.rank + " has " + shown(y[i]);
  }
  if (x.size() == y.size()) return "";
  const NamedSpecs& longer = x.size() > y.size() ? a : b;
  return a.rank + " has " + tensors(x.size()) + ", " + b.rank + " has " + std::to_string(y.size()) +
         ": the first one more is tensor " + std::to_string(common) + " " + shown((*longer.specs)[common]) + " of " +
         longer.rank;
}

}  // namespace refit
