// Test inputs for the FP8 kernels' GPU tests (cuda/fp8_block_gpu_test.cc,
// cuda/fp8_part_gpu_test.cc): random finite weights whose 128 x 128 blocks
// take the cases the format must get right, encoded as bf16 or fp32.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "quant/fp8_block.h"
#include "refit/dtype.h"

namespace refit::fp8_test {

inline float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }
inline std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }

inline std::vector<std::byte> encode(DType dtype, const std::vector<float>& values) {
  std::vector<std::byte> out(values.size() * dtype_size(dtype));
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::uint32_t u = bits_of(values[i]);
    if (dtype == DType::kBFloat16) {
      const auto h = static_cast<std::uint16_t>(u >> 16);
      std::memcpy(out.data() + 2 * i, &h, 2);
    } else {
      std::memcpy(out.data() + 4 * i, &u, 4);
    }
  }
  return out;
}

// Random finite values (truncated to bf16 for a bf16 source), a kind per
// 128 x 128 block: random bit patterns, normals of a random magnitude,
// exact ties (amax 448 * s, s = (8 + j) / 8 * 2^k, the rest e4m3 codes or
// midpoints times s), zeros of both signs with tiny values, uniform values.
inline std::vector<float> random_values(DType dtype, std::uint64_t seed, std::int64_t E, std::int64_t R,
                                        std::int64_t C) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  const std::int64_t rb = fp8_blocks(R), cb = fp8_blocks(C);
  std::vector<int> kind(E * rb * cb), shift(E * rb * cb);
  for (std::size_t i = 0; i < kind.size(); ++i) {
    kind[i] = static_cast<int>(rng() % 5);
    shift[i] = static_cast<int>(rng() % 41) - 20;
  }
  auto finite = [&](std::uint32_t u) {
    if (dtype == DType::kBFloat16) u &= 0xFFFF0000u;
    if ((u & 0x7F800000u) == 0x7F800000u) u &= 0xBFFFFFFFu;
    return from_bits(u);
  };
  std::vector<float> v(E * R * C);
  for (std::int64_t m = 0; m < E; ++m) {
    for (std::int64_t r = 0; r < R; ++r) {
      for (std::int64_t c = 0; c < C; ++c) {
        const std::int64_t blk = (m * rb + r / 128) * cb + c / 128;
        float x = 0;
        switch (kind[blk]) {
          case 0: x = finite(static_cast<std::uint32_t>(rng())); break;
          case 1: x = std::ldexp(normal(rng), shift[blk] * 6); break;
          case 2: {  // s = (8 + j) / 8 * 2^k exactly, so x / s lands on codes and ties
            const float step = static_cast<float>(8 + (shift[blk] + 20) % 8) / 8.0f;
            if (r % 128 == 0 && c % 128 == 0) {
              x = 448.0f * step;
            } else {
              const auto code = static_cast<std::uint8_t>(rng() % 0x7E);
              const float lo = e4m3_to_float(code), hi = e4m3_to_float(static_cast<std::uint8_t>(code + 1));
              x = (rng() % 2 ? lo : lo + (hi - lo) / 2) * step;
            }
            x = std::ldexp(rng() % 2 ? -x : x, shift[blk]);
            break;
          }
          case 3: {
            const std::uint64_t p = rng() % 16;
            x = p < 6 ? 0.0f : p < 12 ? -0.0f : finite(static_cast<std::uint32_t>(rng() % 0x00900000u | (p % 2) << 31));
            break;
          }
          default: x = std::uniform_real_distribution<float>(-1, 1)(rng) * std::ldexp(1.0f, shift[blk]); break;
        }
        v[(m * R + r) * C + c] = finite(bits_of(x));
      }
    }
  }
  return v;
}

}  // namespace refit::fp8_test
