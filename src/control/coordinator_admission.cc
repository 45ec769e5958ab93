// The coordinator shell's admission of ranks (coordinator_shell.h): joins
// until setup is complete, and who is in the job after it: replacement
// trainer ranks, engines joining the running job, engines dropped.
#include <poll.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <utility>

#include "control/coordinator_shell.h"
#include "control/topology.h"
#include "net/poll_wait.h"
#include "refit/format.h"

namespace refit {
namespace {

// How long the coordinator keeps answering ranks that arrive after another
// rank reported its setup failure.
constexpr std::chrono::seconds kLatecomerWindow{5};

}  // namespace

Status CoordinatorShell::accept_joins(Deadline deadline) {
  while (!roster_.complete()) {
    std::vector<pollfd> fds{{gate_->fd(), POLLIN, 0}};
    std::vector<Member*> members = roster_.joined();
    for (Member* m : members) fds.push_back({m->link->fd(), POLLIN, 0});
    const int ready = poll_until(fds, deadline.min(Deadline::After(std::chrono::milliseconds(200))));
    if (ready < 0) return ErrnoStatus("coordinator poll", -ready);
    for (std::size_t i = 1; ready > 0 && i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Member& m = *members[i - 1];
      // Nothing is due from a rank before its Setup: a message that arrives
      // anyway is ignored; a closed connection is a lost rank.
      auto message = recv_rank_message(*m.link, Deadline::After(std::chrono::milliseconds(1000)));
      if (!message.ok()) {
        return Unavailable("lost " + m.name() + " (pid " + std::to_string(m.join.pid) +
                           ") during setup, before every rank joined: " + message.status().message());
      }
    }
    if (deadline.expired()) {
      return DeadlineExceeded("setup timed out after " + format_seconds(options_.setup_timeout_s) + ": missing " +
                              roster_.missing());
    }
    progress_.setup(std::to_string(roster_.joined_count()) + " of " + format_count(roster_.expected(), "rank") +
                    " joined");
    while (auto candidate = gate_->take()) {
      if (joins_running_job(candidate->join)) {  // admitted once the job runs
        early_joiners_.push_back(std::move(*candidate));
        continue;
      }
      admit(std::move(candidate->link), candidate->join);
    }
    if (!roster_.setup_failure().ok()) return roster_.setup_failure();
  }
  return Status::Ok();
}

void CoordinatorShell::admit(std::unique_ptr<Link> link, const Json& text) {
  StatusOr<std::string> admitted = roster_.admit(std::move(link), text);
  if (!admitted.ok()) note(LogLevel::kWarning, admitted.status().message());
  if (admitted.ok() && !admitted->empty() && options_.log_joins) note(LogLevel::kInfo, *admitted);
}

void CoordinatorShell::answer_latecomers(const Status& why) {
  if (!gate_ || !roster_.failed_rank() || setup_deadline_.is_never()) return;
  const Deadline until = setup_deadline_.min(Deadline::After(kLatecomerWindow));
  std::set<RankKey> accounted = roster_.joined_keys();
  accounted.insert(*roster_.failed_rank());
  const std::size_t expected = static_cast<std::size_t>(roster_.expected());
  while (accounted.size() < expected && !until.expired()) {
    std::vector<pollfd> fds{{gate_->fd(), POLLIN, 0}};
    if (poll_until(fds, until.min(Deadline::After(std::chrono::milliseconds(200)))) < 0) return;
    while (auto candidate = gate_->take()) {
      auto message = decode_rank_message(candidate->join);
      const Join* join = message.ok() ? std::get_if<Join>(&*message) : nullptr;
      const SetupFailed* failed = message.ok() ? std::get_if<SetupFailed>(&*message) : nullptr;
      if (join != nullptr && roster_.fits(*join)) {
        (void)send_message(*candidate->link, CoordinatorMessage(Refusal{why}),
                           Deadline::After(std::chrono::milliseconds(1000)));
        accounted.insert(Roster::key(join->role, join->engine, join->rank));
      } else if (failed != nullptr) {
        accounted.insert(Roster::key(failed->role, failed->engine, failed->rank));
      }
    }
  }
}

bool CoordinatorShell::refuse_latecomers(RefitPhases& phases) {
  bool replaced = false;
  while (auto candidate = gate_->take()) {
    if (joins_running_job(candidate->join)) {
      replaced = admit_joiner(phases, std::move(candidate->link), candidate->join) || replaced;
      continue;
    }
    auto message = decode_rank_message(candidate->join);
    const Join* join = message.ok() ? std::get_if<Join>(&*message) : nullptr;
    if (join != nullptr && join->role == Role::kTrainer && phases.awaits_replacement(join->rank)) {
      replaced = admit_replacement(phases, std::move(candidate->link), *join) || replaced;
      continue;
    }
    StatusOr<std::string> admitted = roster_.admit(std::move(candidate->link), candidate->join);
    // The roster only admits a rank whose slot is free, which cannot
    // happen after setup; keep the invariant loud.
    note(LogLevel::kWarning, admitted.ok() ? "internal error: a rank was admitted after setup"
                                           : admitted.status().message());
  }
  return replaced;
}

bool CoordinatorShell::joins_running_job(const Json& text) const {
  auto message = decode_rank_message(text);
  const Join* join = message.ok() ? std::get_if<Join>(&*message) : nullptr;
  return join != nullptr && join->role == Role::kEngine &&
         join->engine >= static_cast<std::uint64_t>(options_.engines) &&
         join->engine < static_cast<std::uint64_t>(slots());
}

bool CoordinatorShell::admit_joiner(RefitPhases& phases, std::unique_ptr<Link> link, const Json& text) {
  StatusOr<std::string> admitted = roster_.admit(std::move(link), text);
  if (!admitted.ok()) note(LogLevel::kWarning, admitted.status().message());
  if (!admitted.ok() || admitted->empty()) return false;
  if (options_.log_joins) note(LogLevel::kInfo, *admitted + "; it waits for the next refit boundary");
  members_ = roster_.slots();
  const std::uint64_t k = std::get<Join>(*decode_rank_message(text)).engine;
  for (Member* m : engine_members(k)) {
    if (m != nullptr) m->closed = true;  // heard from once the machine admits it
  }
  const std::optional<std::vector<Join>> joins = roster_.engine(k);
  if (!joins) return true;  // its other ranks are on their way
  if (Status fits = tree_.check_joiner(k, *joins); !fits.ok()) {
    refuse_engine(k, FailedPrecondition("engine " + std::to_string(k) + " refused: " + fits.message()));
    return true;
  }
  waiting_.insert(k);
  feed(phases, EngineJoined{static_cast<int>(k)});
  return true;
}

std::vector<Member*> CoordinatorShell::engine_members(std::uint64_t k) const {
  const std::size_t ranks = static_cast<std::size_t>(options_.engine_ranks);
  const std::size_t first = static_cast<std::size_t>(options_.trainer_ranks) + k * ranks;
  return std::vector<Member*>(members_.begin() + static_cast<std::ptrdiff_t>(first),
                              members_.begin() + static_cast<std::ptrdiff_t>(first + ranks));
}

void CoordinatorShell::refuse_engine(std::uint64_t k, const Status& why) {
  note(LogLevel::kWarning, why.message());
  for (Member* m : engine_members(k)) {
    if (m != nullptr) {
      (void)send_message(*m->link, CoordinatorMessage(Refusal{why}), Deadline::After(std::chrono::seconds(1)));
    }
  }
  waiting_.erase(k);
  roster_.free_engine(k);
  members_ = roster_.slots();
}

void CoordinatorShell::admit_engine(const AdmitEngine& admit, std::vector<Lost>* lost) {
  waiting_.erase(admit.engine);
  const std::vector<Setup> setups = tree_.admit(admit.engine, roster_.engine(admit.engine).value());
  report_.record_tree(tree_.live_tree());
  const std::vector<Member*> ranks = engine_members(admit.engine);
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    Member& m = *ranks[r];
    m.closed = false;
    Status sent = send_message(*m.link, CoordinatorMessage(setups[r]), Deadline::After(std::chrono::seconds(5)));
    if (sent.ok()) continue;
    m.closed = true;
    lost->push_back(Lost{options_.trainer_ranks + static_cast<int>(admit.engine) * options_.engine_ranks +
                             static_cast<int>(r),
                         "its setup could not be sent: " + sent.message()});
  }
}

