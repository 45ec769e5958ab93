// ControlClient: a rank's connection to the coordinator.
//
// Connect() authenticates (control/auth.h) before anything else is sent.
// Setup is request/response on the caller's thread (join -> setup). After
// start_reader(), one background thread reads and decodes every coordinator
// message (control/protocol.h) into a queue; an Abort, a Shutdown with an
// error or a lost coordinator also calls the on_abort callback at once, so
// the rank can wake whatever data-plane wait it is blocked in (DESIGN.md: a
// failure anywhere reaches every rank).
//
// Liveness: the same thread sends a heartbeat every HeartbeatTiming::interval
// and treats a coordinator it heard nothing from for HeartbeatTiming::timeout
// as lost (stalled, dead or cut off), exactly as a closed connection: every
// wait() wakes with kUnavailable and on_abort is called. So a wait without a
// fixed deadline (the next refit's start, which may come hours later) still
// ends within the heartbeat deadline once the coordinator is gone.
//
// Thread safety: send() may be called from any thread; wait() from one
// thread at a time.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "control/auth.h"
#include "control/protocol.h"
#include "control/control_message.h"
#include "net/link.h"

namespace refit {

class ControlClient {
 public:
  // Connects to the coordinator at `address` and authenticates both ways
  // with `secret` (control/auth.h; an empty secret: no authentication, which
  // only a coordinator without a secret accepts). Refused connections are
  // retried until `deadline`; an authentication failure is final
  // (kFailedPrecondition naming the coordinator and why).
  static StatusOr<std::unique_ptr<ControlClient>> Connect(const std::string& address, const Secret& secret,
                                                          Deadline deadline);
  // Without a secret. Transitional: ranks pass RankOptions::secret instead.
  static StatusOr<std::unique_ptr<ControlClient>> Connect(const std::string& address, Deadline deadline) {
    return Connect(address, Secret(), deadline);
  }
  ~ControlClient();

  // A rank that failed its own setup before joining tells the coordinator
  // why (SetupFailed in place of a join), so that setup ends at once for
  // every process instead of at the setup deadline. Best effort, within
  // `deadline`: a coordinator that cannot be reached or refuses this side
  // is not told, and nothing is returned.
  static void ReportSetupFailure(const std::string& address, const Secret& secret, const SetupFailed& failure,
                                 Deadline deadline);

  // Sends `join` and returns the coordinator's Setup; a refusal (duplicate
  // rank, bad settings, another protocol version ...) or an abort becomes
  // its status.
  StatusOr<Setup> join(const Join& join, Deadline deadline);

  Status send(const RankMessage& message);

  // Starts the reader and heartbeat thread (call once, right after join).
  void start_reader(HeartbeatTiming heartbeats, std::function<void(const Status&)> on_abort);

  // The next message. An Abort gives kAborted with the coordinator's
  // reason, a Shutdown with an error that error (the job ended after its
  // last commit), a lost coordinator kUnavailable.
  StatusOr<CoordinatorMessage> wait(Deadline deadline);
  // Like wait(), and checks the message is a T (errors name both types).
  template <class T>
  StatusOr<T> wait_for(Deadline deadline);
  // What may come between refits besides the next start, and what each
  // asks of the rank (an error ends the wait; none given: a protocol error):
  //   acquire (--release-between-refits): allocate or open the pools, answer;
  //   relink (many engines: the relay tree changed): an engine rank links
  //     again and says linked;
  //   catch_up (many engines: an engine joins): the joiner's parent sends it
  //     the committed weights and says sent (or failed).
  struct BetweenRefits {
    std::function<Status(const Acquire&)> acquire;
    std::function<Status(const Relink&)> relink;
    std::function<Status(const CatchUp&)> catch_up;
  };
  // The next refit's Start, or nullopt when the coordinator ended the job
  // cleanly (a Shutdown without an error).
  StatusOr<std::optional<Start>> wait_for_start(Deadline deadline, const BetweenRefits& between = {});
  // The same for as long as the coordinator is alive: no fixed deadline (a
  // trainer step between refits may take hours), only the heartbeat
  // deadline. REQUIRES: start_reader() was called.
  StatusOr<std::optional<Start>> wait_for_start_while_alive(const BetweenRefits& between = {});

  // After a failed refit: the coordinator's next instruction, skipping the
  // Abort that ended the refit: the Relink (recover: the abort state is
  // cleared, so the next refit starts clean), or nullopt for Shutdown. A
  // lost coordinator is kUnavailable; no instruction by `deadline`,
  // kDeadlineExceeded.
  StatusOr<std::optional<Relink>> wait_for_recovery(Deadline deadline);

  // The coordinator is lost (its connection closed or its heartbeats
  // stopped): nothing more will come from it (thread-safe).
  bool lost() const;

  // The reason the refit was aborted, once known (thread-safe).
  std::optional<Status> abort_reason() const;
  // Like abort_reason(), but waits up to `grace` for it: a rank whose data
  // plane failed gives the coordinator's verdict (which names the rank that
  // failed first) a moment to arrive.
  std::optional<Status> await_abort_reason(std::chrono::milliseconds grace);

  // A rank's refit `version` failed with `local`: waits briefly for the
  // coordinator's verdict, reports the failure ("failed") and returns the
  // status to exit with: the verdict with `local` appended, or `local`.
  Status report_failure(std::uint64_t version, const Status& local);

 private:
  explicit ControlClient(std::unique_ptr<Link> link) : link_(std::move(link)) {}
  void read_loop(HeartbeatTiming heartbeats);
  // The reader's end: the coordinator is lost for `why`.
  void lose(const Status& why);
  // One heartbeat, unless another send holds the link (that send is news
  // enough; a coordinator that reads nothing is found by its silence).
  void beat(HeartbeatTiming heartbeats);

  std::unique_ptr<Link> link_;
  std::mutex send_mu_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<CoordinatorMessage> queue_;
  std::optional<Status> abort_;
  bool closed_ = false;
  bool reading_ = false;  // start_reader() was called
  std::function<void(const Status&)> on_abort_;
  std::thread reader_;
};

// A rank that reported refit `version` done and then lost the coordinator
// (`lost`) before the commit decision reached it cannot know whether the
// version was committed: the coordinator may have decided it (and written
// its report) just before it was lost. The status says so, and which
// version the rank keeps (`kept`: its last applied commit); the caller
// neither applies `version` nor reports it as failed.
Status commit_in_doubt(std::uint64_t version, std::uint64_t kept, const Status& lost);

// `status` (a rank's final error, not OK) with the last version committed
// at this rank appended: every surviving rank's last line names the version
// it holds, to be compared with the coordinator's report.
Status with_committed_version(const Status& status, std::uint64_t committed);

template <class T>
StatusOr<T> ControlClient::wait_for(Deadline deadline) {
  ASSIGN_OR_RETURN(CoordinatorMessage message, wait(deadline));
  if (auto* wanted = std::get_if<T>(&message)) return std::move(*wanted);
  return InvalidArgument("protocol error: expected '" + message_name(CoordinatorMessage(T{})) +
                         "' from the coordinator, got '" + message_name(message) + "'");
}

}  // namespace refit
