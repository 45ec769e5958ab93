// Diagnostic benchmark for the push path (issue "Checkpoints"): how fast can
// the host copy a file's bytes from the page cache into pinned memory, and
// does that overlap with pinned host-to-device copies?
//
// Usage: pack_h2d_bench FILE_BYTES BUCKET_BYTES
// Writes a file of FILE_BYTES under /tmp (into the page cache), maps it, and
// reports, one JSON line each:
//   h2d            cudaMemcpyAsync from a pinned bucket, back to back
//   pack T         T threads copy the mapped file into a pinned bucket
//                  (a persistent pool of T threads, one barrier per bucket)
//   pipeline T     pack bucket j (T threads) while bucket j-1 goes to the device
//   pipeline-reg T the same, but the mapped file itself registered with
//                  cudaHostRegister (no host pack: the copy engine reads it),
//                  only when registration returns (it is tried last)
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A pool of T threads that each copy 1/T of [src, src + n) to dst.
class PackPool {
 public:
  explicit PackPool(int threads) : threads_(threads), start_(threads + 1), done_(threads + 1) {
    for (int t = 0; t < threads; ++t) {
      workers_.emplace_back([this, t] {
        for (;;) {
          start_.arrive_and_wait();
          if (stop_) return;
          const std::size_t share = (n_ + threads_ - 1) / threads_;
          const std::size_t from = std::min(n_, share * t), to = std::min(n_, from + share);
          if (to > from) std::memcpy(dst_ + from, src_ + from, to - from);
          done_.arrive_and_wait();
        }
      });
    }
  }
  ~PackPool() {
    stop_ = true;
    start_.arrive_and_wait();
    for (auto& w : workers_) w.join();
  }
  void copy(char* dst, const char* src, std::size_t n) {
    dst_ = dst;
    src_ = src;
    n_ = n;
    start_.arrive_and_wait();
    done_.arrive_and_wait();
  }

 private:
  int threads_;
  std::barrier<> start_, done_;
  std::vector<std::thread> workers_;
  char* dst_ = nullptr;
  const char* src_ = nullptr;
  std::size_t n_ = 0;
  bool stop_ = false;
};

