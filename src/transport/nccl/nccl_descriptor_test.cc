// The nccl descriptor parser (no GPU, no NCCL needed: runs in every build;
// the transport itself is exercised by tests/nccl_gpu_test.cc, label gpu).
#include "transport/nccl/nccl_descriptor.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace refit {
namespace {

#define EXPECT_HAS(haystack, needle)                               \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) \
      << "expected \"" << (needle) << "\" in: " << (haystack)

NcclDescriptor Sample() {
  NcclDescriptor d;
  d.version = 22809;
  d.slots = 3;
  d.slot_bytes = 200003;
  for (std::size_t i = 0; i < d.id.size(); ++i) d.id[i] = static_cast<unsigned char>(i * 37 + 5);
  return d;
}

// Catches: a format that drifts from what the parser (in another process,
// maybe another build) expects, a field written in another order, or an id
// written with the wrong nibble order or case.
TEST(NcclDescriptor, FormatIsExactAndRoundTrips) {
  NcclDescriptor d = Sample();
  d.id.fill(0);
  d.id[0] = 0xab;
  d.id[127] = 0x0f;
  EXPECT_EQ(format_nccl_descriptor(d),
            "nccl:version=22809:slots=3:slot_bytes=200003:id=ab" + std::string(252, '0') + "0f");
  const NcclDescriptor s = Sample();
  auto back = parse_nccl_descriptor(format_nccl_descriptor(s));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->version, s.version);
  EXPECT_EQ(back->slots, s.slots);
  EXPECT_EQ(back->slot_bytes, s.slot_bytes);
  EXPECT_EQ(back->id, s.id);
}

// Catches: a lax parser (trailing junk, zero, signed or hex numbers, a short,
// long or uppercase id, fields out of order or missing, another transport's
// descriptor, slots beyond an int, slots * slot_bytes overflowing).
TEST(NcclDescriptor, ParserIsStrict) {
  const std::string good = format_nccl_descriptor(Sample());
  ASSERT_TRUE(parse_nccl_descriptor(good).ok());
  const std::string id = good.substr(good.find(":id=") + 4);
  const std::string upper_id = std::string(id.begin(), id.begin() + 2) == "05" ? "0A" + id.substr(2) : "";
  ASSERT_FALSE(upper_id.empty());
  const std::vector<std::string> bad = {
      "",
      "garbage",
      "nccl:",
      good + "0",
      good + ":",
      " " + good,
      good + " ",
      good.substr(0, good.size() - 1),
      "NCCL" + good.substr(4),
      "tcp:slots=3:slot_bytes=200003",
      "nccl:slots=3:version=22809:slot_bytes=200003:id=" + id,  // order
      "nccl:version=22809:slots=3:id=" + id,                     // slot_bytes missing
      "nccl:version=22809:slots=3:slot_bytes=200003",            // id missing
      "nccl:version=0:slots=3:slot_bytes=200003:id=" + id,
      "nccl:version=-1:slots=3:slot_bytes=200003:id=" + id,
      "nccl:version=2147483648:slots=3:slot_bytes=200003:id=" + id,
      "nccl:version=22809:slots=0:slot_bytes=200003:id=" + id,
      "nccl:version=22809:slots=+3:slot_bytes=200003:id=" + id,
      "nccl:version=22809:slots=0x3:slot_bytes=200003:id=" + id,
      "nccl:version=22809:slots=3 :slot_bytes=200003:id=" + id,
      "nccl:version=22809:slots=2147483648:slot_bytes=1:id=" + id,
      "nccl:version=22809:slots=3:slot_bytes=0:id=" + id,
      "nccl:version=22809:slots=2:slot_bytes=9223372036854775808:id=" + id,  // product overflows
      "nccl:version=22809:slots=3:slot_bytes=18446744073709551616:id=" + id, // past u64
      "nccl:version=22809:slots=3:slot_bytes=200003:id=" + upper_id,
      "nccl:version=22809:slots=3:slot_bytes=200003:id=" + id.substr(2),
      "nccl:version=22809:slots=3:slot_bytes=200003:id=" + id + "00",
      "nccl:version=22809:slots=3:slot_bytes=200003:id=" + id.substr(0, 254) + "g0",
  };
  for (const std::string& text : bad) {
    auto parsed = parse_nccl_descriptor(text);
    ASSERT_FALSE(parsed.ok()) << "accepted: " << text;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_HAS(parsed.status().message(), "bad nccl descriptor \"" + text + "\"");
  }
}

// Catches: errors that do not say which field was wrong.
TEST(NcclDescriptor, ErrorsNameTheField) {
  const std::string id = format_nccl_descriptor(Sample()).substr(format_nccl_descriptor(Sample()).find(":id=") + 4);
  struct Case {
    std::string text, field;
  };
  const std::vector<Case> cases = {
      {"nccl:version=x:slots=3:slot_bytes=4:id=" + id, "version"},
      {"nccl:version=1:slots=x:slot_bytes=4:id=" + id, "slots"},
      {"nccl:version=1:slots=3:slot_bytes=x:id=" + id, "slot_bytes"},
      {"nccl:version=1:slots=3:slot_bytes=4:id=" + id.substr(1), "id has 255 characters"},
      {"nccl:version=1:slots=3:slot_bytes=4:idx" + id, "missing id"},
      {"shm:/x", "does not start with nccl:"},
  };
  for (const Case& c : cases) {
    auto parsed = parse_nccl_descriptor(c.text);
    ASSERT_FALSE(parsed.ok()) << c.text;
    EXPECT_HAS(parsed.status().message(), c.field);
  }
}

}  // namespace
}  // namespace refit
