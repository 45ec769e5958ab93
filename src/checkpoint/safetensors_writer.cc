// safetensors writer: encode_safetensors and write_safetensors (see
// refit/safetensors.h for the layout).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "refit/safetensors.h"

static_assert(std::endian::native == std::endian::little,
              "refit writes tensor bytes as they are into little-endian safetensors: little-endian hosts only");

namespace refit {
namespace {

using OrderedJson = nlohmann::ordered_json;

// What goes before the data section, and where each tensor's bytes go.
struct Layout {
  std::string prefix;               // 8-byte length + padded header
  std::vector<std::size_t> order;   // indices into the caller's tensors, in data order
  std::uint64_t data_bytes = 0;
};

StatusOr<Layout> make_layout(std::span<const SafetensorsWriteTensor> tensors,
                             const std::map<std::string, std::string>& metadata) {
  std::set<std::string_view> names;
  for (const SafetensorsWriteTensor& t : tensors) {
    RETURN_IF_ERROR(validate_spec(t.spec).WithContext("safetensors writer"));
    if (t.spec.name == "__metadata__") {
      return InvalidArgument("safetensors writer: a tensor may not be named \"__metadata__\" (the format's metadata key)");
    }
    if (!names.insert(t.spec.name).second) {
      return InvalidArgument("safetensors writer: tensor '" + t.spec.name + "' appears twice");
    }
    if (t.data.size() != t.spec.nbytes()) {
      return InvalidArgument("safetensors writer: tensor '" + t.spec.ToString() + "' needs " +
                             std::to_string(t.spec.nbytes()) + " bytes, but its data holds " +
                             std::to_string(t.data.size()));
    }
  }

  Layout layout;
  layout.order.resize(tensors.size());
  std::iota(layout.order.begin(), layout.order.end(), std::size_t{0});
  // Largest elements first: every offset is then a multiple of the element size.
  std::stable_sort(layout.order.begin(), layout.order.end(), [&](std::size_t a, std::size_t b) {
    return dtype_size(tensors[a].spec.dtype) > dtype_size(tensors[b].spec.dtype);
  });

  // Compact JSON, keys in data order, built piece by piece (an ordered_json
  // object would look each key up linearly: quadratic in the tensor count).
  std::string text = "{";
  try {
    if (!metadata.empty()) text += "\"__metadata__\":" + OrderedJson(metadata).dump();
    std::uint64_t offset = 0;
    for (std::size_t i : layout.order) {
      const TensorSpec& spec = tensors[i].spec;
      const std::uint64_t end = offset + spec.nbytes();
      const OrderedJson entry = {{"dtype", std::string(safetensors_dtype_name(spec.dtype))},
                                 {"shape", spec.shape},
                                 {"data_offsets", {offset, end}}};
      if (text.size() > 1) text += ',';
      text += OrderedJson(spec.name).dump() + ":" + entry.dump();
      offset = end;
    }
    layout.data_bytes = offset;
  } catch (const OrderedJson::exception& e) {  // dump() throws on invalid UTF-8
    return InvalidArgument(std::string("safetensors writer: a tensor name or metadata string is not valid UTF-8: ") +
                           e.what());
  }
  text += '}';
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');  // data section starts at a multiple of 8
  if (text.size() > kSafetensorsMaxHeaderBytes) {
    return InvalidArgument("safetensors writer: the header would be " + std::to_string(text.size()) +
                           " bytes, over the format's limit of " + std::to_string(kSafetensorsMaxHeaderBytes));
  }
  const std::uint64_t n = text.size();
  layout.prefix.resize(8);
  std::memcpy(layout.prefix.data(), &n, 8);  // little-endian host
  layout.prefix += text;
  return layout;
}

Status write_all(int fd, const void* data, std::size_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    // At most 1 GiB per call (Linux writes at most ~2 GiB at once anyway).
    const ssize_t n = ::write(fd, p, std::min<std::size_t>(bytes, std::size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("safetensors writer: write to '" + path + "'", errno);
    }
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::vector<std::byte>> encode_safetensors(std::span<const SafetensorsWriteTensor> tensors,
                                                    const std::map<std::string, std::string>& metadata) {
  ASSIGN_OR_RETURN(Layout layout, make_layout(tensors, metadata));
  std::vector<std::byte> out(layout.prefix.size() + layout.data_bytes);
  std::memcpy(out.data(), layout.prefix.data(), layout.prefix.size());
  std::size_t at = layout.prefix.size();
  for (std::size_t i : layout.order) {
    if (!tensors[i].data.empty()) std::memcpy(out.data() + at, tensors[i].data.data(), tensors[i].data.size());
    at += tensors[i].data.size();
  }
  return out;
}

Status write_safetensors(const std::string& path, std::span<const SafetensorsWriteTensor> tensors,
                         const std::map<std::string, std::string>& metadata) {
  ASSIGN_OR_RETURN(Layout layout, make_layout(tensors, metadata));
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("safetensors writer: create '" + tmp + "'", errno);
  Status status = write_all(fd, layout.prefix.data(), layout.prefix.size(), tmp);
  for (std::size_t i : layout.order) {
    if (!status.ok()) break;
    status = write_all(fd, tensors[i].data.data(), tensors[i].data.size(), tmp);
  }
  if (status.ok() && ::fsync(fd) != 0) status = ErrnoStatus("safetensors writer: fsync '" + tmp + "'", errno);
  if (::close(fd) != 0 && status.ok()) status = ErrnoStatus("safetensors writer: close '" + tmp + "'", errno);
  if (status.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    status = ErrnoStatus("safetensors writer: rename '" + tmp + "' to '" + path + "'", errno);
  }
  if (!status.ok()) ::unlink(tmp.c_str());
  return status;
}

}  // namespace refit
