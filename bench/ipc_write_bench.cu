// How fast can one process copy into device memory that another process
// exported, against the same copies into its own memory, by the size of the
// range copied and the way the memory was shared?
//
//   build-cuda/ipc_write_bench [GiB or bytes]        (default 16 GiB)
//
// The parent allocates GiB of device memory twice and exports it: once with
// cudaMalloc + cudaIpcGetMemHandle (legacy CUDA IPC), once with cuMemCreate +
// a POSIX file descriptor (the virtual memory management API; the child
// inherits the descriptor). It then runs this binary again as the child
// (`--child ...`), which times with CUDA events (median of 5) one
// cudaMemcpyAsync of 1, 2, 4, ... GiB from its own memory into:
//   own          its own cudaMalloc buffer
//   legacy IPC   the cudaIpcOpenMemHandle mapping
//   VMM 2 MiB    the cuMemImportFromShareableHandle mapping, reserved at the
//                allocation granularity
//   VMM aligned  the same mapping reserved at an address aligned to the size
// (docs/PERF.md: a refit's copies into a 16 GB legacy IPC mapping ran at
// ~1.56 TB/s against ~2.14 TB/s into own memory.)
#include <cuda.h>
#include <cuda_runtime.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

#define CHECK(call)                                                                                \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

#define CHECK_CU(call)                                                                   \
  do {                                                                                   \
    CUresult r_ = (call);                                                                \
    if (r_ != CUDA_SUCCESS) {                                                            \
      const char* n_ = nullptr;                                                          \
      cuGetErrorName(r_, &n_);                                                           \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, n_ ? n_ : "?"); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

constexpr std::uint64_t kGiB = 1ull << 30;

double median_gbps(std::uint64_t bytes, cudaStream_t s, void* dst, const void* src) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));  // warm-up
  CHECK(cudaStreamSynchronize(s));
  std::vector<double> gbps;
  for (int i = 0; i < 5; ++i) {
    CHECK(cudaEventRecord(a, s));
    CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    gbps.push_back(static_cast<double>(bytes) / (ms * 1e-3) / 1e9);
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  std::sort(gbps.begin(), gbps.end());
  return gbps[gbps.size() / 2];
}

