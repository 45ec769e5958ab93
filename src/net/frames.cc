// Typed data-plane frames: the field assignment of frames.h, in one place.
#include "net/frames.h"

namespace refit {
namespace {

constexpr std::uint16_t kLandedEncoded = 1;  // kLanded flags bit 0

FrameHeader header(FrameType type, std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t d) {
  FrameHeader h;
  h.type = type;
  h.a = a;
  h.b = b;
  h.c = c;
  h.d = d;
  return h;
}

// The checks every decode shares: the type, and no payload unless allowed.
Status expect(const FrameHeader& h, FrameType want, bool payload_allowed, const std::string& peer) {
  if (h.type != want) {
    return DataLoss("protocol error from " + peer + ": expected " + frame_type_name(want) + ", got " +
                    frame_type_name(h.type));
  }
  if (!payload_allowed && h.payload_bytes != 0) {
    return DataLoss("protocol error from " + peer + ": " + frame_type_name(want) + " with a " +
                    std::to_string(h.payload_bytes) + "-byte payload; it has none");
  }
  return Status::Ok();
}

}  // namespace

FrameHeader encode(const HelloFrame& f) {
  return header(FrameType::kHello, f.trainer_rank, f.engine_rank, f.plan_digest, 0);
}
FrameHeader encode(const CreditFrame& f) { return header(FrameType::kCredit, f.version, f.bucket, f.slot, f.base); }
FrameHeader encode(const LandedFrame& f) {
  FrameHeader h = header(FrameType::kLanded, f.version, f.bucket, f.slot, f.bytes);
  h.flags = f.encoded ? kLandedEncoded : 0;
  return h;
}
FrameHeader encode(const DataFrame& f) {
  FrameHeader h = header(FrameType::kData, f.version, f.slot, f.offset, f.length);
  h.flags = f.flags;
  h.payload_bytes = f.payload_bytes;
  return h;
}

StatusOr<HelloFrame> decode_hello(const FrameHeader& h, const std::string& peer) {
  RETURN_IF_ERROR(expect(h, FrameType::kHello, false, peer));
  return HelloFrame{h.a, h.b, h.c};
}

StatusOr<CreditFrame> decode_credit(const FrameHeader& h, const std::string& peer) {
  RETURN_IF_ERROR(expect(h, FrameType::kCredit, false, peer));
  return CreditFrame{h.a, h.b, h.c, h.d};
}

StatusOr<LandedFrame> decode_landed(const FrameHeader& h, const std::string& peer) {
  RETURN_IF_ERROR(expect(h, FrameType::kLanded, false, peer));
  if ((h.flags & ~kLandedEncoded) != 0) {
    return DataLoss("protocol error from " + peer + ": kLanded with flags " + std::to_string(h.flags) +
                    " (only bit 0, delta-encoded, is defined)");
  }
  return LandedFrame{h.a, h.b, h.c, h.d, (h.flags & kLandedEncoded) != 0};
}

StatusOr<DataFrame> decode_data(const FrameHeader& h, const std::string& peer) {
  RETURN_IF_ERROR(expect(h, FrameType::kData, true, peer));
  return DataFrame{h.a, h.b, h.c, h.d, h.flags, h.payload_bytes};
}

std::string frame_type_name(FrameType type) {
  switch (type) {
    case FrameType::kHello: return "kHello";
    case FrameType::kCredit: return "kCredit";
    case FrameType::kData: return "kData";
    case FrameType::kLanded: return "kLanded";
    case FrameType::kControl: return "kControl";
    case FrameType::kBye: return "kBye";
  }
  return "frame type " + std::to_string(static_cast<int>(type));
}

}  // namespace refit
