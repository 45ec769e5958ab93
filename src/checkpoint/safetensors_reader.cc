// safetensors reader: header validation (parse_safetensors) and the mapped
// file (SafetensorsFile). The rules are listed in refit/safetensors.h.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "checkpoint/mapping_guard.h"
#include "checkpoint/json_member_stream.h"
#include "core/regular_file.h"
#include "refit/safetensors.h"

static_assert(std::endian::native == std::endian::little,
              "refit reads safetensors (little-endian) bytes as they are: little-endian hosts only");

namespace refit {
namespace {

using Json = nlohmann::json;

struct DTypeName {
  std::string_view name;
  DType dtype;
};

// Every safetensors dtype refit has, in DType order.
constexpr std::array<DTypeName, kDTypeCount> kSafetensorsDTypes = {{
    {"BOOL", DType::kBool},
    {"U8", DType::kUInt8},
    {"I8", DType::kInt8},
    {"I16", DType::kInt16},
    {"I32", DType::kInt32},
    {"I64", DType::kInt64},
    {"F16", DType::kFloat16},
    {"BF16", DType::kBFloat16},
    {"F32", DType::kFloat32},
    {"F64", DType::kFloat64},
    {"F8_E4M3", DType::kFloat8E4M3FN},
    {"F8_E5M2", DType::kFloat8E5M2},
}};

constexpr bool table_in_enum_order() {
  for (std::size_t i = 0; i < kSafetensorsDTypes.size(); ++i) {
    if (static_cast<std::size_t>(kSafetensorsDTypes[i].dtype) != i) return false;
  }
  return true;
}
static_assert(table_in_enum_order(), "kSafetensorsDTypes must be indexed by DType's value");

// dtypes of the format (safetensors 0.5) that refit has no DType for.
constexpr std::array<std::string_view, 8> kUnsupportedDTypes = {"U16", "U32", "U64", "F8_E8M0",
                                                                "F4",  "F6_E2M3", "F6_E3M2", "C64"};

std::string supported_list() {
  std::string out;
  for (const DTypeName& d : kSafetensorsDTypes) {
    if (!out.empty()) out += ", ";
    out += d.name;
  }
  return out;
}

std::string json_type(const Json& j) {
  if (j.is_number_float()) return "a non-integer number (" + j.dump() + ")";
  if (j.is_number_integer() && !j.is_number_unsigned()) return "a negative integer (" + j.dump() + ")";
  if (j.is_number_unsigned()) return "an integer (" + j.dump() + ")";
  if (j.is_string()) return "a string";
  if (j.is_boolean()) return "a boolean";
  if (j.is_null()) return "null";
  if (j.is_array()) return "an array";
  return "an object";
}

std::string range_string(std::uint64_t begin, std::uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// "it is empty" or "its first byte is '[' (0x5b)".
std::string first_byte(std::string_view text) {
  if (text.empty()) return "it is empty";
  const auto c = static_cast<unsigned char>(text.front());
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02x", c);
  std::string out = "its first byte is ";
  if (c >= 0x20 && c < 0x7f) out += "'" + std::string(1, static_cast<char>(c)) + "' ";
  return out + "(" + hex + ")";
}

// Builds errors that name the file (and the tensor when there is one).
class Errors {
 public:
  explicit Errors(std::string_view file) : prefix_("safetensors file '" + std::string(file) + "': ") {}
  Status invalid(const std::string& what) const { return InvalidArgument(prefix_ + what); }
  Status data_loss(const std::string& what) const { return DataLoss(prefix_ + what); }
  Status tensor(const std::string& name, const std::string& what,
                StatusCode code = StatusCode::kInvalidArgument) const {
    return Status(code, prefix_ + "tensor '" + name + "': " + what);
  }

 private:
  std::string prefix_;
};

// A JSON value that must be a non-negative integer below 2^63 (shape
// entries) or 2^64 (offsets). nlohmann stores non-negative integers that fit
// u64 as number_unsigned, negative ones as number_integer, everything else
// (fractions, exponents, integers beyond u64) as number_float.
bool as_u64(const Json& j, std::uint64_t* out) {
  if (!j.is_number_unsigned()) return false;
  *out = j.get<std::uint64_t>();
  return true;
}

Status parse_metadata(const Json& value, const Errors& err, std::map<std::string, std::string>* out) {
  if (!value.is_object()) {
    return err.invalid("__metadata__ must be an object of string -> string, but it is " + json_type(value));
  }
  for (const auto& [k, v] : value.items()) {
    if (!v.is_string()) {
      return err.invalid("__metadata__ key '" + k + "' must map to a string, but it maps to " + json_type(v));
    }
    out->emplace(k, v.get<std::string>());
  }
  return Status::Ok();
}

// Parses one tensor entry; checks everything that involves this tensor alone.
Status parse_tensor(const std::string& name, const Json& entry, std::uint64_t data_bytes, const Errors& err,
                    SafetensorsTensor* out) {
  if (name.empty()) return err.invalid("a tensor has an empty name");
  if (!entry.is_object()) return err.tensor(name, "entry must be an object, but it is " + json_type(entry));
  for (const auto& [k, v] : entry.items()) {
    if (k != "dtype" && k != "shape" && k != "data_offsets") {
      return err.tensor(name, "unknown field '" + k + "' (a tensor has exactly dtype, shape and data_offsets)");
    }
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(field)) return err.tensor(name, std::string("missing field '") + field + "'");
  }
  out->spec.name = name;

  const Json& dtype = entry["dtype"];
  if (!dtype.is_string()) return err.tensor(name, "dtype must be a string, but it is " + json_type(dtype));
  StatusOr<DType> parsed = dtype_from_safetensors(dtype.get<std::string>());
  if (!parsed.ok()) return err.tensor(name, parsed.status().message());
  out->spec.dtype = *parsed;

  const Json& shape = entry["shape"];
  if (!shape.is_array()) return err.tensor(name, "shape must be an array, but it is " + json_type(shape));
  for (std::size_t i = 0; i < shape.size(); ++i) {
    std::uint64_t d = 0;
    if (!as_u64(shape[i], &d) || d > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      return err.tensor(name, "shape[" + std::to_string(i) + "] must be a non-negative integer below 2^63, but it is " +
                                  json_type(shape[i]));
    }
    out->spec.shape.push_back(static_cast<std::int64_t>(d));
  }

  const Json& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !as_u64(offsets[0], &out->begin) ||
      !as_u64(offsets[1], &out->end)) {
    return err.tensor(name, "data_offsets must be [BEGIN, END] of two non-negative integers, but it is " +
                                offsets.dump());
  }
  if (out->end < out->begin) {
    return err.tensor(name, "data_offsets [" + std::to_string(out->begin) + ", " + std::to_string(out->end) +
                                "] end before they begin");
  }
  if (out->end > data_bytes) {
    return err.tensor(name,
                      "data_offsets " + range_string(out->begin, out->end) +
                          " run past the end of the data section (" + std::to_string(data_bytes) +
                          " bytes): truncated file?",
                      StatusCode::kDataLoss);
  }

