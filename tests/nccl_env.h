// The environment that lets NCCL ranks of several processes share one GPU
// (the nccl GPU tests on a one-GPU machine). NCCL refuses two ranks on one
// GPU ("Duplicate GPU detected": it compares the host hash and the PCI bus
// id of every rank); the host hash comes from NCCL_HOSTID when set (NCCL
// src/misc/utils.cc, getHostHash), so each process gets its own and NCCL
// treats them as hosts of their own, talking over sockets on loopback
// (NCCL_NET=Socket, NCCL_SOCKET_IFNAME=lo; P2P and SHM off, which assume one
// host). NCCL_NVLS_ENABLE=0 always (the device notes require it).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <map>
#include <string>

#include "cuda/gpu_test_util.h"
#include "refit/transports.h"

// Skips the test where no GPU exists or refit was built without nccl.
#define REFIT_SKIP_WITHOUT_NCCL()                                                                  \
  do {                                                                                             \
    REFIT_SKIP_WITHOUT_CUDA_DEVICE();                                                              \
    const auto nccl_names = ::refit::transport_names();                                            \
    if (std::find(nccl_names.begin(), nccl_names.end(), "nccl") == nccl_names.end()) {             \
      GTEST_SKIP() << "refit was built without NCCL (nccl.h / libnccl not found by CMake)";         \
    }                                                                                              \
  } while (0)

namespace refit::testing {

// The variables for process `name` (any text unique within the job).
inline std::map<std::string, std::string> nccl_own_host_env(const std::string& name) {
  std::string id = "refit-nccl-test-" + name + "-" + std::to_string(::getpid());
  for (char& c : id) {
    if (c == ' ') c = '-';
  }
  return {{"NCCL_NVLS_ENABLE", "0"}, {"NCCL_HOSTID", id},          {"NCCL_P2P_DISABLE", "1"},
          {"NCCL_SHM_DISABLE", "1"}, {"NCCL_NET", "Socket"},      {"NCCL_SOCKET_IFNAME", "lo"}};
}

}  // namespace refit::testing
