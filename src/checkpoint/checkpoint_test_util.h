// Helpers shared by the checkpoint tests: temporary directories, tensor
// content, and sharded checkpoints written the way Hugging Face writes them.
#pragma once

#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "refit/content.h"
#include "refit/safetensors.h"

namespace refit::testing {

using Bytes = std::vector<std::byte>;

// A fresh directory under /tmp, removed with everything in it at the end.
class TempDir {
 public:
  TempDir() {
    char dir[] = "/tmp/refit-ckpt-test-XXXXXX";
    path_ = ::mkdtemp(dir);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Deterministic bytes of a tensor at `version` (content.h); bool tensors get
// 0 or 1 only, as torch expects of them.
inline Bytes content_of(const TensorSpec& spec, std::uint64_t version = 1, std::uint64_t seed = 7) {
  Bytes b(spec.nbytes());
  fill_content(content_key(seed, version, spec.name), 0, b);
  if (spec.dtype == DType::kBool) {
    for (std::byte& x : b) x &= std::byte{1};
  }
  return b;
}

// xxh64 (seed 0) of the bytes, 16 lowercase hex digits.
inline std::string xxh64_hex(std::span<const std::byte> bytes) {
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(XXH64(bytes.data(), bytes.size(), 0)));
  return out;
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Writes `specs` (bytes from content_of) as a sharded checkpoint in `dir`:
// `shards` files model-0000i-of-0000n.safetensors, contiguous runs of the
// specs, and model.safetensors.index.json. Returns the status of the writes.
inline Status write_sharded(const std::string& dir, const std::vector<TensorSpec>& specs, int shards,
                            std::uint64_t version = 1) {
  nlohmann::json weight_map = nlohmann::json::object();
  std::uint64_t total = 0;
  const std::size_t per = (specs.size() + static_cast<std::size_t>(shards) - 1) / static_cast<std::size_t>(shards);
  for (int s = 0; s < shards; ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, shards);
    std::vector<Bytes> data;
    std::vector<SafetensorsWriteTensor> tensors;
    for (std::size_t i = static_cast<std::size_t>(s) * per; i < specs.size() && i < (static_cast<std::size_t>(s) + 1) * per; ++i) {
      data.push_back(content_of(specs[i], version));
    }
    for (std::size_t i = static_cast<std::size_t>(s) * per, k = 0; k < data.size(); ++i, ++k) {
      tensors.push_back({specs[i], data[k]});
      weight_map[specs[i].name] = name;
      total += specs[i].nbytes();
    }
    RETURN_IF_ERROR(write_safetensors(dir + "/" + name, tensors, {{"format", "pt"}}));
  }
  nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_text(dir + "/model.safetensors.index.json", index.dump(2) + "\n");
  return Status::Ok();
}

}  // namespace refit::testing