  // Element count times element size, without overflow. A 0 anywhere gives 0.
  std::uint64_t bytes = dtype_size(out->spec.dtype);
  bool zero = false;
  bool overflow = false;
  for (std::int64_t d : out->spec.shape) {
    if (d == 0) zero = true;
    if (__builtin_mul_overflow(bytes, static_cast<std::uint64_t>(d), &bytes)) overflow = true;
  }
  if (zero) {
    bytes = 0;
  } else if (overflow) {
    return err.tensor(name, std::string(safetensors_dtype_name(out->spec.dtype)) + " shape " +
                                shape_string(out->spec.shape) + " has more bytes than fit in 64 bits");
  }
  if (out->end - out->begin != bytes) {
    return err.tensor(name, std::string(safetensors_dtype_name(out->spec.dtype)) + " shape " +
                                shape_string(out->spec.shape) + " needs " + std::to_string(bytes) +
                                " bytes, but data_offsets " + range_string(out->begin, out->end) + " hold " +
                                std::to_string(out->end - out->begin));
  }
  // Sizes below 2^63: what refit's TensorSpec promises (validate_spec).
  if (Status s = validate_spec(out->spec); !s.ok()) return err.tensor(name, s.message());
  return Status::Ok();
}

// A header is a JSON object: the byte it must begin with.
constexpr char kObjectOpen = '{';

// The 8-byte little-endian header length, checked against the format's
// limit and the file: a header with its sizes set and no tensors yet.
StatusOr<SafetensorsHeader> header_frame(std::span<const std::byte> file, const Errors& err) {
  if (file.size() < 8) {
    return err.data_loss("the file is " + std::to_string(file.size()) +
                         " bytes, too short for the 8-byte header length");
  }
  std::uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);  // little-endian host (static_assert above)
  if (n > kSafetensorsMaxHeaderBytes) {
    return err.invalid("header length " + std::to_string(n) + " exceeds the format's limit of " +
                       std::to_string(kSafetensorsMaxHeaderBytes) + " bytes");
  }
  if (n > file.size() - 8) {
    return err.data_loss("header length " + std::to_string(n) + " runs past the end of the file (" +
                         std::to_string(file.size()) + " bytes, " + std::to_string(file.size() - 8) +
                         " after the length): truncated file?");
  }
  SafetensorsHeader header;
  header.header_bytes = n;
  header.data_offset = 8 + n;
  header.data_bytes = file.size() - header.data_offset;
  return header;
}