void report(const char* what, int threads, std::size_t bytes, double s) {
  std::printf("{\"test\":\"%s\",\"threads\":%d,\"bytes\":%zu,\"seconds\":%.4f,\"gbps\":%.2f}\n", what, threads, bytes, s,
              bytes / s / 1e9);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t file_bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 0) : (4ull << 30);
  const std::size_t bucket = argc > 2 ? std::strtoull(argv[2], nullptr, 0) : (64ull << 20);
  const std::size_t buckets = file_bytes / bucket;
  const std::string path = "/tmp/pack_h2d_bench.bin";
  {
    int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
    std::vector<char> chunk(bucket);
    for (std::size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<char>(i * 131 + 7);
    for (std::size_t b = 0; b < buckets; ++b) {
      if (::write(fd, chunk.data(), chunk.size()) != static_cast<ssize_t>(chunk.size())) return 1;
    }
    ::close(fd);
  }
  int fd = ::open(path.c_str(), O_RDONLY);
  const std::size_t bytes = buckets * bucket;
  char* file = static_cast<char*>(::mmap(nullptr, bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0));
  if (file == MAP_FAILED) return 1;

  char* pinned[2];
  check(cudaHostAlloc(reinterpret_cast<void**>(&pinned[0]), bucket, cudaHostAllocDefault), "cudaHostAlloc");
  check(cudaHostAlloc(reinterpret_cast<void**>(&pinned[1]), bucket, cudaHostAllocDefault), "cudaHostAlloc");
  char* device = nullptr;
  check(cudaMalloc(&device, bytes), "cudaMalloc");
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  cudaEvent_t done[2];
  check(cudaEventCreateWithFlags(&done[0], cudaEventDisableTiming), "event");
  check(cudaEventCreateWithFlags(&done[1], cudaEventDisableTiming), "event");

  for (int rep = 0; rep < 2; ++rep) {
    auto t = Clock::now();
    for (std::size_t b = 0; b < buckets; ++b) {
      check(cudaMemcpyAsync(device + b * bucket, pinned[b % 2], bucket, cudaMemcpyHostToDevice, stream), "h2d");
    }
    check(cudaStreamSynchronize(stream), "sync");
    if (rep == 1) report("h2d", 0, bytes, seconds_since(t));
  }

  for (int threads : {1, 4, 8, 12, 14, 16}) {
    PackPool pool(threads);
    for (int rep = 0; rep < 2; ++rep) {
      auto t = Clock::now();
      for (std::size_t b = 0; b < buckets; ++b) pool.copy(pinned[b % 2], file + b * bucket, bucket);
      if (rep == 1) report("pack", threads, bytes, seconds_since(t));
    }
  }

  for (int threads : {8, 12, 14, 16}) {
    PackPool pool(threads);
    for (int rep = 0; rep < 2; ++rep) {
      auto t = Clock::now();
      for (std::size_t b = 0; b < buckets; ++b) {
        const int k = static_cast<int>(b % 2);
        check(cudaEventSynchronize(done[k]), "wait");  // bucket b-2's copy out of this buffer
        pool.copy(pinned[k], file + b * bucket, bucket);
        check(cudaMemcpyAsync(device + b * bucket, pinned[k], bucket, cudaMemcpyHostToDevice, stream), "h2d");
        check(cudaEventRecord(done[k], stream), "record");
      }
      check(cudaStreamSynchronize(stream), "sync");
      if (rep == 1) report("pipeline", threads, bytes, seconds_since(t));
    }
  }

  // Pageable: the driver stages it itself.
  for (int rep = 0; rep < 2; ++rep) {
    auto t = Clock::now();
    for (std::size_t b = 0; b < buckets; ++b) {
      check(cudaMemcpyAsync(device + b * bucket, file + b * bucket, bucket, cudaMemcpyHostToDevice, stream), "h2d");
    }
    check(cudaStreamSynchronize(stream), "sync");
    if (rep == 1) report("pageable-mapped-file", 0, bytes, seconds_since(t));
  }

  // An anonymous copy of the file, registered: what a resident pinned copy gives.
  {
    char* anon = static_cast<char*>(::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    auto t = Clock::now();
    {
      PackPool pool(14);
      for (std::size_t b = 0; b < buckets; ++b) pool.copy(anon + b * bucket, file + b * bucket, bucket);
    }
    report("anon-copy", 14, bytes, seconds_since(t));
    t = Clock::now();
    check(cudaHostRegister(anon, bytes, cudaHostRegisterDefault), "cudaHostRegister(anon)");
    report("register-anon", 0, bytes, seconds_since(t));
    t = Clock::now();
    check(cudaMemcpyAsync(device, anon, bytes, cudaMemcpyHostToDevice, stream), "h2d");
    check(cudaStreamSynchronize(stream), "sync");
    report("h2d-registered-anon", 0, bytes, seconds_since(t));
    check(cudaHostUnregister(anon), "unregister");
    ::munmap(anon, bytes);
  }
  std::fprintf(stderr, "trying cudaHostRegister of the read-only file mapping...\n");
  {
    auto t = Clock::now();
    cudaError_t e = cudaHostRegister(file, bytes, cudaHostRegisterReadOnly);
    std::fprintf(stderr, "cudaHostRegister(file, ReadOnly): %s after %.2f s\n", cudaGetErrorString(e), seconds_since(t));
    if (e == cudaSuccess) {
      t = Clock::now();
      check(cudaMemcpyAsync(device, file, bytes, cudaMemcpyHostToDevice, stream), "h2d");
      check(cudaStreamSynchronize(stream), "sync");
      report("h2d-registered-file", 0, bytes, seconds_since(t));
    }
  }
  ::unlink(path.c_str());
  return 0;
}
