// The refit's own copies, taken apart: the exact runs a TP-1 trainer rank
// builds (refit/plan.h, refit/shard_copy.h) for a preset, written by
// BatchedCopier into destinations that differ in one thing at a time.
//
//   build-cuda/refit_layout_bench [preset [layers [bucket_bytes]]]   (default llama3-8b -1 1GiB)
//
// The parent process plays the engine: it allocates the weight arena (laid
// out by weight_arena_offsets) and one staging slot of the same size,
// exports both over CUDA IPC and runs this binary again as the trainer
// (`--child ...`), which allocates its weights (the trainer's arena), imports
// both, and times with CUDA events (median of 5, after a second of warm-up):
//   direct/arena       the direct-mode runs into the imported arena (one launch)
//   direct/arena 1GiB  the same, one launch per ~bucket_bytes (as the trainer does)
//   direct/slot        the direct-mode runs rebased onto the imported slot
//   direct/local       the direct-mode runs rebased onto a local buffer
//   staged/slot        the runs of one bucket holding everything, into the slot
//   staged/arena       the same rebased onto the imported arena
//   staged/local       the same rebased onto a local buffer
// and the ceiling: one cudaMemcpyAsync of the same bytes, local->local.
// GB/s counts bytes copied. Results are not verified (batched_copy_bench
// and the refit benchmark verify the same kernel and runs).
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_cuda.h"
#include "cuda/batched_copy.h"
#include "refit/reference_engine.h"
#include "refit/model.h"
#include "refit/plan.h"
#include "model/shard_copy.h"