// Parses the header's JSON text: its metadata, and each tensor's entry
// (parse_tensor) appended to header->tensors in the order the text lists them.
Status parse_members(std::string_view text, std::string_view file_name, const Errors& err,
                     SafetensorsHeader* header) {
  if (text.empty() || text.front() != kObjectOpen) {
    return err.invalid(std::string("the header must be a JSON object beginning with '") + kObjectOpen + "', but " +
                       first_byte(text));
  }
  // One member at a time (json_member_stream.h): the parser's memory is
  // what it keeps (the tensors), proportional to the header, and a header
  // listing more than kSafetensorsMaxTensors tensors is refused as soon as
  // the one past the limit appears.
  const std::string too_many = "it lists more than " + std::to_string(kSafetensorsMaxTensors) +
                               " tensors (refit's limit, kSafetensorsMaxTensors)";
  RETURN_IF_ERROR(stream_json_members(
      text, kSafetensorsMaxTensors + 1, too_many, "safetensors file '" + std::string(file_name) + "': header: ",
      [&](const std::string& key, const Json& value) -> Status {
        if (key == "__metadata__") return parse_metadata(value, err, &header->metadata);
        if (header->tensors.size() == kSafetensorsMaxTensors) return err.invalid("header: " + too_many);
        SafetensorsTensor t;
        RETURN_IF_ERROR(parse_tensor(key, value, header->data_bytes, err, &t));
        header->tensors.push_back(std::move(t));
        return Status::Ok();
      }));
  return Status::Ok();
}

