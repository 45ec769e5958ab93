// delta/word_delta.h's encodings of one bucket on the GPU (issue 22): the
// same bytes as encode_delta and decode_delta, with the bucket, its base and
// the encoded bytes in device memory. Not yet wired into a refit (see
// docs/DESIGN.md "Delta refits").
//
// Encode: one pass finds the changed 8-byte words (a warp ballot builds the
// bitmap) and counts them per block, a scan gives each block its place in
// the payload, one small copy to the host chooses the encoding, and a
// second pass writes the changed words (or one device copy writes the full
// bytes). Decode: the header is read and checked on the host, the bitmap's
// set bits are counted per block and their total checked against the
// header before anything is written, then every word is taken from the
// payload or the base (in place over the base allowed).
//
// Thread safety: one thread uses a codec at a time (its scratch is shared
// by its calls).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/device.h"
#include "delta/word_delta.h"
#include "refit/status.h"

namespace refit {

class DeviceDeltaCodec {
 public:
  // Scratch on `device` for buckets up to `max_bytes`.
  static StatusOr<DeviceDeltaCodec> Create(int device, std::uint64_t max_bytes);

  // encode_delta on the device: `now`, `base` (null: no base, full) and
  // `out` (max_encoded_bytes(n)) on this codec's device. Runs on `stream`
  // and returns once the encoding is chosen (one small device-to-host copy);
  // the bytes are written when the stream gets there.
  StatusOr<EncodedDelta> encode(const std::byte* now, const std::byte* base, std::uint64_t n,
                                std::uint64_t base_version, std::byte* out, void* stream);

  // decode_delta on the device: `encoded` (encoded_bytes of it), `base` and
  // `out` (n bytes; may be `base`). Checks as decode_delta does, with the
  // same errors; nothing is written to `out` unless every check passed.
  // Returns once the header and counts were read; the bytes land when the
  // stream gets there.
  Status decode(const std::byte* encoded, std::uint64_t encoded_bytes, const std::byte* base,
                std::uint64_t base_version, std::byte* out, std::uint64_t n, void* stream);

  int device() const { return device_; }

 private:
  DeviceDeltaCodec() = default;
  int device_ = -1;
  std::uint64_t max_bytes_ = 0;
  DeviceBuffer counts_, offsets_, scan_temp_;  // per block of words; the scan's work space
  std::uint64_t scan_temp_bytes_ = 0;
};

}  // namespace refit
