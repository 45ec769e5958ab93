// Fuzz target: transport descriptors, the text an engine rank publishes and
// trainer ranks receive through the coordinator (src/transport/pool_layout.*,
// src/transport/cuda_ipc/cuda_ipc_descriptor.*, src/transport/ucx/
// ucx_descriptor.*, src/transport/nccl/nccl_descriptor.*, and the shm and tcp
// descriptors parsed by their transports' open_target). The ucx and nccl
// parsers are pure text, compiled in every build (this one has no CUDA or
// NCCL), so their cases always run.
//
// Input: byte 0 & 7 picks the case (0: cuda_ipc, 1: tcp, 2: shm, 3: the
// pool_layout helpers, 4: ucx, 5: nccl: the rest is the descriptor text;
// 6: ucx, 7: nccl: the rest is the fields of a descriptor struct, formatted
// and parsed back against an independent statement of what is valid).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "transport/transport.h"
#include "transport/cuda_ipc/cuda_ipc_descriptor.h"
#include "transport/nccl/nccl_descriptor.h"
#include "transport/pool_layout.h"
#include "transport/ucx/ucx_descriptor.h"

namespace {

// Reads fixed-size fields off the fuzz input; zeros once it runs out.
class FieldReader {
 public:
  FieldReader(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  template <typename T>
  T take() {
    unsigned char raw[sizeof(T)] = {};
    for (unsigned char& b : raw) b = pos_ < size_ ? data_[pos_++] : 0;
    T v;
    std::memcpy(&v, raw, sizeof v);
    return v;
  }
  // `n` bytes: the input from here on, repeated (zeros when none is left).
  std::vector<unsigned char> bytes(std::size_t n) {
    std::vector<unsigned char> out(n, 0);
    if (pos_ < size_) {
      for (std::size_t i = 0; i < n; ++i) out[i] = data_[pos_ + i % (size_ - pos_)];
    }
    return out;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

// A blob length: usually small, sometimes exactly at or just past the bound.
std::size_t blob_length(std::uint8_t pick) {
  if (pick == 255) return refit::kMaxUcxBlobBytes;
  if (pick == 254) return refit::kMaxUcxBlobBytes + 1;
  return pick % 48;  // 0 included: empty is invalid (except a staged rkey)
}

// slots * slot_bytes, if both are positive, slots fits an int and the
// product fits 64 bits (the headers' contract, stated without pool_layout).
bool pool_fits(std::int64_t slots, std::uint64_t slot_bytes, std::uint64_t* product) {
  return slots > 0 && slots <= std::numeric_limits<int>::max() && slot_bytes > 0 &&
         !__builtin_mul_overflow(static_cast<std::uint64_t>(slots), slot_bytes, product);
}

bool same(const refit::UcxDescriptor& a, const refit::UcxDescriptor& b) {
  return a.slots == b.slots && a.slot_bytes == b.slot_bytes && a.addr == b.addr && a.memory == b.memory &&
         a.worker == b.worker && a.rkey == b.rkey;
}

bool same(const refit::NcclDescriptor& a, const refit::NcclDescriptor& b) {
  return a.version == b.version && a.slots == b.slots && a.slot_bytes == b.slot_bytes && a.id == b.id;
}

// What parses is valid: it formats canonically (never longer than the text,
// which may only add leading zeros), parses back to itself, and formats to
// the same text again. A rejection is kInvalidArgument (the headers' contract).
// Catches: a formatter whose output the parser rejects or reads differently
// (field order, nibble order or case of the hex, a truncated number), an
// error of another code. Not caught here: a parser that accepts too much
// (cases 6 and 7 catch that for what a struct can express).
template <typename Descriptor>
void check_text(const std::string& text, refit::StatusOr<Descriptor> (*parse)(const std::string&),
                std::string (*format)(const Descriptor&)) {
  auto d = parse(text);
  if (!d.ok()) {
    if (d.status().code() != refit::StatusCode::kInvalidArgument) __builtin_trap();
    return;
  }
  const std::string again = format(*d);
  if (again.size() > text.size()) __builtin_trap();
  auto d2 = parse(again);
  if (!d2.ok() || !same(*d, *d2) || format(*d2) != again) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0 || size > 8192) return 0;
  const std::string text(refit::fuzz::as_text(data + 1, size - 1));
  switch (data[0] & 7) {
    case 0: {
      auto d = refit::parse_cuda_ipc_descriptor(text);
      if (d.ok()) {
        // What parses is valid: it formats, and parses back to itself.
        const std::string again = refit::format_cuda_ipc_descriptor(*d);
        auto d2 = refit::parse_cuda_ipc_descriptor(again);
        if (!d2.ok() || d2->pci_bus_id != d->pci_bus_id || d2->slots != d->slots ||
            d2->slot_bytes != d->slot_bytes || d2->offset != d->offset || d2->handle != d->handle) {
          __builtin_trap();
        }
      }
      break;
    }
    case 1: {
      // Without a link, a valid descriptor stops at "needs the data-plane link".
      static auto tcp = refit::make_transport("tcp");
      if (tcp.ok()) (void)(*tcp)->open_target(text, nullptr);
      break;
    }
    case 2: {
      // A well-formed one names a segment that does not exist (ENOENT), or,
      // rarely, one of another process: mapped and unmapped, never written.
      static auto shm = refit::make_transport("shm");
      if (shm.ok()) (void)(*shm)->open_target(text, nullptr);
      break;
    }
    case 3: {
      std::uint64_t v = 0;
      std::string_view s = text;
      const bool parsed = refit::parse_u64(s, &v);
      if (parsed && std::to_string(v).size() > s.size()) __builtin_trap();
      if (refit::consume_prefix(&s, "slots=") && s.size() + 6 != text.size()) __builtin_trap();
      std::uint64_t a = 0, b = 0;
      const std::size_t colon = text.find(':');
      if (colon != std::string::npos && refit::parse_u64(std::string_view(text).substr(0, colon), &a) &&
          refit::parse_u64(std::string_view(text).substr(colon + 1), &b)) {
        auto bytes = refit::checked_pool_size(a, b, UINT64_MAX);
        if (bytes && (*bytes / b != a)) __builtin_trap();
      }
      break;
    }
    case 4:
      check_text(text, &refit::parse_ucx_descriptor, &refit::format_ucx_descriptor);
      break;
    case 5:
      check_text(text, &refit::parse_nccl_descriptor, &refit::format_nccl_descriptor);
      break;
    case 6: {
      // Any struct: parse(format(d)) accepts exactly the valid ones, and
      // gives d back. Catches (tried once): a formatter that writes
      // slot_bytes truncated to 32 bits (trapped within 1 s).
      FieldReader in(data + 1, size - 1);
      refit::UcxDescriptor d;
      d.slots = in.take<std::int32_t>();
      d.slot_bytes = in.take<std::uint64_t>();
      d.addr = in.take<std::uint64_t>();
      d.memory = static_cast<refit::UcxMemory>(in.take<std::uint8_t>() % 3);
      const std::size_t worker_size = blob_length(in.take<std::uint8_t>());
      const std::size_t rkey_size = blob_length(in.take<std::uint8_t>());
      d.worker = in.bytes(worker_size);
      d.rkey = in.bytes(rkey_size);
      auto blob_ok = [](std::size_t n) { return n > 0 && n <= refit::kMaxUcxBlobBytes; };
      std::uint64_t bytes = 0;
      const bool valid = pool_fits(d.slots, d.slot_bytes, &bytes) && bytes <= UINT64_MAX - d.addr &&
                         blob_ok(d.worker.size()) &&
                         (d.memory == refit::UcxMemory::kStaged ? d.rkey.empty() : blob_ok(d.rkey.size()));
      auto back = refit::parse_ucx_descriptor(refit::format_ucx_descriptor(d));
      if (back.ok() != valid || (valid && !same(*back, d))) __builtin_trap();
      break;
    }
    case 7: {
      // As case 6. Catches (tried once): a parser that accepts version 0
      // (trapped within 15 s).
      FieldReader in(data + 1, size - 1);
      refit::NcclDescriptor d;
      d.version = in.take<std::int32_t>();
      d.slots = in.take<std::int32_t>();
      d.slot_bytes = in.take<std::uint64_t>();
      const std::vector<unsigned char> id = in.bytes(d.id.size());
      std::copy(id.begin(), id.end(), d.id.begin());
      std::uint64_t bytes = 0;
      const bool valid = d.version > 0 && pool_fits(d.slots, d.slot_bytes, &bytes);
      auto back = refit::parse_nccl_descriptor(refit::format_nccl_descriptor(d));
      if (back.ok() != valid || (valid && !same(*back, d))) __builtin_trap();
      break;
    }
  }
  return 0;
}
