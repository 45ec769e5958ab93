// Human-readable rendering of a refit JSON report (the demo's summary).
#pragma once

#include <cstdio>

#include <nlohmann/json.hpp>

namespace refit {

void print_report_table(const nlohmann::json& report, std::FILE* out);

}  // namespace refit
