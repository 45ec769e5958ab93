// Typed views of the data-plane frames.
//
// On the wire every frame is a FrameHeader (link.h): a type and four 64-bit
// fields a, b, c, d whose meaning depends on the type. This file is the one
// place that says which field holds what; the trainer rank, the receiver and
// the engine rank encode and decode through the structs below and never
// touch a, b, c, d themselves.
//
//   type     a              b            c              d        payload
//   kHello   trainer rank   engine rank  plan digest    -        none
//   kCredit  version        bucket       slot           base     none
//   kLanded  version        bucket       slot           bytes    none (flags bit 0: delta-encoded)
//   kData    version        slot         offset         length   the bytes (tcp); none (nccl: d says how
//                                                                many follow through NCCL); or an
//                                                                in-band announcement (flags != 0)
//
// Decoding checks what needs no protocol state: the type, and that a frame
// without a payload has none. The receiver (receiver.cc) checks the rest
// (version, bucket, slot, bytes) against the plan and the credits it granted.
#pragma once

#include <cstdint>
#include <string>

#include "net/link.h"
#include "refit/status.h"

namespace refit {

// trainer -> engine, once per data link: who is speaking, to whom, with
// which plan.
struct HelloFrame {
  std::uint64_t trainer_rank = 0;
  std::uint64_t engine_rank = 0;
  std::uint64_t plan_digest = 0;
};

// engine -> trainer: "write bucket `bucket` of refit `version` into slot `slot`".
// `base` (delta refits, issue 22): the version the engine rank holds
// committed and whole, which the trainer may encode the bucket against; 0:
// none, send the bucket's bytes as they are.
struct CreditFrame {
  std::uint64_t version = 0;
  std::uint64_t bucket = 0;
  std::uint64_t slot = 0;
  std::uint64_t base = 0;
};

// trainer -> engine: bucket `bucket` (`bytes` bytes) of refit `version` is in
// slot `slot` (0 in direct mode: the engine's weights are one slot).
// `encoded` (delta refits): the slot holds, at [0, bytes), the bucket
// delta-encoded (delta/word_delta.h) against the credit's base, not its
// bytes. On the wire: bit 0 of the header's flags; other bits are refused.
struct LandedFrame {
  std::uint64_t version = 0;
  std::uint64_t bucket = 0;
  std::uint64_t slot = 0;
  std::uint64_t bytes = 0;
  bool encoded = false;
};

// trainer -> engine, two-sided transports: a write into `slot` at `offset`.
struct DataFrame {
  std::uint64_t version = 0;
  std::uint64_t slot = 0;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;         // bytes moved outside the payload (nccl); 0 otherwise
  std::uint16_t flags = 0;          // transport-defined (nccl: 1 = a new communicator's id)
  std::uint64_t payload_bytes = 0;  // bytes that follow the header on the link
};

FrameHeader encode(const HelloFrame& f);
FrameHeader encode(const CreditFrame& f);
FrameHeader encode(const LandedFrame& f);
FrameHeader encode(const DataFrame& f);

// Each fails with kDataLoss naming `peer`, the frame type expected and the
// one received when `h` is of another type, or carries a payload where the
// type has none, or flags the type does not define. (kDataLoss: a peer's frame out of protocol means the bytes
// it announces cannot be trusted; status.h.)
StatusOr<HelloFrame> decode_hello(const FrameHeader& h, const std::string& peer);
StatusOr<CreditFrame> decode_credit(const FrameHeader& h, const std::string& peer);
StatusOr<LandedFrame> decode_landed(const FrameHeader& h, const std::string& peer);
StatusOr<DataFrame> decode_data(const FrameHeader& h, const std::string& peer);

// "kHello", "kCredit", ...; "frame type N" for a number no type has.
std::string frame_type_name(FrameType type);

}  // namespace refit
