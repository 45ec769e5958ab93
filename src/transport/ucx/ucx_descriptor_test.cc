// The ucx descriptor's text format (no UCX needed: runs in every build).
// Each test says which broken parser it catches ("Catches: ...").
#include "transport/ucx/ucx_descriptor.h"

#include <gtest/gtest.h>

#include <limits>

namespace refit {
namespace {

UcxDescriptor Sample() {
  UcxDescriptor d;
  d.slots = 3;
  d.slot_bytes = 200003;
  d.addr = 140737488355328ull;
  d.worker = {0x00, 0x01, 0xab, 0xff, 0x10};
  d.rkey = {0xde, 0xad, 0xbe, 0xef};
  return d;
}

// Catches: a formatter and parser that disagree (field order, hex case,
// decimal vs hex numbers), or a parser that drops bytes of a blob.
TEST(UcxDescriptor, RoundTrips) {
  const UcxDescriptor d = Sample();
  const std::string text = format_ucx_descriptor(d);
  EXPECT_EQ(text, "ucx:slots=3:slot_bytes=200003:addr=140737488355328:mem=host:worker=0001abff10:rkey=deadbeef");
  auto back = parse_ucx_descriptor(text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->slots, d.slots);
  EXPECT_EQ(back->slot_bytes, d.slot_bytes);
  EXPECT_EQ(back->addr, d.addr);
  EXPECT_EQ(back->worker, d.worker);
  EXPECT_EQ(back->rkey, d.rkey);
  EXPECT_EQ(back->memory, UcxMemory::kHost);
}

// Catches: a mem field that is not carried (a staged device target taken for
// host memory: the trainer would put into a device address), an rkey
// demanded of a staged target or accepted for one, an unknown mem accepted.
TEST(UcxDescriptor, MemoryKinds) {
  UcxDescriptor d = Sample();
  d.memory = UcxMemory::kCuda;
  auto cuda = parse_ucx_descriptor(format_ucx_descriptor(d));
  ASSERT_TRUE(cuda.ok()) << cuda.status().ToString();
  EXPECT_EQ(cuda->memory, UcxMemory::kCuda);
  d.memory = UcxMemory::kStaged;
  d.rkey.clear();
  const std::string staged_text = format_ucx_descriptor(d);
  EXPECT_EQ(staged_text, "ucx:slots=3:slot_bytes=200003:addr=140737488355328:mem=staged:worker=0001abff10:rkey=");
  auto staged = parse_ucx_descriptor(staged_text);
  ASSERT_TRUE(staged.ok()) << staged.status().ToString();
  EXPECT_EQ(staged->memory, UcxMemory::kStaged);
  EXPECT_TRUE(staged->rkey.empty());
  for (const std::string& text : {std::string("ucx:slots=1:slot_bytes=1:addr=0:mem=staged:worker=00:rkey=00"),
                                  std::string("ucx:slots=1:slot_bytes=1:addr=0:mem=cuda:worker=00:rkey="),
                                  std::string("ucx:slots=1:slot_bytes=1:addr=0:mem=gpu:worker=00:rkey=00"),
                                  std::string("ucx:slots=1:slot_bytes=1:addr=0:worker=00:rkey=00")}) {
    EXPECT_FALSE(parse_ucx_descriptor(text).ok()) << "accepted " << text;
  }
}

// Catches: a lax parser (signs, hex numbers, upper-case or odd-length blobs,
// missing or reordered fields, trailing junk), an addr + size overflow
// accepted (a remote write could wrap), and errors that do not quote the
// descriptor.
TEST(UcxDescriptor, StrictParsing) {
  const std::string good = format_ucx_descriptor(Sample());
  const std::string max = std::to_string(std::numeric_limits<std::uint64_t>::max());
  const std::vector<std::string> bad = {
      "",
      "ucx:",
      "tcp:slots=3:slot_bytes=4",
      good + "0",   // odd number of rkey digits
      good + "00:",
      good + " ",
      " " + good,
      "ucx:slots=0:slot_bytes=200003:addr=1:mem=host:worker=00:rkey=00",
      "ucx:slots=-3:slot_bytes=200003:addr=1:mem=host:worker=00:rkey=00",
      "ucx:slots=+3:slot_bytes=200003:addr=1:mem=host:worker=00:rkey=00",
      "ucx:slots=3:slot_bytes=0:addr=1:mem=host:worker=00:rkey=00",
      "ucx:slots=3:slot_bytes=0x10:addr=1:mem=host:worker=00:rkey=00",
      "ucx:slots=3:slot_bytes=16:addr=0x10:mem=host:worker=00:rkey=00",
      "ucx:slots=3:slot_bytes=16:addr=1:mem=host:worker=:rkey=00",
      "ucx:slots=3:slot_bytes=16:addr=1:mem=host:worker=00:rkey=",
      "ucx:slots=3:slot_bytes=16:addr=1:mem=host:worker=0G:rkey=00",
      "ucx:slots=3:slot_bytes=16:addr=1:mem=host:worker=AB:rkey=00",
      "ucx:slots=3:slot_bytes=16:addr=1:mem=host:worker=000:rkey=00",
      "ucx:slots=3:slot_bytes=16:addr=1:rkey=00:mem=host:worker=00",
      "ucx:slot_bytes=16:slots=3:addr=1:mem=host:worker=00:rkey=00",
      "ucx:slots=3:slot_bytes=16:mem=host:worker=00:rkey=00",
      "ucx:slots=3:slot_bytes=16:addr=1:mem=host:worker=00",
      "ucx:slots=3000000000:slot_bytes=16:addr=1:mem=host:worker=00:rkey=00",       // slots beyond an int
      "ucx:slots=2:slot_bytes=16:addr=" + max + ":mem=host:worker=00:rkey=00",       // addr + size wraps
      "ucx:slots=2:slot_bytes=" + max + ":addr=0:mem=host:worker=00:rkey=00",        // slots * slot_bytes wraps
      "ucx:slots=3:slot_bytes=16:addr=99999999999999999999999:mem=host:worker=00:rkey=00",
  };
  for (const std::string& text : bad) {
    auto d = parse_ucx_descriptor(text);
    ASSERT_FALSE(d.ok()) << "accepted \"" << text << "\"";
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(d.status().message().find("\"" + text + "\""), std::string::npos) << d.status().message();
  }
  // The largest range that still fits is fine.
  auto edge = parse_ucx_descriptor("ucx:slots=1:slot_bytes=16:addr=" +
                                   std::to_string(std::numeric_limits<std::uint64_t>::max() - 16) +
                                   ":mem=host:worker=00:rkey=00");
  EXPECT_TRUE(edge.ok()) << edge.status().ToString();
}

// Catches: a blob size bound that is off by one or missing (a descriptor of
// megabytes accepted).
TEST(UcxDescriptor, BlobSizeIsBounded) {
  const std::string at_bound(2 * kMaxUcxBlobBytes, 'a'), over(2 * kMaxUcxBlobBytes + 2, 'a');
  EXPECT_TRUE(parse_ucx_descriptor("ucx:slots=1:slot_bytes=1:addr=0:mem=host:worker=" + at_bound + ":rkey=00").ok());
  auto d = parse_ucx_descriptor("ucx:slots=1:slot_bytes=1:addr=0:mem=host:worker=" + over + ":rkey=00");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("longer than"), std::string::npos) << d.status().message();
}

}  // namespace
}  // namespace refit
