// The amax exchange's combination: see amax_exchange.h.
#include "control/amax_exchange.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <tuple>

namespace refit {

StatusOr<std::vector<AmaxEntry>> combine_amax(const std::vector<std::vector<AmaxEntry>>& shares) {
  auto key = [](const AmaxEntry& e) { return std::tie(e.tensor, e.block); };
  std::vector<AmaxEntry> all;
  for (std::size_t s = 0; s < shares.size(); ++s) {
    std::vector<AmaxEntry> mine = shares[s];
    std::sort(mine.begin(), mine.end(), [&](const AmaxEntry& a, const AmaxEntry& b) { return key(a) < key(b); });
    for (std::size_t i = 0; i < mine.size(); ++i) {
      const AmaxEntry& e = mine[i];
      const std::string where = "share " + std::to_string(s) + ": tensor " + std::to_string(e.tensor) + ", block " +
                                std::to_string(e.block);
      if (e.bits > kMaxAmaxBits) {
        char hex[16];
        std::snprintf(hex, sizeof hex, "0x%08x", e.bits);
        return InvalidArgument(where + ": amax bits " + hex + " are not a finite value >= 0");
      }
      if (i > 0 && key(mine[i - 1]) == key(e)) return InvalidArgument(where + " is listed twice");
    }
    all.insert(all.end(), mine.begin(), mine.end());
  }
  std::sort(all.begin(), all.end(), [&](const AmaxEntry& a, const AmaxEntry& b) { return key(a) < key(b); });
  std::vector<AmaxEntry> out;
  for (const AmaxEntry& e : all) {
    if (!out.empty() && key(out.back()) == key(e)) {
      out.back().bits = std::max(out.back().bits, e.bits);
    } else {
      out.push_back(e);
    }
  }
  return out;
}

}  // namespace refit
