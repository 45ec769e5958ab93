// Fuzz target: the safetensors header parser (src/checkpoint/safetensors_reader.cc,
// parse_safetensors): the input is a whole file (8-byte length, header,
// data). Anything may be refused; nothing may crash, read out of bounds or
// overflow (ASan/UBSan), and an accepted file must keep the format's
// promises, checked here independently of the parser: every tensor's range
// lies inside the data section, holds exactly numel * element size bytes, and
// the ranges tile the data section in order with no gap or overlap.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "refit/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  auto header = refit::parse_safetensors(file, "fuzz-input");
  if (!header.ok()) {
    if (header.status().message().empty()) __builtin_trap();  // errors always say what broke
    return 0;
  }
  if (header->data_offset != 8 + header->header_bytes || header->data_offset > size ||
      header->data_bytes != size - header->data_offset || header->header_bytes > refit::kSafetensorsMaxHeaderBytes) {
    __builtin_trap();
  }
  std::uint64_t covered = 0;
  for (const refit::SafetensorsTensor& t : header->tensors) {
    if (t.begin != covered || t.end < t.begin || t.end > header->data_bytes) __builtin_trap();
    if (refit::validate_spec(t.spec).ok() == false) __builtin_trap();
    if (t.end - t.begin != t.spec.nbytes()) __builtin_trap();
    if (t.spec.name.empty() || t.spec.name == "__metadata__") __builtin_trap();
    covered = t.end;
  }
  if (covered != header->data_bytes) __builtin_trap();
  // An accepted file re-encodes (the writer takes whatever the reader gives)
  // and parses back to the same header.
  std::vector<refit::SafetensorsWriteTensor> tensors;
  for (const refit::SafetensorsTensor& t : header->tensors) {
    tensors.push_back({t.spec, file.subspan(header->data_offset + t.begin, t.end - t.begin)});
  }
  auto again = refit::encode_safetensors(tensors, header->metadata);
  if (!again.ok()) __builtin_trap();
  auto reparsed = refit::parse_safetensors(*again, "fuzz-reencoded");
  if (!reparsed.ok() || reparsed->metadata != header->metadata || reparsed->tensors.size() != header->tensors.size()) {
    __builtin_trap();
  }
  return 0;
}
