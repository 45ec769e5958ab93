// BatchedCopier bandwidth against the one-copy ceiling, on one GPU.
//
//   build-gpu/batched_copy_bench            (about a minute on an H200)
//   build-gpu/batched_copy_bench quick      (cases (a) and (e), kernel against ceiling only:
//                                            for comparing builds of the kernel's tuning knobs)
//
// For each case it measures, in the same run and on the same stream:
//   batched   BatchedCopier::copy of all runs (one launch; host-side descriptor
//             building and upload included: the clock starts before copy())
//   pipelined 8 such copies back to back, time / 8 (host work of copy k+1
//             overlaps copy k, as in a refit's pipeline)
//   prepared  BatchedCopier::prepare once, launch timed alone (kernel only)
//   ceiling   one cudaMemcpyAsync device-to-device of the same total bytes
//   per-run   one cudaMemcpyAsync / cudaMemcpy2DAsync per run (the naive way)
//   copy eng. copy_runs_with_copy_engine: the runs merged and handed to the
//             copy engines in one cudaMemcpyBatchAsync (refit/copy_engine.h)
// GB/s counts bytes copied (not read + written), median of the timed repeats.
// Every case is verified: the batched and the copy-engine results must equal
// the per-run result byte for byte (a device compare), after poisoning the
// destinations.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "bench_cuda.h"
#include "cuda/batched_copy.h"
#include "cuda/copy_engine.h"
#include "cuda/device.h"
#include "cuda/device_content.h"

namespace {

using refit::CopyRun;


__global__ void fill_pattern(unsigned char* p, std::uint64_t n) {
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    p[i] = static_cast<unsigned char>((i * 0x9E3779B1u) >> 13);
  }
}

struct Case {
  std::string name;
  std::uint64_t src_bytes = 0, dst_bytes = 0;
  std::vector<CopyRun> runs;  // offsets stored as pointers relative to nullptr, rebased below
};

struct Result {
  double batched_gbs, pipelined_gbs, prepared_gbs, ceiling_gbs, per_run_gbs, copy_engine_gbs, host_us;
  bool verified;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::uint64_t total_bytes(const std::vector<CopyRun>& runs) {
  std::uint64_t t = 0;
  for (const CopyRun& r : runs) t += r.row_bytes * r.rows;
  return t;
}

// Times `fn` (enqueuing work on `stream`) `reps` times with events; returns seconds per call (median).
template <typename F>
double time_on_stream(cudaStream_t stream, int warmup, int reps, F fn, double* host_us = nullptr) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) fn();
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> secs, host;
  for (int i = 0; i < reps; ++i) {
    CHECK_CUDA(cudaEventRecord(a, stream));
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const auto t1 = std::chrono::steady_clock::now();
    CHECK_CUDA(cudaEventRecord(b, stream));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    secs.push_back(ms / 1e3);
    host.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  if (host_us) *host_us = median(host);
  return median(secs);
}

bool g_quick = false;  // `quick`: prepared launch and ceiling only

