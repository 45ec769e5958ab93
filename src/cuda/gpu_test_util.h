// Helpers shared by the GPU tests (label gpu; src/**/*_gpu_test.cc).
#pragma once

#include <gtest/gtest.h>

#include "cuda/device.h"

// Skips the calling test (or SetUp) with the reason when there is no usable
// CUDA device, or refit was built without CUDA: "no CUDA device: <why>".
#define REFIT_SKIP_WITHOUT_CUDA_DEVICE()                                          \
  do {                                                                            \
    const ::refit::StatusOr<int> refit_devices_ = ::refit::cuda_device_count();   \
    if (!refit_devices_.ok()) {                                                   \
      GTEST_SKIP() << "no CUDA device: " << refit_devices_.status().message();    \
    }                                                                             \
  } while (0)

// ASSERT that a Status / StatusOr is OK, printing the message when not.
#define REFIT_ASSERT_OK(expr)                                   \
  do {                                                          \
    const ::refit::Status refit_s_ = (expr);                    \
    ASSERT_TRUE(refit_s_.ok()) << #expr << ": " << refit_s_.ToString(); \
  } while (0)

#define REFIT_ASSERT_OK_AND_ASSIGN(lhs, expr)                                              \
  auto REFIT_CONCAT_(refit_or_, __LINE__) = (expr);                                        \
  ASSERT_TRUE(REFIT_CONCAT_(refit_or_, __LINE__).ok())                                     \
      << #expr << ": " << REFIT_CONCAT_(refit_or_, __LINE__).status().ToString();          \
  lhs = std::move(REFIT_CONCAT_(refit_or_, __LINE__)).value()
