// The GPU delta codec's cost (issue 22): DeviceDeltaCodec encode and decode
// of llama3-8b's bf16 bytes, in 1 GiB buckets, against the one-copy floor
// of the same bytes (one cudaMemcpyAsync device-to-device per bucket),
// measured in the same run on the same stream, at change fractions 0.01,
// 0.1 and 1 of the bf16 elements.
//
//   build/delta_codec_bench [model]        (default llama3-8b; a few seconds on an H100)
//
// The buckets are one 1 GiB buffer reused (the model's bytes, cut into
// ceil(bytes / 1 GiB) buckets, the last one partial): what is timed is the
// codec's passes over each bucket's bytes, not the model's content. Every
// fraction's decode is checked against the new bytes on the device. One
// JSON row per fraction on stdout: ms for copy, encode (the encoding chosen
// and written) and decode (in place over the base), the ratios to the copy,
// and the encoded bytes over the bucket's.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "bench_cuda.h"
#include "cuda/device.h"
#include "cuda/word_delta_device.h"
#include "refit/model.h"

namespace {

__device__ unsigned long long mix(unsigned long long x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

// base: random bf16 elements; now: base with each element changed (xor a
// nonzero value) when its hash falls under `fraction` of 2^32.
__global__ void make_versions(unsigned short* base, unsigned short* now, unsigned long long elements,
                              unsigned int fraction_parts, unsigned long long seed) {
  for (unsigned long long e = blockIdx.x * 256ULL + threadIdx.x; e < elements; e += 256ULL * gridDim.x) {
    const unsigned long long h = mix(e ^ seed);
    const unsigned short b = static_cast<unsigned short>(h >> 48);
    base[e] = b;
    const bool change = static_cast<unsigned int>(h) < fraction_parts || fraction_parts == 0xffffffffu;
    now[e] = change ? static_cast<unsigned short>(b ^ (1u + ((h >> 32) & 0x7fffu))) : b;
  }
}

struct Timer {
  cudaEvent_t start, stop;
  Timer() {
    CHECK_CUDA(cudaEventCreate(&start));
    CHECK_CUDA(cudaEventCreate(&stop));
  }
  float ms(cudaStream_t s, auto&& work) {
    CHECK_CUDA(cudaEventRecord(start, s));
    work();
    CHECK_CUDA(cudaEventRecord(stop, s));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
    return t;
  }
};

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const std::string model_name = argc > 1 ? argv[1] : "llama3-8b";
  const refit::Model model = value_or_die(refit::make_model(model_name, -1), "make_model");
  std::uint64_t total = 0;
  for (const refit::Weight& w : model.weights) total += w.spec.nbytes();
  const std::uint64_t bucket = 1ull << 30;
  std::vector<std::uint64_t> buckets(total / bucket, bucket);
  if (total % bucket != 0) buckets.push_back(total % bucket);

  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  // out[0]: a full bucket's encoding; out[1]: the last (partial) bucket's.
  std::byte *now = nullptr, *base = nullptr, *out[2] = {nullptr, nullptr}, *copy = nullptr;
  CHECK_CUDA(cudaMalloc(&now, bucket));
  CHECK_CUDA(cudaMalloc(&base, bucket));
  CHECK_CUDA(cudaMalloc(&copy, bucket));
  for (std::byte*& o : out) CHECK_CUDA(cudaMalloc(&o, refit::max_encoded_bytes(bucket)));
  unsigned long long* differ = nullptr;
  CHECK_CUDA(cudaMalloc(&differ, sizeof *differ));
  refit::DeviceDeltaCodec codec = value_or_die(refit::DeviceDeltaCodec::Create(0, bucket), "codec");
  Timer timer;

  for (double fraction : {0.01, 0.1, 1.0}) {
    const auto parts = static_cast<unsigned int>(std::min(fraction * 4294967296.0, 4294967295.0));
    make_versions<<<4096, 256, 0, stream>>>(reinterpret_cast<unsigned short*>(base),
                                            reinterpret_cast<unsigned short*>(now), bucket / 2, parts, 7);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    std::vector<float> copy_ms, encode_ms, decode_ms;
    std::uint64_t encoded_total = 0;
    for (int rep = 0; rep < 3; ++rep) {
      copy_ms.push_back(timer.ms(stream, [&] {
        for (std::uint64_t n : buckets) CHECK_CUDA(cudaMemcpyAsync(copy, now, n, cudaMemcpyDeviceToDevice, stream));
      }));
      std::vector<std::uint64_t> encoded(buckets.size());
      auto slot = [&](std::size_t j) { return j + 1 == buckets.size() ? out[1] : out[0]; };
      encode_ms.push_back(timer.ms(stream, [&] {
        for (std::size_t j = 0; j < buckets.size(); ++j) {
          encoded[j] = value_or_die(codec.encode(now, base, buckets[j], 1, slot(j), stream), "encode").bytes;
        }
      }));
      encoded_total = 0;
      for (std::uint64_t e : encoded) encoded_total += e;
      // Every bucket's encoding into `copy` (each full bucket's is the same bytes), not in place.
      decode_ms.push_back(timer.ms(stream, [&] {
        for (std::size_t j = 0; j < buckets.size(); ++j) {
          CHECK_OK(codec.decode(slot(j), encoded[j], base, 1, copy, buckets[j], stream));
        }
      }));
      CHECK_CUDA(cudaMemsetAsync(differ, 0, sizeof *differ, stream));
      count_differences<<<4096, 256, 0, stream>>>(reinterpret_cast<const unsigned char*>(copy),
                                                  reinterpret_cast<const unsigned char*>(now), buckets[0], differ);
      unsigned long long bad = 0;
      CHECK_CUDA(cudaMemcpyAsync(&bad, differ, sizeof bad, cudaMemcpyDeviceToHost, stream));
      CHECK_CUDA(cudaStreamSynchronize(stream));
      if (bad != 0) {
        std::fprintf(stderr, "fraction %g: the decode differs from the new bytes in %llu bytes\n", fraction, bad);
        return 1;
      }
    }
    const float c = median(copy_ms), e = median(encode_ms), d = median(decode_ms);
    std::printf(
        "{\"model\": \"%s\", \"bytes\": %llu, \"buckets\": %zu, \"change_fraction\": %g, \"copy_ms\": %.3f, "
        "\"encode_ms\": %.3f, \"decode_ms\": %.3f, \"encode_to_copy\": %.3f, \"decode_to_copy\": %.3f, "
        "\"encoded_to_bytes\": %.4f}\n",
        model_name.c_str(), static_cast<unsigned long long>(total), buckets.size(), fraction, c, e, d, e / c, d / c,
        static_cast<double>(encoded_total) / static_cast<double>(total));
  }
  return 0;
}