namespace {

template <typename F>
double median_ms(cudaStream_t s, F&& fn) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  fn();
  CHECK_CUDA(cudaStreamSynchronize(s));
  std::vector<double> ms;
  for (int i = 0; i < 5; ++i) {
    CHECK_CUDA(cudaEventRecord(a, s));
    fn();
    CHECK_CUDA(cudaEventRecord(b, s));
    CHECK_CUDA(cudaEventSynchronize(b));
    float m = 0;
    CHECK_CUDA(cudaEventElapsedTime(&m, a, b));
    ms.push_back(m);
  }
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

std::string to_hex(const cudaIpcMemHandle_t& h) {
  std::string hex;
  char b[3];
  for (std::size_t i = 0; i < sizeof(h); ++i) {
    std::snprintf(b, sizeof(b), "%02x", reinterpret_cast<const unsigned char*>(&h)[i]);
    hex += b;
  }
  return hex;
}

void* import(const char* hex) {
  cudaIpcMemHandle_t h;
  for (std::size_t i = 0; i < sizeof(h); ++i) {
    unsigned v = 0;
    std::sscanf(hex + 2 * i, "%2x", &v);
    reinterpret_cast<unsigned char*>(&h)[i] = static_cast<unsigned char>(v);
  }
  void* p = nullptr;
  CHECK_CUDA(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
  return p;
}

struct Layout {
  refit::Model model;
  refit::Plan plan;          // bucket_bytes buckets, as the trainer uses them
  refit::Plan one_bucket;    // everything in one bucket (staged pack of a whole refit)
  std::vector<std::uint64_t> source_offsets, arena_offsets;
  std::uint64_t source_bytes = 0, arena_bytes = 0;
};

Layout make_layout(const std::string& preset, int layers, std::uint64_t bucket_bytes) {
  Layout l;
  l.model = value_or_die(refit::make_model(preset, layers), "make_model");
  std::vector<refit::TensorSpec> specs;
  for (const refit::Weight& w : l.model.weights) specs.push_back(w.spec);
  l.source_offsets = refit::weight_arena_offsets(specs, &l.source_bytes);
  l.plan = value_or_die(refit::make_plan(specs, bucket_bytes), "make_plan");
  l.arena_offsets = refit::weight_arena_offsets(l.plan.specs, &l.arena_bytes);
  l.one_bucket = value_or_die(refit::make_plan(specs, std::max(l.arena_bytes, l.source_bytes) * 2), "make_plan");
  return l;
}

// The direct-mode runs of buckets [first, last) into `arena`.
std::vector<refit::CopyRun> direct_runs(const Layout& l, const std::byte* source, std::byte* arena, std::size_t first,
                                        std::size_t last) {
  std::vector<refit::CopyRun> runs;
  for (std::size_t j = first; j < last; ++j) {
    for (const refit::PlanEntry& e : l.plan.buckets[j].entries) {
      refit::append_shard_copy_runs(l.model.weights[e.tensor], 0, 1, source + l.source_offsets[e.tensor],
                                    e.tensor_offset, e.bytes, arena + l.arena_offsets[e.tensor] + e.tensor_offset,
                                    &runs);
    }
  }
  return runs;
}

std::vector<refit::CopyRun> staged_runs(const Layout& l, const std::byte* source, std::byte* slot) {
  std::vector<refit::CopyRun> runs;
  for (const refit::PlanEntry& e : l.one_bucket.buckets.at(0).entries) {
    refit::append_shard_copy_runs(l.model.weights[e.tensor], 0, 1, source + l.source_offsets[e.tensor],
                                  e.tensor_offset, e.bytes, slot + e.bucket_offset, &runs);
  }
  return runs;
}

int child(const std::string& preset, int layers, std::uint64_t bucket_bytes, const char* arena_hex,
          const char* slot_hex) {
  const Layout l = make_layout(preset, layers, bucket_bytes);
  auto* arena = static_cast<std::byte*>(import(arena_hex));
  auto* slot = static_cast<std::byte*>(import(slot_hex));
  const std::uint64_t local_bytes = std::max(l.arena_bytes, l.one_bucket.buckets[0].bytes);
  std::byte *source = nullptr, *local = nullptr;
  CHECK_CUDA(cudaMalloc(&source, l.source_bytes));
  CHECK_CUDA(cudaMalloc(&local, local_bytes));
  CHECK_CUDA(cudaMemset(source, 0x5a, l.source_bytes));
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto copier = value_or_die(refit::BatchedCopier::Create(0), "BatchedCopier::Create");
  auto copy = [&](const std::vector<refit::CopyRun>& runs) {
    const refit::Status st = copier.copy(runs, s);
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      std::exit(1);
    }
  };
  {  // warm-up: a second of copies
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1)) {
      CHECK_CUDA(cudaMemcpyAsync(local, source, std::min(local_bytes, l.source_bytes), cudaMemcpyDeviceToDevice, s));
      CHECK_CUDA(cudaStreamSynchronize(s));
    }
  }
  const std::uint64_t bytes = l.model.total_bytes();
  std::printf("%s, %d layers: %zu tensors, %.2f GB; buckets of %llu MiB: %zu\n", preset.c_str(), layers,
              l.model.weights.size(), bytes / 1e9, static_cast<unsigned long long>(bucket_bytes >> 20),
              l.plan.buckets.size());
  const double ceiling =
      median_ms(s, [&] { CHECK_CUDA(cudaMemcpyAsync(local, source, bytes, cudaMemcpyDeviceToDevice, s)); });
  const double ceiling_ipc =
      median_ms(s, [&] { CHECK_CUDA(cudaMemcpyAsync(arena, source, bytes, cudaMemcpyDeviceToDevice, s)); });
  auto report = [&](const char* what, double ms) {
    std::printf("%-28s %8.3f ms %8.1f GB/s  x%.3f of the ceiling\n", what, ms, bytes / (ms * 1e-3) / 1e9,
                ms / ceiling);
    std::fflush(stdout);
  };
  report("ceiling (cudaMemcpy local)", ceiling);
  report("cudaMemcpy -> IPC arena", ceiling_ipc);
  const std::size_t nb = l.plan.buckets.size();
  const auto d_arena = direct_runs(l, source, arena, 0, nb);
  report("direct/arena", median_ms(s, [&] { copy(d_arena); }));
  // Launches of about bucket_bytes each, as the trainer's direct path.
  std::vector<std::vector<refit::CopyRun>> groups;
  for (std::size_t j = 0; j < nb; ++j) groups.push_back(direct_runs(l, source, arena, j, j + 1));
  report("direct/arena per bucket", median_ms(s, [&] {
           for (const auto& g : groups) copy(g);
         }));
  const auto d_slot = direct_runs(l, source, slot, 0, nb);
  report("direct/slot", median_ms(s, [&] { copy(d_slot); }));
  const auto d_local = direct_runs(l, source, local, 0, nb);
  report("direct/local", median_ms(s, [&] { copy(d_local); }));
  const auto st_slot = staged_runs(l, source, slot);
  report("staged/slot", median_ms(s, [&] { copy(st_slot); }));
  const auto st_arena = staged_runs(l, source, arena);
  report("staged/arena", median_ms(s, [&] { copy(st_arena); }));
  const auto st_local = staged_runs(l, source, local);
  report("staged/local", median_ms(s, [&] { copy(st_local); }));
  // The same direct runs with source and destination swapped in role: the
  // trainer's arena written from the imported arena (reads through IPC).
  std::vector<refit::CopyRun> reversed = d_arena;
  for (refit::CopyRun& r : reversed) {
    std::swap(r.src_pitch, r.dst_pitch);
    const std::byte* from = r.dst;
    r.dst = const_cast<std::byte*>(r.src);
    r.src = from;
  }
  report("direct reversed (IPC->own)", median_ms(s, [&] { copy(reversed); }));
  CHECK_CUDA(cudaIpcCloseMemHandle(arena));
  CHECK_CUDA(cudaIpcCloseMemHandle(slot));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 7 && std::strcmp(argv[1], "--child") == 0) {
    return child(argv[2], std::atoi(argv[3]), std::strtoull(argv[4], nullptr, 10), argv[5], argv[6]);
  }
  const std::string preset = argc > 1 ? argv[1] : "llama3-8b";
  const int layers = argc > 2 ? std::atoi(argv[2]) : -1;
  const std::uint64_t bucket = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : (1ull << 30);
  const Layout l = make_layout(preset, layers, bucket);
  void *arena = nullptr, *slot = nullptr;
  CHECK_CUDA(cudaMalloc(&arena, l.arena_bytes));
  CHECK_CUDA(cudaMalloc(&slot, std::max(l.arena_bytes, l.one_bucket.buckets[0].bytes)));
  cudaIpcMemHandle_t ha, hs;
  CHECK_CUDA(cudaIpcGetMemHandle(&ha, arena));
  CHECK_CUDA(cudaIpcGetMemHandle(&hs, slot));
  const std::string cmd = std::string("\"/proc/") + std::to_string(::getpid()) + "/exe\" --child " + preset + " " +
                          std::to_string(layers) + " " + std::to_string(bucket) + " " + to_hex(ha) + " " + to_hex(hs);
  const int rc = std::system(cmd.c_str());
  CHECK_CUDA(cudaFree(arena));
  CHECK_CUDA(cudaFree(slot));
  return rc == 0 ? 0 : 1;
}
