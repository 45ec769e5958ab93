// safetensors files: a validating, zero-copy reader and a writer.
//
// The format (huggingface/safetensors, README "Format"):
//   8 bytes   N, a little-endian u64: the length of the header
//   N bytes   the header: a UTF-8 JSON object that begins with '{' and may be
//             padded at the end with spaces:
//               {"NAME": {"dtype": "BF16", "shape": [4096, 128],
//                         "data_offsets": [BEGIN, END]}, ...,
//                "__metadata__": {"format": "pt"}}
//   the rest  the data section: tensor NAME's bytes are [BEGIN, END) of it,
//             C order, little-endian
//
// The reader refuses a file that breaks any rule of the format, with an error
// that names the file, the tensor and the rule:
//   * the file holds the 8-byte length; N <= kSafetensorsMaxHeaderBytes
//     (100,000,000, the reference implementation's limit); 8 + N <= file size
//   * at most kSafetensorsMaxTensors (2^18) tensors
//   * the header begins with '{' and is valid JSON (so valid UTF-8), an
//     object, with no duplicate key in any object (the spec forbids them; a
//     JSON parser would silently keep one of the two)
//   * `__metadata__`, when present, is an object of string -> string
//   * every other key is a non-empty tensor name whose value is an object of
//     exactly the fields dtype (a string), shape (an array of non-negative
//     integers) and data_offsets (an array of two non-negative integers)
//   * dtype is a safetensors dtype that refit has (table below)
//   * BEGIN <= END <= size of the data section; END - BEGIN equals the
//     product of the shape times the element size (computed without overflow)
//   * the ranges do not overlap and cover the data section exactly: no hole
//     between two tensors, no trailing byte after the last one (the spec:
//     "the byte buffer needs to be entirely indexed, and cannot contain
//     holes"). Empty tensors (a 0 in the shape: 0 bytes) and 0-dim tensors
//     (shape []: one element) are valid.
// Stricter than the reference implementation: unknown fields in a tensor
// entry and empty tensor names are refused (the reference ignores the
// former); the leading '{' is required (the spec says MUST; older reference
// versions did not check it).
//
// Error codes: kDataLoss when the file is shorter than its header says (a
// truncated file: the header length or a tensor's END runs past the end);
// kInvalidArgument for every other broken rule, including a dtype refit does
// not support; open/mmap failures carry the errno's code (kNotFound, ...).
//
// dtypes (safetensors name -> refit DType): BOOL bool, U8 uint8, I8 int8,
// I16 int16, I32 int32, I64 int64, F16 float16, BF16 bfloat16, F32 float32,
// F64 float64, F8_E4M3 float8_e4m3fn, F8_E5M2 float8_e5m2. Known to the
// format but not to refit, so refused naming the tensor and the dtype: U16,
// U32, U64, F8_E8M0, F4, F6_E2M3, F6_E3M2, C64.
//
// Byte order: refit runs on little-endian hosts only (x86-64, aarch64), so
// tensor bytes are used as they are in the file (a static_assert in the
// reader and the writer guards this).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "refit/dtype.h"
#include "refit/status.h"
#include "refit/tensor.h"

