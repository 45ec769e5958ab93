// Tests of the host-pool helpers shm and tcp share (transport/host_pool.h).
// Each test says which broken implementation it catches ("Catches: ...").
#include "transport/host_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "testing/status_matchers.h"

namespace refit {
namespace {

// Catches: a range check written offset + bytes <= slot_bytes (wraps for an
// offset near 2^64 and lets the write through), a negative slot taken for a
// valid one, and the last slot or an empty write at the end refused.
TEST(SlotShape, ContainsChecksSlotOffsetAndLengthWithoutOverflow) {
  const SlotShape shape{3, 100};
  EXPECT_TRUE(shape.contains(0, 0, 100));
  EXPECT_TRUE(shape.contains(2, 100, 0));
  EXPECT_FALSE(shape.contains(3, 0, 1));
  EXPECT_FALSE(shape.contains(-1, 0, 1));
  EXPECT_FALSE(shape.contains(1, 50, 51));
  EXPECT_FALSE(shape.contains(1, 101, 0));
  EXPECT_FALSE(shape.contains(1, std::numeric_limits<std::uint64_t>::max() - 10, 20));
}

// Catches: an error that does not name the target, the write and the pool.
TEST(SlotShape, RangeErrorNamesTheWriteAndThePool) {
  const Status s = SlotShape{3, 100}.range_error("shm target X", 4, 8, 16);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "write of 16 bytes at offset 8 into slot 4 of shm target X is out of range "
                         "(slots=3, slot_bytes=100)");
}

// Catches: a ticket never handed out reported done.
TEST(ImmediateTickets, HandedOutTicketsAreDoneOthersAreErrors) {
  ImmediateTickets tickets;
  EXPECT_EQ(tickets.next(), 0u);
  EXPECT_EQ(tickets.next(), 1u);
  ASSERT_OK_AND_ASSIGN(bool done, tickets.poll(1, "tcp target Y"));
  EXPECT_TRUE(done);
  StatusOr<bool> unknown = tickets.poll(2, "tcp target Y");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("ticket 2 on tcp target Y"), std::string::npos);
}

}  // namespace
}  // namespace refit