CUmemAllocationProp vmm_prop() {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

// Maps `handle` (bytes long) at an address aligned to `alignment`, read-write for device 0.
CUdeviceptr map_vmm(CUmemGenericAllocationHandle handle, std::uint64_t bytes, std::uint64_t alignment) {
  CUdeviceptr p = 0;
  CHECK_CU(cuMemAddressReserve(&p, bytes, alignment, 0, 0));
  CHECK_CU(cuMemMap(p, bytes, 0, handle, 0));
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = 0;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CHECK_CU(cuMemSetAccess(p, bytes, &access, 1));
  return p;
}

std::uint64_t vmm_size(std::uint64_t bytes) {
  const CUmemAllocationProp prop = vmm_prop();
  std::size_t granularity = 0;
  CHECK_CU(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  return (bytes + granularity - 1) / granularity * granularity;
}

void unmap_vmm(CUdeviceptr p, std::uint64_t bytes) {
  CHECK_CU(cuMemUnmap(p, bytes));
  CHECK_CU(cuMemAddressFree(p, bytes));
}

int child(const char* hex, int fd, std::uint64_t bytes) {
  CHECK(cudaSetDevice(0));
  cudaIpcMemHandle_t handle;
  for (std::size_t i = 0; i < sizeof(handle); ++i) {
    unsigned v = 0;
    std::sscanf(hex + 2 * i, "%2x", &v);
    reinterpret_cast<unsigned char*>(&handle)[i] = static_cast<unsigned char>(v);
  }
  void* legacy = nullptr;
  CHECK(cudaIpcOpenMemHandle(&legacy, handle, cudaIpcMemLazyEnablePeerAccess));
  CUmemGenericAllocationHandle vmm;
  CHECK_CU(cuMemImportFromShareableHandle(&vmm, reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd)),
                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  const CUmemAllocationProp prop = vmm_prop();
  std::size_t granularity = 0;
  CHECK_CU(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  void *src = nullptr, *own = nullptr;
  CHECK(cudaMalloc(&src, bytes));
  CHECK(cudaMalloc(&own, bytes));
  CHECK(cudaMemset(src, 0x5a, bytes));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const CUdeviceptr vmm_small = map_vmm(vmm, vmm_size(bytes), granularity);
  std::uint64_t big_alignment = 1;
  while (big_alignment < bytes) big_alignment <<= 1;
  std::printf("addresses mod 1 GiB (MiB): own %.1f, legacy IPC %.1f, VMM %.1f; recommended granularity %zu KiB\n",
              (reinterpret_cast<std::uintptr_t>(own) % kGiB) / 1048576.0,
              (reinterpret_cast<std::uintptr_t>(legacy) % kGiB) / 1048576.0, (vmm_small % kGiB) / 1048576.0,
              granularity >> 10);
  std::vector<std::uint64_t> sizes;
  for (std::uint64_t n = kGiB; n <= bytes; n *= 2) sizes.push_back(n);
  if (sizes.empty() || sizes.back() != bytes) sizes.push_back(bytes);
  std::vector<double> r_own, r_legacy, r_small, r_big;
  for (std::uint64_t n : sizes) {
    r_own.push_back(median_gbps(n, s, own, src));
    r_legacy.push_back(median_gbps(n, s, legacy, src));
    r_small.push_back(median_gbps(n, s, reinterpret_cast<void*>(vmm_small), src));
  }
  unmap_vmm(vmm_small, vmm_size(bytes));
  const CUdeviceptr vmm_big = map_vmm(vmm, vmm_size(bytes), big_alignment);
  for (std::uint64_t n : sizes) r_big.push_back(median_gbps(n, s, reinterpret_cast<void*>(vmm_big), src));
  std::printf("VMM aligned mapping at %.1f MiB mod 1 GiB (reserved with alignment %llu GiB)\n",
              (vmm_big % kGiB) / 1048576.0, static_cast<unsigned long long>(big_alignment / kGiB));
  std::printf("\ncudaMemcpyAsync from own memory, GB/s (median of 5, CUDA events)\n");
  std::printf("%8s %10s %12s %12s %12s\n", "GiB", "own", "legacy IPC", "VMM 2 MiB", "VMM aligned");
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    std::printf("%8.2f %10.1f %12.1f %12.1f %12.1f\n", static_cast<double>(sizes[i]) / kGiB, r_own[i],
                r_legacy[i], r_small[i], r_big[i]);
  }
  unmap_vmm(vmm_big, vmm_size(bytes));
  CHECK_CU(cuMemRelease(vmm));
  CHECK(cudaIpcCloseMemHandle(legacy));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::strcmp(argv[1], "--child") == 0) {
    return child(argv[2], std::atoi(argv[3]), std::strtoull(argv[4], nullptr, 10));
  }
  // A small number is GiB, a large one bytes (a model's arena size, say).
  const std::uint64_t arg = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 16;
  const std::uint64_t bytes = arg < 4096 ? arg * kGiB : arg;
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));  // the primary context, for the driver calls below
  void* buffer = nullptr;
  CHECK(cudaMalloc(&buffer, bytes));
  cudaIpcMemHandle_t handle;
  CHECK(cudaIpcGetMemHandle(&handle, buffer));
  std::string hex;
  char b[3];
  for (std::size_t i = 0; i < sizeof(handle); ++i) {
    std::snprintf(b, sizeof(b), "%02x", reinterpret_cast<unsigned char*>(&handle)[i]);
    hex += b;
  }
  const CUmemAllocationProp prop = vmm_prop();
  CUmemGenericAllocationHandle vmm;
  CHECK_CU(cuMemCreate(&vmm, vmm_size(bytes), &prop, 0));
  int fd = -1;  // inherited by the child (no close-on-exec)
  CHECK_CU(cuMemExportToShareableHandle(&fd, vmm, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  ::fcntl(fd, F_SETFD, 0);  // the driver sets close-on-exec
  const std::string cmd = std::string("\"/proc/") + std::to_string(::getpid()) + "/exe\" --child " + hex + " " +
                          std::to_string(fd) + " " + std::to_string(bytes);
  const int rc = std::system(cmd.c_str());
  ::close(fd);
  CHECK_CU(cuMemRelease(vmm));
  CHECK(cudaFree(buffer));
  return rc == 0 ? 0 : 1;
}
