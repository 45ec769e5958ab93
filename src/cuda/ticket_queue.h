// TicketQueue: the tickets of writes submitted in order on one CUDA stream
// (cuda_ipc's copies, nccl's sends), each waiting on its completion event.
//
// Tickets are 0, 1, 2, ... in submission order. Because the stream runs its
// work in order, a ticket whose event completed finishes every earlier one
// too: poll(t) asks only t's entry, and on completion retires t and every
// earlier entry, oldest first (their events go back to an EventPool). A
// ticket older than the oldest pending entry is done.
//
// The queue knows nothing of CUDA: how an entry is asked "are you done?" is
// the caller's (an event query, a communicator's look), which keeps the
// ordering logic testable on the CPU (ticket_queue_test.cc).
//
// Not thread-safe: one thread at a time, like the RemoteTarget that owns it.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <utility>

#include "refit/status.h"

namespace refit {

template <typename Entry>
class TicketQueue {
 public:
  using Ticket = std::uint64_t;

  // Queues `entry` and hands out its ticket.
  Ticket push(Entry entry) {
    pending_.push_back(std::move(entry));
    return next_++;
  }

  // The pending entry of `ticket`, or nullptr when it is done or was never
  // handed out.
  Entry* find(Ticket ticket) {
    if (ticket >= next_ || ticket < oldest()) return nullptr;
    return &pending_[static_cast<std::size_t>(ticket - oldest())];
  }
  // The oldest pending entry, or nullptr.
  Entry* front() { return pending_.empty() ? nullptr : &pending_.front(); }
  bool pending(Ticket ticket) const { return ticket < next_ && ticket >= oldest(); }

  // Is `ticket` done? kInvalidArgument naming `target` for a ticket never
  // handed out. For a pending one, asks is_done(Entry&) -> StatusOr<bool>;
  // when it says done, retires the ticket and every earlier one through
  // retire(Entry&&), oldest first. An error of is_done is returned as is and
  // retires nothing.
  template <typename IsDone, typename Retire>
  StatusOr<bool> poll(Ticket ticket, std::string_view target, IsDone&& is_done, Retire&& retire) {
    if (ticket >= next_) {
      return InvalidArgument("poll of unknown ticket " + std::to_string(ticket) + " on " + std::string(target));
    }
    Entry* entry = find(ticket);
    if (entry == nullptr) return true;
    StatusOr<bool> done = is_done(*entry);
    if (!done.ok() || !*done) return done;
    const Ticket through = ticket;
    while (oldest() <= through) {
      retire(std::move(pending_.front()));
      pending_.pop_front();
    }
    return true;
  }

  // Retires every pending entry, oldest first (a relink, a teardown): their
  // tickets count as done from now on.
  template <typename Retire>
  void retire_all(Retire&& retire) {
    while (!pending_.empty()) {
      retire(std::move(pending_.front()));
      pending_.pop_front();
    }
  }

 private:
  // The ticket of pending_.front() (next_ when nothing is pending).
  Ticket oldest() const { return next_ - pending_.size(); }

  std::deque<Entry> pending_;  // contiguous tickets, oldest first
  Ticket next_ = 0;
};

}  // namespace refit
