// The transports built into this binary. Adding one is one line in kTransports
// (plus its factory's header); nothing else in refit names a transport.
#include <iterator>

#include "transport/cuda_ipc/cuda_ipc_transport.h"
#include "transport/nccl/nccl_transport.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/ucx/ucx_transport.h"

namespace refit {
namespace {

struct Registered {
  const char* name;
  std::unique_ptr<Transport> (*make)();
};

constexpr Registered kTransports[] = {
    {"shm", &make_shm_transport},
    {"tcp", &make_tcp_transport},
#if REFIT_HAVE_CUDA
    {"cuda_ipc", &make_cuda_ipc_transport},  // needs the CUDA runtime: built only with CUDA
#endif
#if REFIT_HAVE_UCX
    {"ucx", &make_ucx_transport},  // needs libucp: built only when pkg-config finds UCX
#endif
#if REFIT_HAVE_NCCL
    {"nccl", &make_nccl_transport},  // needs libnccl: built only with CUDA and NCCL
#endif
};

}  // namespace

std::vector<std::string> transport_names() {
  std::vector<std::string> names;
  for (const Registered& t : kTransports) names.emplace_back(t.name);
  return names;
}

TransportTopology transport_topology(const std::string& name) {
  TransportTopology t;
  if (name == "nccl") t.shared_gpu_serializes = true;
  if (name == "ucx") t.memory_path_report_field = "ucx_memory_path";
  return t;
}

StatusOr<std::unique_ptr<Transport>> make_transport(const std::string& name) {
  for (const Registered& t : kTransports) {
    if (name == t.name) return t.make();
  }
  std::string known;
  for (const Registered& t : kTransports) {
    if (!known.empty()) known += ", ";
    known += t.name;
  }
  return InvalidArgument("unknown transport \"" + name + "\" (known: " + known + ")");
}

}  // namespace refit