// Sorts header->tensors into storage order and checks that their ranges tile
// the data section exactly: no overlap, no hole, no trailing bytes.
Status check_tiling(const Errors& err, SafetensorsHeader* header) {
  std::vector<SafetensorsTensor>& tensors = header->tensors;
  std::sort(tensors.begin(), tensors.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return a.spec.name < b.spec.name;
  });
  std::uint64_t covered = 0;            // [0, covered) is tiled so far
  const SafetensorsTensor* last = nullptr;  // the tensor that ends at `covered`
  for (const SafetensorsTensor& t : tensors) {
    if (t.begin < covered) {
      return err.invalid("tensors '" + last->spec.name + "' " + range_string(last->begin, last->end) + " and '" +
                         t.spec.name + "' " + range_string(t.begin, t.end) + " overlap");
    }
    if (t.begin > covered) {
      return err.invalid("bytes " + range_string(covered, t.begin) +
                         " of the data section belong to no tensor (a hole before tensor '" + t.spec.name +
                         "'; the format forbids holes)");
    }
    covered = t.end;
    last = &t;
  }
  if (covered != header->data_bytes) {
    return err.invalid("bytes " + range_string(covered, header->data_bytes) +
                       " at the end of the data section belong to no tensor (trailing bytes; the format forbids "
                       "holes)");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<DType> dtype_from_safetensors(std::string_view name) {
  for (const DTypeName& d : kSafetensorsDTypes) {
    if (d.name == name) return d.dtype;
  }
  for (std::string_view u : kUnsupportedDTypes) {
    if (u == name) {
      return InvalidArgument("dtype '" + std::string(name) + "' is not supported by refit (supported: " +
                             supported_list() + ")");
    }
  }
  return InvalidArgument("unknown dtype '" + std::string(name) + "' (supported: " + supported_list() + ")");
}

std::string_view safetensors_dtype_name(DType dtype) {
  const auto i = static_cast<std::size_t>(dtype);
  return i < kSafetensorsDTypes.size() ? kSafetensorsDTypes[i].name : std::string_view("unknown_dtype");
}

StatusOr<SafetensorsHeader> parse_safetensors(std::span<const std::byte> file, std::string_view file_name) {
  const Errors err(file_name);
  ASSIGN_OR_RETURN(SafetensorsHeader header, header_frame(file, err));
  const std::string_view text(reinterpret_cast<const char*>(file.data()) + 8, header.header_bytes);
  RETURN_IF_ERROR(parse_members(text, file_name, err, &header));
  RETURN_IF_ERROR(check_tiling(err, &header));
  return header;
}

namespace {

std::int64_t mtime_ns(const struct stat& st) {
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

}  // namespace

StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(RegularFile opened, open_regular_file(path, "safetensors file '" + path + "'"));
  SafetensorsFile file;
  file.path_ = path;
  file.size_ = static_cast<std::uint64_t>(opened.st.st_size);
  file.device_ = static_cast<std::uint64_t>(opened.st.st_dev);
  file.inode_ = static_cast<std::uint64_t>(opened.st.st_ino);
  file.mtime_ns_ = mtime_ns(opened.st);
  if (file.size_ > 0) {  // mmap of 0 bytes fails; parse_safetensors reports the short file
    // MAP_SHARED, read-only: the page cache's own pages, which the GPU
    // driver can register (cudaHostRegister) 15x faster than a private
    // mapping's (bench/host_register_probe.cu on the H200, 2026-11-29).
    void* p = ::mmap(nullptr, file.size_, PROT_READ, MAP_SHARED, opened.fd.get(), 0);
    if (p == MAP_FAILED) {
      return ErrnoStatus("safetensors file '" + path + "': mmap of " + std::to_string(file.size_) + " bytes", errno);
    }
    file.base_ = static_cast<const std::byte*>(p);
    file.guard_ = MappingGuard::guard(p, file.size_);
  }
  file.fd_ = opened.fd.release();  // kept for check_unchanged
  // The header is parsed from the mapping too: a file truncated meanwhile
  // reads as zeros, and the check below names it.
  StatusOr<SafetensorsHeader> header = parse_safetensors(file.bytes(), path);
  RETURN_IF_ERROR(file.check_unchanged());
  if (!header.ok()) return header.status();
  file.header_ = std::move(header).value();
  file.by_name_.reserve(file.header_.tensors.size());
  for (std::size_t i = 0; i < file.header_.tensors.size(); ++i) {
    file.by_name_.emplace(file.header_.tensors[i].spec.name, i);
  }
  return file;
}

Status SafetensorsFile::check_unchanged() const {
  const std::string at = "safetensors file '" + path_ + "'";
  if (MappingGuard::faulted(guard_)) {
    return DataLoss(at + " shrank while in use: a read of its mapping found pages the file no longer has "
                    "(truncated or rewritten while refit read it); its bytes cannot be trusted");
  }
  if (fd_ < 0) return Status::Ok();
  struct stat now {};
  if (::fstat(fd_, &now) != 0) return ErrnoStatus(at + ": fstat", errno);
  if (static_cast<std::uint64_t>(now.st_size) != size_) {
    return DataLoss(at + " changed while in use: it was " + std::to_string(size_) + " bytes when opened, it is " +
                    std::to_string(now.st_size) + " bytes now (truncated or rewritten?)");
  }
  if (mtime_ns(now) != mtime_ns_) {
    return DataLoss(at + " changed while in use: it was modified after refit opened it (rewritten in place?)");
  }
  struct stat named {};
  if (::stat(path_.c_str(), &named) != 0) {
    return DataLoss(at + " changed while in use: its path names no file now (" + std::strerror(errno) +
                    "; removed or renamed?)");
  }
  if (static_cast<std::uint64_t>(named.st_dev) != device_ || static_cast<std::uint64_t>(named.st_ino) != inode_) {
    return DataLoss(at + " changed while in use: its path names another file now (replaced)");
  }
  return Status::Ok();
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      base_(std::exchange(other.base_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      fd_(std::exchange(other.fd_, -1)),
      device_(other.device_),
      inode_(other.inode_),
      mtime_ns_(other.mtime_ns_),
      guard_(std::exchange(other.guard_, -1)),
      header_(std::move(other.header_)),
      by_name_(std::move(other.by_name_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
    fd_ = std::exchange(other.fd_, -1);
    device_ = other.device_;
    inode_ = other.inode_;
    mtime_ns_ = other.mtime_ns_;
    guard_ = std::exchange(other.guard_, -1);
    header_ = std::move(other.header_);
    by_name_ = std::move(other.by_name_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { release(); }

void SafetensorsFile::release() {
  MappingGuard::release(guard_);
  guard_ = -1;
  if (base_ != nullptr) ::munmap(const_cast<std::byte*>(base_), size_);
  base_ = nullptr;
  size_ = 0;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &header_.tensors[it->second];
}

std::span<const std::byte> SafetensorsFile::data(const SafetensorsTensor& tensor) const {
  return {base_ + header_.data_offset + tensor.begin, static_cast<std::size_t>(tensor.end - tensor.begin)};
}

}  // namespace refit
