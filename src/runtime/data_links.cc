// The engine rank's data port: see data_links.h.
#include "runtime/data_links.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <list>
#include <mutex>
#include <thread>
#include <utility>

#include "control/auth.h"
#include "control/protocol.h"
#include "control/refusal_log.h"
#include "net/frames.h"
#include "net/event_fd.h"
#include "net/poll_wait.h"

namespace refit {
namespace {

std::string digest_hex(std::uint64_t digest) {
  char text[17];
  std::snprintf(text, sizeof text, "%016" PRIx64, digest);
  return text;
}

// One data connection: authenticates it with the job's secret in this
// rank's data context (auth.h; "none" when the job has no secret) by
// `handshake` (kDataAuthTimeout after its accept), then reads its hello (an
// authenticated trainer opens its transport target first, so the hello may
// take until `deadline`). Without a secret "authenticated" proves nothing
// (anyone answers "none"), so the hello is due by `handshake` too: an idle
// stranger holds a handshake thread at most that long. `authenticated` is
// called once the peer proved the secret (never without one).
// Returns the index in port.feeders of the trainer rank it is; an error says
// why it is refused. Duplicates are the caller's to find.
StatusOr<std::size_t> admit_link(Link& link, const DataPort& port, Deadline handshake, Deadline deadline,
                                 const std::function<void()>& authenticated) {
  RETURN_IF_ERROR(authenticate_as_server(link, Secret(port.secret), data_auth_context(port.engine_rank), handshake));
  if (!port.secret.empty()) authenticated();
  ASSIGN_OR_RETURN(FrameHeader frame, link.recv_header(port.secret.empty() ? handshake : deadline, 0));
  StatusOr<HelloFrame> decoded = decode_hello(frame, link.peer());
  if (!decoded.ok()) {
    return InvalidArgument("not a hello from one of its trainer ranks (" + decoded.status().message() + ")");
  }
  const HelloFrame& hello = *decoded;
  auto it = std::find(port.feeders.begin(), port.feeders.end(), hello.trainer_rank);
  if (it == port.feeders.end() || hello.engine_rank != static_cast<std::uint64_t>(port.engine_rank)) {
    return InvalidArgument("not a hello from one of its trainer ranks (trainer rank " +
                           std::to_string(hello.trainer_rank) + ", engine rank " + std::to_string(hello.engine_rank) +
                           ")");
  }
  if (hello.plan_digest != port.plan_digest) {
    // Only digests travel here (the coordinator, which has the specs, named
    // any difference at setup): say which settings make them differ.
    return FailedPrecondition("plan digest mismatch with " + feeder_name(hello.trainer_rank) +
                              ": its hello carries plan " + digest_hex(hello.plan_digest) + ", " + port.name +
                              " planned " + digest_hex(port.plan_digest) +
                              "; compare the two ranks' --model, --layers, --rule and --bucket-size");
  }
  return static_cast<std::size_t>(it - port.feeders.begin());
}


// How long a handshake accepted just before every trainer rank linked may
// still take to end by itself: a stranger's refusal takes milliseconds.
constexpr std::chrono::milliseconds kDataHandshakeGrace{500};

// A connection that sent the hello of an awaited trainer rank.
struct Admitted {
  std::size_t index;  // in port.feeders
  std::unique_ptr<Link> link;
  std::string address;  // where it connected from
};

// The handshakes of one accept_data_links call, each on a thread of its own
// (data_links.h). Why threads with a bound that evicts the oldest
// unauthenticated connection, rather than one handshake at a time or
// refusing newcomers while full: either of those lets N idle strangers
// hold the port for N x kDataAuthTimeout (or until they leave), and a
// trainer rank that arrives behind them waits or is refused; evicting the
// oldest lets a trainer, which answers within milliseconds, through any
// number of strangers, and the bound caps the threads they cost.
// Nothing is remembered about an address: a trainer from an attacker's
// address gets through like any other.
//
// Thread safety: start, take, reap and the destructor are for the thread of
// accept_data_links; refuse may be called from any thread.
class Handshakes {
 public:
  // `ready_fd` (an eventfd) is signalled whenever a connection is admitted.
  Handshakes(const DataPort& port, Deadline deadline, int ready_fd)
      : port_(port),
        deadline_(deadline),
        ready_fd_(ready_fd),
        refusals_(port.name, std::chrono::seconds(1), "data connection") {}
  // Ends every handshake in flight and joins every thread. One accepted
  // less than kDataHandshakeGrace ago gets the rest of that grace to end by
  // itself (a stranger accepted with the trainer ranks, as from the listen
  // backlog, is then told why it is refused, and logged so); older ones, and
  // those still going after it, are cut and refused. Admitted links not
  // taken are closed, refused.
  ~Handshakes() {
    {
      std::unique_lock<std::mutex> lock(mu_);
      for (;;) {
        const auto now = std::chrono::steady_clock::now();
        std::optional<std::chrono::steady_clock::time_point> next;
        for (Handshake& h : handshakes_) {
          if (h.done || h.cut) continue;
          const auto cut_at = h.accepted + kDataHandshakeGrace;
          if (cut_at <= now) {
            h.cut = true;
            if (h.link) h.link->shutdown();
          } else if (!next || cut_at < *next) {
            next = cut_at;
          }
        }
        if (!next) break;
        done_.wait_until(lock, *next);
      }
    }
    for (Handshake& h : handshakes_) h.thread.join();
    for (const Admitted& a : admitted_) refuse(a.address, "its hello came after it stopped accepting data links");
  }
  Handshakes(const Handshakes&) = delete;
  Handshakes& operator=(const Handshakes&) = delete;

