// Test helper: one engine rank's tensors whose every version has known
// bytes, as aligned batches for a ReferenceEngine (the shadow-weight and
// reader tests). Tensor i ("t<i>", uint8, `bytes` bytes) of version v is all
// the byte (v * 31 + i) & 0xFF.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "refit/batch.h"
#include "refit/tensor.h"

namespace refit::testing {

struct VersionedTensors {
  std::vector<std::vector<TensorSpec>> streams{1};  // one rank's
  std::vector<std::vector<std::byte>> bytes;        // the last batch's source bytes, per tensor

  VersionedTensors(int count, std::int64_t size) {
    for (int i = 0; i < count; ++i) streams[0].push_back(TensorSpec{"t" + std::to_string(i), DType::kUInt8, {size}});
    bytes.assign(static_cast<std::size_t>(count), std::vector<std::byte>(static_cast<std::size_t>(size)));
  }
  static std::byte pattern(std::uint64_t version, std::size_t i) { return std::byte((version * 31 + i) & 0xFF); }
  static std::string name(std::size_t i) { return "t" + std::to_string(i); }

  // Tensors [first, last) of `version` as one aligned batch (sequence `first`).
  AlignedBatch batch(std::uint64_t version, int first, int last) {
    AlignedBatch out;
    out.sequence = static_cast<std::uint64_t>(first);
    out.payload.resize(1);
    for (int i = first; i < last; ++i) {
      std::fill(bytes[i].begin(), bytes[i].end(), pattern(version, static_cast<std::size_t>(i)));
      out.specs.push_back(&streams[0][i]);
      out.payload[0].push_back(TensorView{&streams[0][i], bytes[i].data(), MemoryKind::kHost, -1});
    }
    return out;
  }

  // Whether `size` bytes at p are all tensor i's of `version`.
  bool holds(const std::byte* p, std::uint64_t version, std::size_t i) const {
    const std::size_t n = bytes.at(i).size();
    return p != nullptr && std::all_of(p, p + n, [&](std::byte b) { return b == pattern(version, i); });
  }
};

}  // namespace refit::testing
