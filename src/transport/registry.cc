// The transports built into this binary. Adding one is one line in kTransports
// (plus its factory's header); nothing else in refit names a transport.
#include <algorithm>
#include <iterator>

#include "cuda/device.h"
#include "refit/transports.h"
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

// Every transport refit knows, built in or not, and what it needs at run time.
struct Known {
  const char* name;
  const char* not_built;  // the reason when this binary lacks it
  bool needs_cuda_device;
};

constexpr Known kKnown[] = {
    {"shm", "built without shm", false},
    {"tcp", "built without tcp", false},
    {"cuda_ipc", "built without CUDA (configure with CUDA to build it)", true},
    {"ucx", "built without UCX (pkg-config found no ucx when refit was configured)", false},
    {"nccl", "built without NCCL (it needs CUDA and libnccl when refit is configured)", true},
};

}  // namespace

std::vector<TransportAvailability> transport_availability(const std::vector<std::string>& built,
                                                          const Status& cuda_device) {
  std::vector<TransportAvailability> out;
  for (const Known& k : kKnown) {
    TransportAvailability a{k.name, false, ""};
    if (std::find(built.begin(), built.end(), k.name) == built.end()) {
      a.reason = k.not_built;
    } else if (k.needs_cuda_device && !cuda_device.ok()) {
      a.reason = cuda_device.message();
    } else {
      a.available = true;
    }
    out.push_back(std::move(a));
  }
  return out;
}

std::vector<TransportAvailability> transport_availability() {
  return transport_availability(transport_names(), require_cuda_device());
}

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
