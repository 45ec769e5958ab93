// Test helpers for the ucx transport's tests.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "transport/transport.h"

namespace refit::testing {

// True when this build of refit has the ucx transport.
inline bool ucx_built() {
  for (const std::string& name : transport_names()) {
    if (name == "ucx") return true;
  }
  return false;
}

}  // namespace refit::testing

// Skips the calling test, with the reason, in a build without UCX.
#define REFIT_SKIP_WITHOUT_UCX()                                                                               \
  do {                                                                                                         \
    if (!::refit::testing::ucx_built()) {                                                                      \
      GTEST_SKIP() << "refit was built without UCX (pkg-config found no ucx: install libucx-dev, see "         \
                      "scripts/setup.sh)";                                                                     \
    }                                                                                                          \
  } while (0)
