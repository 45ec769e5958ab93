// TensorSpec lists as JSON ([[name, dtype, [dims...]], ...]) for control
// messages. Parsing validates every element and names the bad one.
#pragma once

#include <vector>

#include "control/control_message.h"
#include "refit/tensor.h"

namespace refit {

Json specs_to_json(const std::vector<TensorSpec>& specs);
StatusOr<std::vector<TensorSpec>> specs_from_json(const Json& json, const std::string& what);

}  // namespace refit
