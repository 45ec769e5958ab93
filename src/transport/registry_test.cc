// Tests of which transports can run here (transport_availability in
// refit/transports.h). Each test says which broken implementation it
// catches ("Catches: ...").
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "refit/device_memory.h"
#include "refit/transports.h"

namespace refit {
namespace {

const TransportAvailability& find(const std::vector<TransportAvailability>& all, const std::string& name) {
  for (const TransportAvailability& t : all) {
    if (t.name == name) return t;
  }
  ADD_FAILURE() << "transport " << name << " is not listed";
  static const TransportAvailability missing;
  return missing;
}

const std::vector<std::string> kAllBuilt = {"shm", "tcp", "cuda_ipc", "ucx", "nccl"};

// Catches: cuda_ipc or nccl reported available without a CUDA device (the
// device check left out), the device error's text dropped from the reason,
// and host transports made to depend on a device.
TEST(TransportAvailability, WithoutACudaDeviceTheGpuTransportsSayWhy) {
  const Status no_device = FailedPrecondition("no CUDA device (cudaGetDeviceCount: no CUDA-capable device)");
  const auto all = transport_availability(kAllBuilt, no_device);
  for (const char* name : {"cuda_ipc", "nccl"}) {
    EXPECT_FALSE(find(all, name).available) << name;
    EXPECT_EQ(find(all, name).reason, no_device.message()) << name;
  }
  for (const char* name : {"shm", "tcp", "ucx"}) {
    EXPECT_TRUE(find(all, name).available) << name;
    EXPECT_EQ(find(all, name).reason, "") << name;
  }
}

// Catches: a transport that is built and has its device still reported
// unavailable (e.g. the device test inverted).
TEST(TransportAvailability, WithACudaDeviceEveryBuiltTransportIsAvailable) {
  const auto all = transport_availability(kAllBuilt, Status::Ok());
  ASSERT_EQ(all.size(), kAllBuilt.size());
  for (const TransportAvailability& t : all) EXPECT_TRUE(t.available) << t.name << ": " << t.reason;
}

// Catches: a transport this binary lacks reported available, or without
// saying that the build lacks it; a known transport left out of the list.
TEST(TransportAvailability, ATransportNotBuiltSaysSo) {
  const auto all = transport_availability({"shm", "tcp"}, Status::Ok());
  std::vector<std::string> names;
  for (const TransportAvailability& t : all) names.push_back(t.name);
  EXPECT_EQ(names, kAllBuilt);
  EXPECT_FALSE(find(all, "nccl").available);
  EXPECT_NE(find(all, "nccl").reason.find("built without NCCL"), std::string::npos) << find(all, "nccl").reason;
  EXPECT_NE(find(all, "cuda_ipc").reason.find("built without CUDA"), std::string::npos);
  EXPECT_NE(find(all, "ucx").reason.find("built without UCX"), std::string::npos);
}

// Catches: the live list out of step with the build (a transport built in
// but missing from the list, or listed available when transport_names()
// lacks it), and GPU transports available in a process without a device.
TEST(TransportAvailability, TheLiveListMatchesThisBuildAndMachine) {
  const auto all = transport_availability();
  const std::vector<std::string> built = transport_names();
  for (const std::string& name : built) EXPECT_TRUE(find(all, name).name == name);
  const bool has_device = cuda_device_count().ok();
  for (const TransportAvailability& t : all) {
    const bool is_built = std::find(built.begin(), built.end(), t.name) != built.end();
    const bool needs_device = t.name == "cuda_ipc" || t.name == "nccl";
    EXPECT_EQ(t.available, is_built && (!needs_device || has_device)) << t.name << ": " << t.reason;
    EXPECT_EQ(t.reason.empty(), t.available) << t.name;
  }
}

}  // namespace
}  // namespace refit
