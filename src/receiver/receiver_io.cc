// The receiver's I/O thread (receiver_impl.h): polls every trainer link and
// the wake eventfd, lands kData payloads through the pool and records
// kLanded frames in the ledger; a lost link or an out-of-protocol frame
// fails the refit in progress (or the next start()).
#include "net/poll_wait.h"
#include "receiver/receiver_impl.h"

#include <poll.h>
#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

namespace refit {

void Receiver::Impl::io_loop() {
  std::vector<pollfd> fds;
  std::vector<std::size_t> which;
  for (;;) {
    fds.clear();
    which.clear();
    fds.push_back(pollfd{wake_fd, POLLIN, 0});
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stopping) return;
      for (std::size_t i = 0; i < links.size(); ++i) {
        if (!closed[i].empty()) continue;
        fds.push_back(pollfd{links[i]->fd(), POLLIN, 0});
        which.push_back(i);
      }
    }
    StatusOr<int> ready = poll_wait(fds, Deadline::Never(), "the trainer links");
    if (!ready.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      if (fatal.ok()) fatal = ready.status().WithContext(options.name);
      cv.notify_all();
      return;
    }
    if (fds[0].revents != 0) {
      std::uint64_t n = 0;
      ssize_t r = ::read(wake_fd, &n, sizeof n);
      (void)r;
      std::lock_guard<std::mutex> lock(mu);
      if (stopping) return;
    }
    for (std::size_t k = 1; k < fds.size(); ++k) {
      if (fds[k].revents != 0) handle_frame(which[k - 1]);
    }
  }
}

void Receiver::Impl::link_lost(std::size_t i, const Status& why) {
  std::lock_guard<std::mutex> lock(mu);
  if (stopping) return;
  closed[i] = why.ToString();
  if (!ledger.active()) return;  // reported by the next start()
  const std::uint64_t owed = ledger.owed_by(i);
  if (owed == plan->buckets.size()) return;  // nothing more expected from it
  fail_locked(Aborted(link_name(i) + " closed while " + options.name + " waited for bucket " +
                      std::to_string(owed) + " of " + std::to_string(plan->buckets.size()) + " of refit " +
                      std::to_string(ledger.version()) + ": " + why.message()));
}

// Every frame a trainer sends is checked by the ledger (landing_ledger.h),
// staged or direct: one validator, one error code.
void Receiver::Impl::handle_frame(std::size_t i) {
  Link& link = *links[i];
  StatusOr<FrameHeader> got = link.recv_header(Deadline::Never(), max_payload());
  if (!got.ok()) {
    link_lost(i, got.status());
    return;
  }
  const FrameHeader& h = *got;
  Status bad;
  switch (h.type) {
    case FrameType::kLanded: {
      std::lock_guard<std::mutex> lock(mu);
      StatusOr<LandingLedger::Landing> landing = ledger.land(i, h);
      if (landing.ok()) {
        stats.wire_bytes += landing->announced;
        if (landing->encoded) ++stats.words_buckets;
        if (landing->complete) {
          ++stats.buckets;
          stats.bytes += plan->buckets[landing->bucket].bytes;
          cv.notify_all();
        }
        return;
      }
      bad = landing.status();
      break;
    }
    case FrameType::kData: {
      {
        std::lock_guard<std::mutex> lock(mu);
        bad = ledger.check_data(i, h, pool->slot_bytes());
      }
      if (bad.ok()) {
        // The slot is granted to the trainer: the consumer does not touch it.
        // (Direct mode: a write announcement, nccl, received into the weights.)
        Status s = pool->receive_data(link, h, Deadline::Never());
        if (!s.ok()) link_lost(i, s);
        return;
      }
      break;
    }
    case FrameType::kBye:
      link_lost(i, Unavailable(link.peer() + " said goodbye (kBye)"));
      return;
    default: {
      std::lock_guard<std::mutex> lock(mu);
      bad = ledger.land(i, h).status();  // refuses every other type, naming it
      break;
    }
  }
  out_of_protocol(i, h, std::move(bad));
}

// Fails the refit (or the next start) with `bad`, and keeps the stream in
// sync by discarding the frame's payload.
void Receiver::Impl::out_of_protocol(std::size_t i, const FrameHeader& h, Status bad) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (ledger.active()) {
      fail_locked(std::move(bad));
    } else if (stray.ok()) {
      stray = std::move(bad);
    }
  }
  if (h.payload_bytes > 0) {
    Status s = links[i]->skip_payload(h.payload_bytes, Deadline::Never());
    if (!s.ok()) link_lost(i, s);
  }
}

}  // namespace refit
