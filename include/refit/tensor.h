// Tensor specs and non-owning tensor views.
//
// A TensorSpec names one tensor of one stream: name, dtype, shape. Its bytes
// are C-order and little-endian. A TensorView adds a pointer to those bytes;
// it never owns them: the owner (a staging buffer, an engine's weights) states
// how long the pointer stays valid.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "refit/dtype.h"

namespace refit {

enum class MemoryKind : unsigned char { kHost, kCuda };

struct TensorSpec {
  std::string name;
  DType dtype = DType::kUInt8;
  std::vector<std::int64_t> shape;  // empty shape = a scalar (one element)

  std::int64_t numel() const;
  std::uint64_t nbytes() const { return static_cast<std::uint64_t>(numel()) * dtype_size(dtype); }
  // "name bfloat16[4096, 128]"
  std::string ToString() const;

  friend bool operator==(const TensorSpec&, const TensorSpec&) = default;
};

// Validates a spec: non-empty name, no negative dimension, byte size that
// fits in 63 bits. Errors name the tensor.
Status validate_spec(const TensorSpec& spec);

struct TensorView {
  const TensorSpec* spec = nullptr;  // owned by the plan; valid while the plan lives
  std::byte* data = nullptr;         // nullptr when the payload lives in another process
  MemoryKind memory = MemoryKind::kHost;
  int device = -1;                   // CUDA device (local index) when memory == kCuda
};

}  // namespace refit