namespace refit {

inline constexpr std::uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;
// The most tensors one file may list: 2^18 (262,144). Real checkpoints hold
// at most about 10^5 tensors in all their files together (a consolidated
// Kimi-K2, one tensor per expert matrix and scale: ~1.4 x 10^5), most files
// a few thousand. Empty tensors need no data bytes, so only this bounds a
// header of millions of them: the header is streamed (the parser keeps
// ~200 bytes per tensor, about 3x the entry's text), and the entry past the
// limit is refused as soon as it is read (a 94 MB header of 1.7 million:
// refused in 1.1 s with 0.15 GB of memory, where it was accepted after
// 35 s and 3.2 GB).
inline constexpr std::size_t kSafetensorsMaxTensors = std::size_t{1} << 18;

// "BF16" -> DType::kBFloat16. A dtype of the format that refit lacks (U16,
// ...) and an unknown name are kInvalidArgument naming the string.
StatusOr<DType> dtype_from_safetensors(std::string_view name);
// DType::kBFloat16 -> "BF16".
std::string_view safetensors_dtype_name(DType dtype);

// One tensor of a file: its spec and its bytes' range in the data section.
struct SafetensorsTensor {
  TensorSpec spec;
  std::uint64_t begin = 0;  // [begin, end) relative to the start of the data section
  std::uint64_t end = 0;
  friend bool operator==(const SafetensorsTensor&, const SafetensorsTensor&) = default;
};

// A parsed and validated header.
struct SafetensorsHeader {
  std::uint64_t header_bytes = 0;  // N, padding included
  std::uint64_t data_offset = 0;   // 8 + N: where the data section starts in the file
  std::uint64_t data_bytes = 0;    // size of the data section
  // In storage order: by begin offset (empty tensors sharing an offset, by name).
  std::vector<SafetensorsTensor> tensors;
  std::map<std::string, std::string> metadata;  // __metadata__; empty when absent
};

// Parses and validates a whole file held in memory (`file` is every byte of
// it). `file_name` only names the file in errors. Pure function; the fuzz
// target (fuzz/safetensors_header_fuzz.cc) feeds it arbitrary bytes.
StatusOr<SafetensorsHeader> parse_safetensors(std::span<const std::byte> file, std::string_view file_name);

// A safetensors file mapped read-only (mmap) and validated.
//
// Lifetime: data() spans point into the mapping; they stay valid while this
// object (or the one it was moved into) lives.
// Files that change while in use: a file truncated while mapped would raise
// SIGBUS on the next read of a vanished page; the mapping is guarded
// (checkpoint/mapping_guard.h), so such a read returns zeros instead and
// check_unchanged() reports it. Whoever reads the bytes calls
// check_unchanged() after reading them and before trusting them (a trainer
// before it says "sent"), so zeros are never used as weights.
// Thread safety: immutable after Open; any number of threads may read.
class SafetensorsFile {
 public:
  // Maps and validates `path`. Errors name the path (see the header comment).
  // A path that is not a regular file (a FIFO, a directory, a device) is
  // refused before anything is read, without blocking (kInvalidArgument
  // naming what it is).
  static StatusOr<SafetensorsFile> Open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  // In storage order (by begin offset).
  const std::vector<SafetensorsTensor>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  std::uint64_t file_size() const { return size_; }

  // The tensor named `name`, or nullptr.
  const SafetensorsTensor* find(std::string_view name) const;
  // A tensor's bytes, zero-copy. REQUIRES: `tensor` is one of tensors().
  std::span<const std::byte> data(const SafetensorsTensor& tensor) const;
  // Every byte of the file.
  std::span<const std::byte> bytes() const { return {base_, static_cast<std::size_t>(size_)}; }

  // OK while the bytes read from the mapping are the file's as it was
  // opened. kDataLoss naming the file when a read hit a page the file no
  // longer has (truncated while in use: the read returned zeros), when its
  // size or modification time changed (fstat of the open file), or when
  // its path now names another file or none (replaced or removed).
  Status check_unchanged() const;

 private:
  SafetensorsFile() = default;
  void release();

  std::string path_;
  const std::byte* base_ = nullptr;  // the mapping (nullptr when moved from)
  std::uint64_t size_ = 0;
  // The file as opened, for check_unchanged: kept open, its identity and
  // modification time, and the mapping's slot in MappingGuard (-1: none).
  int fd_ = -1;
  std::uint64_t device_ = 0;
  std::uint64_t inode_ = 0;
  std::int64_t mtime_ns_ = 0;
  int guard_ = -1;
  SafetensorsHeader header_;
  std::unordered_map<std::string, std::size_t> by_name_;  // index into header_.tensors
};

// One tensor to write: spec.nbytes() bytes, C order, little-endian. The
// writer does not own the bytes; they must stay valid during the call.
struct SafetensorsWriteTensor {
  TensorSpec spec;
  std::span<const std::byte> data;
};

// The bytes of a safetensors file holding `tensors` and `metadata` (written
// as `__metadata__` when not empty). Layout, deterministic:
//   * data order: by element size, largest first (8, 4, 2, 1 bytes), the
//     caller's order within one size; with the header padded as below, every
//     tensor then starts at a multiple of its element size (what the
//     reference writer achieves by sorting by dtype, then by name);
//   * header keys: __metadata__ first, then the tensors in data order;
//   * the header is padded with spaces so that the data section starts at a
//     multiple of 8 bytes, as the reference writer does.
// Errors (kInvalidArgument, naming the tensor): an invalid spec
// (validate_spec), a name that is "__metadata__" or appears twice, data whose
// size is not spec.nbytes(), a name or metadata string that is not UTF-8.
StatusOr<std::vector<std::byte>> encode_safetensors(std::span<const SafetensorsWriteTensor> tensors,
                                                    const std::map<std::string, std::string>& metadata = {});

// Writes the same bytes as encode_safetensors to `path`, without building
// them in memory: to "<path>.tmp.<pid>" first, flushed (fsync), then renamed
// over `path`, so a reader sees the old file or the complete new one, never
// a partial one. The temporary file is removed on failure.
Status write_safetensors(const std::string& path, std::span<const SafetensorsWriteTensor> tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace refit