Result run_case(const Case& c, refit::BatchedCopier& copier, cudaStream_t stream) {
  auto src = value_or_die(refit::DeviceBuffer::Allocate(0, c.src_bytes), "src");
  auto dst = value_or_die(refit::DeviceBuffer::Allocate(0, c.dst_bytes), "dst");
  auto ref = value_or_die(refit::DeviceBuffer::Allocate(0, c.dst_bytes), "ref");
  fill_pattern<<<1024, 256, 0, stream>>>(reinterpret_cast<unsigned char*>(src.data()), c.src_bytes);
  CHECK_CUDA(cudaGetLastError());
  std::vector<CopyRun> runs = c.runs;  // rebase offsets onto the buffers
  for (CopyRun& r : runs) {
    r.src = src.data() + reinterpret_cast<std::uintptr_t>(r.src);
    r.dst = dst.data() + reinterpret_cast<std::uintptr_t>(r.dst);
  }
  const std::uint64_t bytes = total_bytes(runs);
  const int reps = 10;

  if (g_quick) {
    const refit::PreparedCopy plan = value_or_die(copier.prepare(runs), "prepare");
    const double t_prepared = time_on_stream(stream, 2, reps, [&] { CHECK_OK(copier.launch(plan, stream)); });
    const double t_ceiling = time_on_stream(stream, 2, reps, [&] {
      CHECK_CUDA(cudaMemcpyAsync(ref.data(), src.data(), std::min(bytes, std::min(c.src_bytes, c.dst_bytes)),
                                 cudaMemcpyDeviceToDevice, stream));
    });
    const double gb = static_cast<double>(bytes) / 1e9;
    return Result{0, 0, gb / t_prepared, gb / t_ceiling, 0, 0, 0, true};
  }
  // Per-run copies into `ref` (also the reference for verification).
  CHECK_CUDA(cudaMemsetAsync(dst.data(), 0xA5, c.dst_bytes, stream));
  CHECK_CUDA(cudaMemsetAsync(ref.data(), 0xA5, c.dst_bytes, stream));
  auto per_run = [&] {
    for (const CopyRun& r : runs) {
      std::byte* d = ref.data() + (r.dst - dst.data());
      if (r.rows == 1) {
        CHECK_CUDA(cudaMemcpyAsync(d, r.src, r.row_bytes, cudaMemcpyDeviceToDevice, stream));
      } else {
        CHECK_CUDA(cudaMemcpy2DAsync(d, r.dst_pitch, r.src, r.src_pitch, r.row_bytes, r.rows,
                                     cudaMemcpyDeviceToDevice, stream));
      }
    }
  };
  const double t_per_run = time_on_stream(stream, 1, std::max(3, reps / 3), per_run);

  double host_us = 0;
  auto batched = [&] { CHECK_OK(copier.copy(runs, stream)); };
  const double t_batched = time_on_stream(stream, 2, reps, batched, &host_us);
  // Back to back: the host builds copy k+1 while the GPU runs copy k (a refit's pipeline).
  const int chain = 8;
  auto pipelined = [&] {
    for (int i = 0; i < chain; ++i) CHECK_OK(copier.copy(runs, stream));
  };
  const double t_pipelined = time_on_stream(stream, 1, 3, pipelined) / chain;
  // Prepared once, launched alone: the kernel with no host work and no upload.
  const refit::PreparedCopy plan = value_or_die(copier.prepare(runs), "prepare");
  const double t_prepared = time_on_stream(stream, 2, reps, [&] { CHECK_OK(copier.launch(plan, stream)); });

  // Verify: dst == per-run ref everywhere (gaps stay poisoned in both).
  auto differences = [&] {
    unsigned long long* diff = nullptr;
    CHECK_CUDA(cudaMallocAsync(&diff, sizeof *diff, stream));
    CHECK_CUDA(cudaMemsetAsync(diff, 0, sizeof *diff, stream));
    count_differences<<<2048, 256, 0, stream>>>(reinterpret_cast<const unsigned char*>(dst.data()),
                                                reinterpret_cast<const unsigned char*>(ref.data()), c.dst_bytes, diff);
    CHECK_CUDA(cudaGetLastError());
    unsigned long long host_diff = 1;
    CHECK_CUDA(cudaMemcpyAsync(&host_diff, diff, sizeof host_diff, cudaMemcpyDeviceToHost, stream));
    CHECK_CUDA(cudaFreeAsync(diff, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    return host_diff;
  };
  unsigned long long host_diff = differences();
  if (host_diff != 0) std::fprintf(stderr, "%s: batched: VERIFY FAILED: %llu bytes differ\n", c.name.c_str(), host_diff);

  // The copy engines: the same runs through copy_runs_with_copy_engine, verified the same way.
  CHECK_CUDA(cudaMemsetAsync(dst.data(), 0xA5, c.dst_bytes, stream));
  CHECK_OK(refit::copy_runs_with_copy_engine(runs, stream));
  const unsigned long long ce_diff = differences();
  if (ce_diff != 0) std::fprintf(stderr, "%s: copy engine: VERIFY FAILED: %llu bytes differ\n", c.name.c_str(), ce_diff);
  host_diff += ce_diff;
  const double t_copy_engine =
      time_on_stream(stream, 1, std::max(3, reps / 2), [&] { CHECK_OK(refit::copy_runs_with_copy_engine(runs, stream)); });

  // Ceiling: one device-to-device copy of the same number of bytes.
  auto ceiling = [&] {
    CHECK_CUDA(cudaMemcpyAsync(ref.data(), src.data(), std::min(bytes, std::min(c.src_bytes, c.dst_bytes)),
                               cudaMemcpyDeviceToDevice, stream));
  };
  const double t_ceiling = time_on_stream(stream, 2, reps, ceiling);
  const double gb = static_cast<double>(bytes) / 1e9;
  return Result{gb / t_batched, gb / t_pipelined, gb / t_prepared, gb / t_ceiling, gb / t_per_run,
                gb / t_copy_engine, host_us, host_diff == 0};
}

std::uint64_t round_up(std::uint64_t x, std::uint64_t a) { return (x + a - 1) / a * a; }

CopyRun rel_run(std::uint64_t src_off, std::uint64_t dst_off, std::uint64_t row_bytes, std::uint64_t rows,
                std::uint64_t src_pitch, std::uint64_t dst_pitch) {
  return CopyRun{reinterpret_cast<const std::byte*>(src_off), reinterpret_cast<std::byte*>(dst_off), row_bytes, rows,
                 src_pitch, dst_pitch};
}

// Pack: runs read from scattered, 256-aligned places of src and land packed
// (256-aligned) in dst, like a bucket being filled from tensors.
Case pack_case(std::string name, int n, std::uint64_t min_b, std::uint64_t max_b, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Case c;
  c.name = std::move(name);
  std::vector<std::uint64_t> sizes(n);
  std::uint64_t total = 0;
  for (auto& s : sizes) {
    s = (min_b + rng() % (max_b - min_b + 1)) / 2 * 2;  // bf16-sized
    total += round_up(s, 256);
  }
  // Sources in a shuffled order (scattered), destinations in order (packed).
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<std::uint64_t> src_off(n);
  std::uint64_t cur = 0;
  for (int i : order) {
    src_off[i] = cur;
    cur += round_up(sizes[i], 256);
  }
  std::uint64_t dcur = 0;
  for (int i = 0; i < n; ++i) {
    c.runs.push_back(rel_run(src_off[i], dcur, sizes[i], 1, sizes[i], sizes[i]));
    dcur += round_up(sizes[i], 256);
  }
  c.src_bytes = c.dst_bytes = total;
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  g_quick = argc > 1 && std::string(argv[1]) == "quick";
  const auto n = refit::cuda_device_count();
  if (!n.ok()) {
    std::printf("batched_copy_bench: no CUDA device: %s\n", n.status().message().c_str());
    return 0;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  CHECK_CUDA(cudaSetDevice(0));
  std::printf("device 0: %s, %d SMs, %.1f GiB\n", prop.name, prop.multiProcessorCount,
              static_cast<double>(prop.totalGlobalMem) / (1ull << 30));

  std::vector<Case> cases;
  {
    Case c;
    c.name = "(a) 1 run x 4 GiB";
    c.src_bytes = c.dst_bytes = 4ull << 30;
    c.runs.push_back(rel_run(0, 0, 4ull << 30, 1, 4ull << 30, 4ull << 30));
    cases.push_back(std::move(c));
  }
  cases.push_back(pack_case("(b) 10,000 runs ~300 KB", 10000, 200 << 10, 400 << 10, 1));
  {
    // 2-D: TP-4 column shards of row-major matrices: each run takes a quarter of
    // every row (row_bytes) out of rows of 4 * row_bytes, packed in dst.
    Case c;
    c.name = "(c) 2,000 2-D runs, 512 rows";
    std::mt19937_64 rng(2);
    std::uint64_t s = 0, d = 0;
    for (int i = 0; i < 2000; ++i) {
      const std::uint64_t row = (1024 + rng() % 3073) / 16 * 16, rows = 512;
      c.runs.push_back(rel_run(s + (rng() % 4) * row, d, row, rows, 4 * row, row));
      s += round_up(4 * row * rows, 256);
      d += round_up(row * rows, 256);
    }
    c.src_bytes = s;
    c.dst_bytes = d;
    cases.push_back(std::move(c));
  }
  cases.push_back(pack_case("(d) 100,000 runs 64 B-8 KB", 100000, 64, 8192, 4));
  {
    // (e) the tensors of llama3-8b (bf16, 32 layers: 291 runs, 16.06 GB), each
    // whole tensor one run, packed 256-aligned: a TP-1 refit's pack.
    Case c;
    c.name = "(e) llama3-8b tensors";
    const std::uint64_t h = 4096, kv = 1024, ffn = 14336, vocab = 128256, e = 2;
    std::vector<std::uint64_t> sizes{vocab * h * e};
    for (int layer = 0; layer < 32; ++layer) {
      for (std::uint64_t b : {h * h * e, kv * h * e, kv * h * e, h * h * e, ffn * h * e, ffn * h * e, ffn * h * e,
                              h * e, h * e}) {
        sizes.push_back(b);
      }
    }
    sizes.push_back(h * e);
    sizes.push_back(vocab * h * e);
    // Sources in a shuffled order (no two runs continue each other, so the
    // copy engine path cannot merge them), destinations packed in order.
    std::vector<std::size_t> order(sizes.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), std::mt19937_64(5));
    std::vector<std::uint64_t> src_off(sizes.size());
    std::uint64_t off = 0;
    for (std::size_t i : order) {
      src_off[i] = off;
      off += round_up(sizes[i], 256) + 256;
    }
    std::uint64_t doff = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      c.runs.push_back(rel_run(src_off[i], doff, sizes[i], 1, sizes[i], sizes[i]));
      doff += round_up(sizes[i], 256);
    }
    c.src_bytes = off;
    c.dst_bytes = doff;
    cases.push_back(std::move(c));
  }

  auto copier = value_or_die(refit::BatchedCopier::Create(0), "BatchedCopier::Create");
  auto stream = value_or_die(refit::CudaStream::Create(0), "CudaStream::Create");
  auto* s = static_cast<cudaStream_t>(stream.handle());

  // Warm up: about a second of copies first, so that the clocks have left
  // their idle state before anything is timed (a cold GPU under-reports the
  // kernel, whose instruction rate follows the SM clock, more than cudaMemcpy).
  {
    auto a = value_or_die(refit::DeviceBuffer::Allocate(0, 1ull << 30), "warm-up src");
    auto b = value_or_die(refit::DeviceBuffer::Allocate(0, 1ull << 30), "warm-up dst");
    const CopyRun run = refit::copy_run_1d(a.data(), b.data(), a.size());
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1)) {
      for (int i = 0; i < 20; ++i) CHECK_OK(copier.copy({&run, 1}, s));
      CHECK_OK(copier.synchronize());
    }
  }

  std::printf("\n%-32s %7s %6s %9s %6s %9s %6s %9s %6s %9s %8s %9s %6s %8s %s\n", "case", "runs", "GB", "batched",
              "ratio", "pipelined", "ratio", "prepared", "ratio", "ceiling", "per-run", "copy eng.", "ratio", "host us",
              "verified");
  std::printf("%-32s %7s %6s %9s %6s %9s %6s %9s %6s %9s %8s %9s %6s %8s\n", "", "", "", "GB/s", "", "GB/s", "", "GB/s",
              "", "GB/s", "GB/s", "GB/s", "", "/copy");
  bool all_ok = true;
  for (const Case& c : cases) {
    if (g_quick && c.name.rfind("(a)", 0) != 0 && c.name.rfind("(e)", 0) != 0) continue;
    const Result r = run_case(c, copier, s);
    all_ok = all_ok && r.verified;
    std::printf("%-32s %7zu %6.2f %9.1f %5.1f%% %9.1f %5.1f%% %9.1f %5.1f%% %9.1f %8.1f %9.1f %5.1f%% %8.0f %s\n",
                c.name.c_str(), c.runs.size(), static_cast<double>(total_bytes(c.runs)) / 1e9, r.batched_gbs,
                100.0 * r.batched_gbs / r.ceiling_gbs, r.pipelined_gbs, 100.0 * r.pipelined_gbs / r.ceiling_gbs,
                r.prepared_gbs, 100.0 * r.prepared_gbs / r.ceiling_gbs, r.ceiling_gbs, r.per_run_gbs,
                r.copy_engine_gbs, 100.0 * r.copy_engine_gbs / r.ceiling_gbs, r.host_us, r.verified ? "yes" : "NO");
    std::fflush(stdout);
  }
  // Content generation and verification (refit/device_content.h) over 4 GiB.
  if (!g_quick) {
    const std::uint64_t bytes = 4ull << 30;
    auto buf = value_or_die(refit::DeviceBuffer::Allocate(0, bytes + 16), "content buffer");
    std::byte* p = buf.data() + 3;  // unaligned, like a tensor inside a bucket
    const double t_fill = time_on_stream(s, 1, 5, [&] { CHECK_OK(refit::fill_content_device(7, 11, p, bytes, s)); });
    std::int64_t at = 0;
    const double t_check = time_on_stream(s, 1, 5, [&] {
      at = value_or_die(refit::first_content_mismatch_device(7, 11, p, bytes, s), "first_content_mismatch_device");
    });
    std::printf("\ncontent over 4 GiB (dst misaligned by 3): fill_content_device %.1f GB/s written, "
                "first_content_mismatch_device %.1f GB/s read (%s)\n",
                bytes / t_fill / 1e9, bytes / t_check / 1e9, at == -1 ? "all match" : "MISMATCH");
    all_ok = all_ok && at == -1;
  }

  std::printf("\nbatched: one copy() timed alone, its host time included (the clock starts before copy());\n"
              "pipelined: 8 copies back to back (host work overlaps the previous copy), time / 8;\n"
              "prepared: prepare() once, then launch() alone (the kernel only: no host work, no upload);\n"
              "ratio = GB/s / ceiling (one cudaMemcpyAsync of the same bytes); GB/s = bytes copied / time;\n"
              "per-run: one cudaMemcpyAsync/cudaMemcpy2DAsync per run; copy eng.: copy_runs_with_copy_engine\n"
              "(one cudaMemcpyBatchAsync of the merged runs); host us: time inside one copy() call\n");
  return all_ok ? 0 : 1;
}
