// Numbers in messages, written as a person would: counts with their noun
// ("1 trainer rank", "3 trainer ranks") and durations ("60 s", "0.25 s", not
// "60.000000 s"). Byte sizes: format_bytes (refit/plan.h).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace refit {

// `n` and `noun`, with an "s" unless n is 1: format_count(1, "engine rank")
// is "1 engine rank", format_count(0, "slot") "0 slots".
std::string format_count(std::uint64_t n, std::string_view noun);

// `seconds` with at most three decimals and no trailing zeros, and " s":
// 60 -> "60 s", 0.5 -> "0.5 s", 1.2345 -> "1.234 s" (rounded), 1e-4 -> "0 s".
std::string format_seconds(double seconds);

}  // namespace refit
