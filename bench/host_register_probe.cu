// Diagnostic (issue "Checkpoints"): which ways of registering a mapped file
// with the GPU return, and how fast the copy engine then reads it.
// Each variant runs in a child process killed after 30 s, so a hanging
// cudaHostRegister is reported instead of hanging the probe.
// Usage: host_register_probe [FILE_BYTES]
#include <cuda_runtime.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Variant {
  const char* name;
  int map_flags;
  unsigned register_flags;
  std::size_t offset;  // registered range starts here (not page aligned when odd)
  bool touch_first;    // read every page before registering
};

int run_variant(const Variant& v, const std::string& path, std::size_t bytes) {
  int fd = ::open(path.c_str(), O_RDONLY);
  char* file = static_cast<char*>(::mmap(nullptr, bytes, PROT_READ, v.map_flags, fd, 0));
  if (file == MAP_FAILED) return 2;
  if (v.touch_first) {
    volatile char sum = 0;
    for (std::size_t i = 0; i < bytes; i += 4096) sum = sum + file[i];
  }
  cudaFree(nullptr);
  auto t = Clock::now();
  cudaError_t e = cudaHostRegister(file + v.offset, bytes - v.offset, v.register_flags);
  const double reg_s = since(t);
  if (e != cudaSuccess) {
    std::printf("{\"variant\":\"%s\",\"register\":\"%s\",\"seconds\":%.3f}\n", v.name, cudaGetErrorString(e), reg_s);
    return 0;
  }
  char* device = nullptr;
  cudaMalloc(&device, bytes);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    t = Clock::now();
    cudaMemcpyAsync(device, file + v.offset, bytes - v.offset, cudaMemcpyHostToDevice, s);
    cudaError_t c = cudaStreamSynchronize(s);
    if (c != cudaSuccess) {
      std::printf("{\"variant\":\"%s\",\"copy\":\"%s\"}\n", v.name, cudaGetErrorString(c));
      return 0;
    }
    best = std::max(best, (bytes - v.offset) / since(t) / 1e9);
  }
  // Many small copies (4 KiB .. 64 KiB) out of the registered range.
  t = Clock::now();
  std::size_t moved = 0, copies = 0;
  for (std::size_t off = v.offset; off + 65536 < bytes && moved < (256u << 20); off += 65536 + 4096) {
    cudaMemcpyAsync(device + off, file + off, 65536, cudaMemcpyHostToDevice, s);
    moved += 65536;
    ++copies;
  }
  cudaStreamSynchronize(s);
  const double small_gbps = moved / since(t) / 1e9;
  t = Clock::now();
  cudaError_t u = cudaHostUnregister(file + v.offset);
  std::printf(
      "{\"variant\":\"%s\",\"register\":\"ok\",\"seconds\":%.3f,\"h2d_gbps\":%.2f,\"small_copies\":%zu,"
      "\"small_gbps\":%.2f,\"unregister\":\"%s\",\"unregister_s\":%.3f}\n",
      v.name, reg_s, best, copies, small_gbps, cudaGetErrorString(u), since(t));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 0) : (1ull << 30);
  const std::string path = "/tmp/host_register_probe.bin";
  {
    int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
    std::vector<char> chunk(1 << 20, 7);
    for (std::size_t b = 0; b < bytes / chunk.size(); ++b) {
      if (::write(fd, chunk.data(), chunk.size()) != static_cast<ssize_t>(chunk.size())) return 1;
    }
    ::close(fd);
  }
  const unsigned runtime_flags = cudaHostRegisterPortable | cudaHostRegisterMapped | cudaHostRegisterReadOnly;
  const Variant variants[] = {
      {"shared+populate, ReadOnly", MAP_SHARED | MAP_POPULATE, cudaHostRegisterReadOnly, 0, false},
      {"private, runtime flags", MAP_PRIVATE, runtime_flags, 0, false},
      {"private touched, runtime flags", MAP_PRIVATE, runtime_flags, 0, true},
      {"private, runtime flags, offset 1000", MAP_PRIVATE, runtime_flags, 1000, false},
      {"private, ReadOnly only", MAP_PRIVATE, cudaHostRegisterReadOnly, 0, false},
      {"shared, runtime flags", MAP_SHARED, runtime_flags, 0, false},
      {"shared, runtime flags, offset 1000", MAP_SHARED, runtime_flags, 1000, false},
      {"private, Default (no ReadOnly)", MAP_PRIVATE, cudaHostRegisterDefault, 0, false},
  };
  for (const Variant& v : variants) {
    std::fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
      const int rc = run_variant(v, path, bytes);
      std::fflush(stdout);
      _exit(rc);
    }
    auto t = Clock::now();
    int status = 0;
    for (;;) {
      if (waitpid(child, &status, WNOHANG) == child) break;
      if (since(t) > 30) {
        kill(child, SIGKILL);
        waitpid(child, &status, 0);
        std::printf("{\"variant\":\"%s\",\"register\":\"HUNG (killed after 30 s)\"}\n", v.name);
        break;
      }
      usleep(20000);
    }
    std::fflush(stdout);
  }
  ::unlink(path.c_str());
  return 0;
}
