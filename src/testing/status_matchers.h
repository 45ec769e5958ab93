// Test helpers for Status and StatusOr: ASSERT_OK / EXPECT_OK print the
// status's message when it is not OK; ASSERT_OK_AND_ASSIGN(lhs, expr)
// asserts that a StatusOr holds a value and moves it into lhs.
#pragma once

#include <gtest/gtest.h>

#include "refit/status.h"

namespace refit::testing_internal {

inline const Status& status_of(const Status& s) { return s; }
template <typename T>
Status status_of(const StatusOr<T>& s) {
  return s.ok() ? Status::Ok() : s.status();
}

}  // namespace refit::testing_internal

#define REFIT_TEST_CONCAT_INNER(a, b) a##b
#define REFIT_TEST_CONCAT(a, b) REFIT_TEST_CONCAT_INNER(a, b)

#define ASSERT_OK(expr)                                                          \
  do {                                                                           \
    const ::refit::Status refit_assert_ok_ = ::refit::testing_internal::status_of(expr); \
    ASSERT_TRUE(refit_assert_ok_.ok()) << refit_assert_ok_.ToString();            \
  } while (0)

#define EXPECT_OK(expr)                                                          \
  do {                                                                           \
    const ::refit::Status refit_expect_ok_ = ::refit::testing_internal::status_of(expr); \
    EXPECT_TRUE(refit_expect_ok_.ok()) << refit_expect_ok_.ToString();            \
  } while (0)

#define REFIT_ASSERT_OK_AND_ASSIGN_IMPL(var, lhs, expr) \
  auto var = (expr);                                    \
  ASSERT_TRUE(var.ok()) << var.status().ToString();     \
  lhs = std::move(var).value()

#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  REFIT_ASSERT_OK_AND_ASSIGN_IMPL(REFIT_TEST_CONCAT(refit_statusor_, __LINE__), lhs, expr)
