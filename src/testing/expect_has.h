// Text checks the tests share: EXPECT_HAS(haystack, needle) fails showing
// both when `needle` is not in `haystack`; count_occurrences counts a
// needle (an error said once, not repeated by every process).
#pragma once

#include <cstddef>
#include <string>

#include <gtest/gtest.h>

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "expected \"" << (needle) << "\" in:\n" << (haystack)

namespace refit::testing {

// How often `needle` occurs in `haystack` (overlapping occurrences count).
inline std::size_t count_occurrences(const std::string& haystack, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t at = haystack.find(needle); at != std::string::npos; at = haystack.find(needle, at + 1)) ++n;
  return n;
}

}  // namespace refit::testing