  // Handshakes `link`, accepted just now, on a thread of its own.
  void start(std::unique_ptr<Link> link) {
    const Deadline handshake = deadline_.min(Deadline::After(kDataAuthTimeout));
    std::lock_guard<std::mutex> lock(mu_);
    make_room();
    Handshake& h = handshakes_.emplace_back();
    h.link = link.get();
    h.accepted = std::chrono::steady_clock::now();
    h.thread = std::thread(
        [this, hp = &h, owned = std::move(link), handshake]() mutable { run(hp, std::move(owned), handshake); });
  }

  // The connections admitted since the last call, in arrival order.
  std::deque<Admitted> take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(admitted_, {});
  }

  // Joins the threads of finished handshakes; logs the refusal counts whose
  // second is over.
  void reap() {
    std::list<Handshake> finished;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = handshakes_.begin(); it != handshakes_.end();) {
        auto next = std::next(it);
        if (it->done) finished.splice(finished.end(), handshakes_, it);
        it = next;
      }
    }
    for (Handshake& h : finished) h.thread.join();
    refusals_.flush();
  }

  // One refused connection, from `address`: counted and logged
  // (rate-limited). `why` must not name `address` again as "refused A: ".
  void refuse(const std::string& address, const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++refused_;
      last_refusal_ = address + ": " + why;
    }
    refusals_.refused(address, why);
  }

  // Refused so far, and the last one ("A: <why>"), for the deadline's error.
  int refused() {
    std::lock_guard<std::mutex> lock(mu_);
    return refused_;
  }
  std::string last_refusal() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_refusal_;
  }

 private:
  // One connection being handshaken. Its thread owns the Link; `link` lets
  // make_room and the destructor wake it (shutdown) and is cleared, under
  // mu_, before the thread gives the Link away or drops it. Fields other
  // than `thread` are guarded by mu_.
  struct Handshake {
    std::thread thread;
    Link* link = nullptr;
    std::chrono::steady_clock::time_point accepted;
    bool authenticated = false;  // proved the secret: never evicted
    bool evicted = false;
    bool cut = false;  // by the destructor
    bool done = false;
  };

  // REQUIRES: mu_ held. Evicts the oldest unauthenticated handshake when
  // kMaxUnauthenticatedDataLinks are in flight.
  void make_room() {
    int unauthenticated = 0;
    Handshake* oldest = nullptr;  // handshakes_ is in accept order
    for (Handshake& h : handshakes_) {
      if (h.done || h.authenticated || h.evicted) continue;
      ++unauthenticated;
      if (oldest == nullptr) oldest = &h;
    }
    if (unauthenticated < kMaxUnauthenticatedDataLinks || oldest == nullptr) return;
    // Its thread sees the shut-down link fail, refuses it and ends.
    oldest->evicted = true;
    if (oldest->link) oldest->link->shutdown();
  }

  void run(Handshake* h, std::unique_ptr<Link> link, Deadline handshake) {
    const std::string address = link->peer();
    StatusOr<std::size_t> index = admit_link(*link, port_, handshake, deadline_, [&] {
      std::lock_guard<std::mutex> lock(mu_);
      if (!h->evicted) h->authenticated = true;
    });
    std::string why;
    {
      std::lock_guard<std::mutex> lock(mu_);
      h->link = nullptr;
      h->done = true;
      done_.notify_all();
      if (index.ok() && !h->evicted && !h->cut) {
        admitted_.push_back(Admitted{*index, std::move(link), address});
        signal_event_fd(ready_fd_);
        return;
      }
      if (h->evicted) {
        why = "evicted unauthenticated: the oldest of " + std::to_string(kMaxUnauthenticatedDataLinks) +
              " unauthenticated data connections when another arrived";
      } else if (h->cut) {
        why = "still handshaking when it stopped accepting data links";
      } else {
        // authenticate_as_server's refusals start with "refused <address>: ":
        // the log line names the peer itself, once.
        why = refusal_reason(index.status(), address);
      }
    }
    refuse(address, why);  // without mu_: the log may take its time
  }

  const DataPort& port_;
  const Deadline deadline_;
  const int ready_fd_;
  RefusalLog refusals_;

  std::mutex mu_;  // guards everything below
  std::condition_variable done_;  // a handshake is done
  std::list<Handshake> handshakes_;
  std::deque<Admitted> admitted_;
  int refused_ = 0;
  std::string last_refusal_;
};

}  // namespace

