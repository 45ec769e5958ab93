// Tests of TicketQueue's ordering logic with a fake "is it done" predicate
// (no CUDA: the entries are plain records of which writes finished).
// Each test says which broken implementation it catches ("Catches: ...").
#include "cuda/ticket_queue.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "testing/status_matchers.h"

namespace refit {
namespace {

// An entry: the write's number; `finished` says which writes completed.
struct Fake {
  std::set<int> finished;
  std::vector<int> retired;

  auto is_done() {
    return [this](int& write) -> StatusOr<bool> { return finished.contains(write); };
  }
  auto retire() {
    return [this](int&& write) { retired.push_back(write); };
  }
};

// Catches: retiring only the polled ticket (earlier entries would stay
// pending forever and their events never come back), or retiring out of
// order.
TEST(TicketQueue, ADoneTicketRetiresItAndEveryEarlierOneOldestFirst) {
  TicketQueue<int> q;
  Fake fake;
  for (int w = 0; w < 4; ++w) EXPECT_EQ(q.push(int{w}), static_cast<std::uint64_t>(w));
  fake.finished = {2};  // the stream is in order: 2 done means 0 and 1 are
  ASSERT_OK_AND_ASSIGN(bool done, q.poll(2, "target", fake.is_done(), fake.retire()));
  EXPECT_TRUE(done);
  EXPECT_EQ(fake.retired, (std::vector<int>{0, 1, 2}));
  EXPECT_FALSE(q.pending(0));
  EXPECT_TRUE(q.pending(3));
  // Older tickets are done without asking their (retired) entries.
  fake.finished.clear();
  ASSERT_OK_AND_ASSIGN(done, q.poll(1, "target", fake.is_done(), fake.retire()));
  EXPECT_TRUE(done);
}

// Catches: asking the oldest entry instead of the polled one (a later
// ticket reported done while its write still runs), or retiring on "not
// done".
TEST(TicketQueue, APendingTicketIsNotDoneAndRetiresNothing) {
  TicketQueue<int> q;
  Fake fake;
  q.push(10);
  q.push(11);
  fake.finished = {10};
  ASSERT_OK_AND_ASSIGN(bool done, q.poll(1, "target", fake.is_done(), fake.retire()));
  EXPECT_FALSE(done);
  EXPECT_TRUE(fake.retired.empty());
  ASSERT_NE(q.find(1), nullptr);
  EXPECT_EQ(*q.find(1), 11);
  EXPECT_EQ(*q.front(), 10);
}

// Catches: a ticket never handed out taken for an old (done) one.
TEST(TicketQueue, AnUnknownTicketIsAnErrorNamingTheTarget) {
  TicketQueue<int> q;
  Fake fake;
  q.push(0);
  StatusOr<bool> done = q.poll(5, "slot pool of engine rank 1", fake.is_done(), fake.retire());
  ASSERT_FALSE(done.ok());
  EXPECT_EQ(done.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(done.status().message().find("ticket 5 on slot pool of engine rank 1"), std::string::npos)
      << done.status().ToString();
}

// Catches: an error of the predicate swallowed, or entries retired anyway.
TEST(TicketQueue, AnErrorOfThePredicateIsReturnedAndRetiresNothing) {
  TicketQueue<int> q;
  std::vector<int> retired;
  q.push(0);
  StatusOr<bool> done = q.poll(
      0, "target", [](int&) -> StatusOr<bool> { return Unavailable("the peer left"); },
      [&](int&& w) { retired.push_back(w); });
  ASSERT_FALSE(done.ok());
  EXPECT_EQ(done.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(retired.empty());
  EXPECT_TRUE(q.pending(0));
}

// Catches: retire_all that leaves tickets pending or restarts numbering
// (a ticket handed out before a relink would be confused with a new one).
TEST(TicketQueue, RetireAllEndsEveryTicketAndNumberingGoesOn) {
  TicketQueue<int> q;
  Fake fake;
  q.push(0);
  q.push(1);
  q.retire_all(fake.retire());
  EXPECT_EQ(fake.retired, (std::vector<int>{0, 1}));
  EXPECT_FALSE(q.pending(1));
  EXPECT_EQ(q.front(), nullptr);
  EXPECT_EQ(q.push(2), 2u);
  ASSERT_OK_AND_ASSIGN(bool done, q.poll(1, "target", fake.is_done(), fake.retire()));
  EXPECT_TRUE(done);
}

}  // namespace
}  // namespace refit
