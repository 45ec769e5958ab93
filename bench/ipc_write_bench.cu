// How fast can one process write into device memory that another process
// exported over CUDA IPC, against the same writes into its own memory?
// (docs/PERF.md: the refit pack kernel reaches ~1.65 TB/s into an IPC import,
// against 2.14 TB/s for a local cudaMemcpy.)
//
// The parent allocates and exports a buffer, then runs this binary again as a
// child (`--child <handle hex> <bytes>`), which imports it and times, with
// CUDA events, best of 10 each: cudaMemcpyAsync local->local, local->import,
// and BatchedCopier (one 1-D run) local->local, local->import. No arguments.
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "refit/batched_copy.h"

namespace {

#define CHECK(call)                                                                      \
  do {                                                                                   \
    cudaError_t e_ = (call);                                                             \
    if (e_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

template <typename F>
double best_gbps(std::uint64_t bytes, cudaStream_t s, F&& copy) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  copy();  // warm-up
  CHECK(cudaStreamSynchronize(s));
  double best = 0;
  for (int i = 0; i < 10; ++i) {
    CHECK(cudaEventRecord(a, s));
    copy();
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    if (ms > 0) best = std::max(best, static_cast<double>(bytes) / (ms * 1e-3) / 1e9);
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  return best;
}

int child(const char* hex, std::uint64_t bytes) {
  cudaIpcMemHandle_t handle;
  for (std::size_t i = 0; i < sizeof(handle); ++i) {
    unsigned v = 0;
    std::sscanf(hex + 2 * i, "%2x", &v);
    reinterpret_cast<unsigned char*>(&handle)[i] = static_cast<unsigned char>(v);
  }
  void* imported = nullptr;
  CHECK(cudaIpcOpenMemHandle(&imported, handle, cudaIpcMemLazyEnablePeerAccess));
  void *src = nullptr, *local = nullptr;
  CHECK(cudaMalloc(&src, bytes));
  CHECK(cudaMalloc(&local, bytes));
  CHECK(cudaMemset(src, 0x5a, bytes));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto copier = refit::BatchedCopier::Create(0);
  if (!copier.ok()) {
    std::fprintf(stderr, "%s\n", copier.status().ToString().c_str());
    return 1;
  }
  const auto* from = static_cast<const std::byte*>(src);
  const refit::CopyRun to_local = refit::copy_run_1d(from, static_cast<std::byte*>(local), bytes);
  const refit::CopyRun to_import = refit::copy_run_1d(from, static_cast<std::byte*>(imported), bytes);
  const double m_local = best_gbps(bytes, s, [&] { CHECK(cudaMemcpyAsync(local, src, bytes, cudaMemcpyDeviceToDevice, s)); });
  const double m_import = best_gbps(bytes, s, [&] { CHECK(cudaMemcpyAsync(imported, src, bytes, cudaMemcpyDeviceToDevice, s)); });
  const double k_local = best_gbps(bytes, s, [&] { (void)copier->copy({&to_local, 1}, s); });
  const double k_import = best_gbps(bytes, s, [&] { (void)copier->copy({&to_import, 1}, s); });
  std::printf("copy of %llu MiB, GB/s (best of 10, CUDA events)\n", static_cast<unsigned long long>(bytes >> 20));
  std::printf("%-40s %10.1f\n", "cudaMemcpyAsync local -> local", m_local);
  std::printf("%-40s %10.1f\n", "cudaMemcpyAsync local -> IPC import", m_import);
  std::printf("%-40s %10.1f\n", "BatchedCopier  local -> local", k_local);
  std::printf("%-40s %10.1f\n", "BatchedCopier  local -> IPC import", k_import);
  CHECK(cudaIpcCloseMemHandle(imported));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "--child") == 0) return child(argv[2], std::strtoull(argv[3], nullptr, 10));
  const std::uint64_t bytes = 4ull << 30;
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
  std::string cmd = std::string("\"/proc/") + std::to_string(::getpid()) + "/exe\" --child " + hex + " " +
                    std::to_string(bytes);
  const int rc = std::system(cmd.c_str());
  CHECK(cudaFree(buffer));
  return rc == 0 ? 0 : 1;
}