void CoordinatorShell::tell_waiting_engines(const Status& status) {
  for (std::uint64_t k : std::set<std::uint64_t>(waiting_)) {
    refuse_engine(k, Aborted("engine " + std::to_string(k) + " was not admitted: the job ended" +
                             (status.ok() ? "" : " (" + status.message() + ")") + " before a refit boundary"));
  }
}

bool CoordinatorShell::admit_replacement(RefitPhases& phases, std::unique_ptr<Link> link, const Join& join) {
  Member& old = roster_.trainer(join.rank);
  const std::string name = rank_name(join.role, join.rank), pid = std::to_string(join.pid);
  const std::string differs = join_difference(old.join, join);
  if (!differs.empty()) {
    const std::string why = "replacement " + name + " (pid " + pid + ") refused: its " + differs +
                            " differs from the lost process's";
    (void)send_message(*link, CoordinatorMessage(Refusal{FailedPrecondition(why)}),
                       Deadline::After(std::chrono::milliseconds(1000)));
    note(LogLevel::kWarning, why);
    return false;
  }
  Status sent = send_message(*link, CoordinatorMessage(trainer_setups_[static_cast<std::size_t>(join.rank)]),
                             Deadline::After(std::chrono::seconds(5)));
  if (!sent.ok()) {
    note(LogLevel::kWarning, "replacement " + name + ": setup not sent: " + sent.message());
    return false;
  }
  link->set_peer(name + " (pid " + pid + ")");
  old.link = std::move(link);
  old.join = join;
  old.closed = false;
  note(LogLevel::kInfo, "a replacement " + name + " joined (pid " + pid + ")");
  feed(phases, Replaced{join.rank});
  return true;
}

void CoordinatorShell::drop_engine(const DropEngine& drop) {
  note(LogLevel::kWarning, drop.joining ? drop.why.message()
                                        : "engine " + std::to_string(drop.engine) + " dropped from the job: " +
                                              drop.why.message());
  report_.record_drop(drop);
  const Status told = drop.joining ? drop.why
                                   : Aborted("engine " + std::to_string(drop.engine) + " was dropped from the job: " +
                                             drop.why.message());
  for (Member* m : engine_members(drop.engine)) {
    if (m == nullptr || m->closed) continue;
    (void)send_message(*m->link, CoordinatorMessage(Shutdown{told, report_.committed_version()}),
                       Deadline::After(std::chrono::seconds(2)));
    m->closed = true;
  }
  tree_.drop(drop.engine);
  report_.record_tree(tree_.live_tree());
  for (Setup& setup : trainer_setups_) {  // a replacement trainer rank links to the root of now
    for (const EngineTarget& root : moved_targets(setup)) {
      if (setup.targets.empty()) {
        setup.engine_address = root.address;
        setup.descriptor = root.descriptor;
      }
      for (EngineTarget& target : setup.targets) {
        if (target.engine_rank == root.engine_rank) target = root;
      }
    }
  }
  if (drop.joining) {
    roster_.free_engine(drop.engine);
    members_ = roster_.slots();
  }
}

}  // namespace refit