StatusOr<std::vector<std::unique_ptr<Link>>> accept_data_links(Listener& listener, const DataPort& port,
                                                               const std::function<std::optional<Status>()>& stopped,
                                                               Deadline deadline) {
  const int ready_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (ready_fd < 0) return ErrnoStatus(port.name + ": eventfd for its data port", errno);
  struct CloseFd {
    int fd;
    ~CloseFd() { ::close(fd); }
  } close_ready{ready_fd};
  std::vector<std::unique_ptr<Link>> links(port.feeders.size());
  std::vector<std::string> addresses(port.feeders.size());
  std::size_t linked = 0;
  Handshakes handshakes(port, deadline, ready_fd);  // after ready_fd: joined before it is closed
  while (linked < port.feeders.size()) {
    // In slices, so that a job the coordinator ends meanwhile (a trainer
    // rank that will never link again) ends this wait too, and finished
    // handshakes are joined and refusal counts logged.
    pollfd fds[2] = {{listener.fd(), POLLIN, 0}, {ready_fd, POLLIN, 0}};
    StatusOr<int> ready = poll_wait(fds, deadline.min(Deadline::After(std::chrono::milliseconds(200))),
                                    "a data connection on " + listener.address());
    handshakes.reap();
    if (!ready.ok() && ready.status().code() != StatusCode::kDeadlineExceeded) return ready.status();
    if (ready.ok() && (fds[1].revents & POLLIN)) {
      drain_event_fd(ready_fd);
      for (Admitted& a : handshakes.take()) {
        if (links[a.index]) {
          handshakes.refuse(a.address, feeder_name(port.feeders[a.index]) +
                                           " is already linked (from " + addresses[a.index] + "): a duplicate");
          continue;  // closes it
        }
        a.link->set_peer(feeder_name(port.feeders[a.index]));
        addresses[a.index] = a.address;
        links[a.index] = std::move(a.link);
        ++linked;
      }
      if (linked == port.feeders.size()) break;
    }
    if (std::optional<Status> why = stopped()) {
      return Status(why->code(), port.name + " stopped waiting for its trainer ranks' data links: " + why->message());
    }
    if (deadline.expired()) {
      std::string missing;
      for (std::size_t i = 0; i < port.feeders.size(); ++i) {
        if (!links[i]) missing += (missing.empty() ? "" : ", ") + feeder_name(port.feeders[i]);
      }
      const int refused = handshakes.refused();
      return DeadlineExceeded(missing + " did not link to its data port " + listener.address() +
                              " within the setup deadline (--setup-timeout)" +
                              (refused == 0 ? std::string()
                                            : "; it refused " + std::to_string(refused) +
                                                  " data connection(s), the last from " + handshakes.last_refusal()));
    }
    if (ready.ok() && (fds[0].revents & POLLIN)) {
      auto accepted = listener.accept(Deadline::After(std::chrono::milliseconds(0)));
      if (accepted.ok()) {
        handshakes.start(std::move(*accepted));
      } else if (accepted.status().code() != StatusCode::kDeadlineExceeded) {
        return accepted.status();  // the peer left before the accept reads as a time-out
      }
    }
  }
  return links;
}

}  // namespace refit
