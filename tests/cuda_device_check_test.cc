// Without a usable GPU, every command given --device cuda stops at its
// option checks with "no CUDA device" and the reason (issue 17: `refit bench
// --device cuda` reported a driver error, tried to allocate 14.958 GiB and
// still printed "median 0.00 GB/s"). In a build without CUDA the reason is
// "refit was built without CUDA"; in a CUDA build on a machine without a
// GPU it is the CUDA runtime's error text.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "process_harness.h"
#include "refit/device_memory.h"

namespace refit {
namespace {

using testing::RunResult;
using testing::run_refit;

// One refused run: exit 1 (a setting refused, not a usage error), the cause
// on stderr once, and no figure on stdout.
void expect_no_cuda_device(const std::vector<std::string>& args) {
  SCOPED_TRACE(args.front());
  const RunResult r = run_refit(args, 120);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("--device cuda: no CUDA device ("), std::string::npos) << r.err;
  const std::string why = cuda_built() ? "cudaGetDeviceCount" : "refit was built without CUDA";
  EXPECT_NE(r.err.find(why), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("GB/s"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("FAILED"), std::string::npos) << r.out;  // the error is said once, on stderr
  // No allocation or measurement was tried before the refusal.
  EXPECT_EQ(r.err.find("cudaMalloc"), std::string::npos) << r.err;
}

// Catches: the check dropped from validate_rank_settings (rank_settings.cc)
// or not called first by bench and demo (bench.cc, demo.cc): bench then
// measured a ceiling and printed "median 0.00 GB/s", the demo an empty
// table, and the roles another error. Mutation tried: the require_cuda_device
// call removed from validate_rank_settings; this test failed (CPU-only
// build).
TEST(CudaDeviceCheck, DeviceCudaFailsAtOnceWithNoCudaDevice) {
  if (cuda_device_count().ok()) GTEST_SKIP() << "a CUDA device is usable here: nothing to refuse";
  expect_no_cuda_device({"bench", "--device", "cuda", "--refits", "2"});
  expect_no_cuda_device({"demo", "--device", "cuda", "--refits", "1"});
  expect_no_cuda_device({"engine", "--device", "cuda", "--coordinator", "127.0.0.1:1", "--rank", "0",
                         "--trainer-ranks", "1", "--engine-ranks", "1", "--setup-timeout", "5"});
}

// The trainer role: run_trainer (trainer_rank.cc) checks its settings
// before it makes its weight source. Catches: the check after
// make_rank_source (the model is allocated on the device first and fails
// in DeviceBuffer::Allocate, or tries to allocate 15 GiB).
TEST(CudaDeviceCheck, TrainerFailsAtOnceWithNoCudaDevice) {
  if (cuda_device_count().ok()) GTEST_SKIP() << "a CUDA device is usable here: nothing to refuse";
  expect_no_cuda_device({"trainer", "--device", "cuda", "--coordinator", "127.0.0.1:1", "--rank", "0",
                         "--trainer-ranks", "1", "--engine-ranks", "1", "--setup-timeout", "5"});
}

}  // namespace
}  // namespace refit
