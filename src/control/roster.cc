#include "control/roster.h"

#include <chrono>
#include <utility>

#include "control/topology.h"

namespace refit {

std::string Member::name() const { return join_name(join, engines); }

std::string join_difference(const Join& lost, const Join& replacement) {
  if (lost.protocol != replacement.protocol) return "control protocol";
  if (lost.device != replacement.device) return "device";
  if (lost.mode != replacement.mode) return "mode";
  if (lost.trainer_ranks != replacement.trainer_ranks) return "trainer rank count";
  if (lost.engine_ranks != replacement.engine_ranks) return "engine rank count";
  if (lost.bucket_size != replacement.bucket_size) return "bucket size";
  if (lost.transport != replacement.transport) return "transport";
  if (lost.plan_digest != replacement.plan_digest) return "plan digest";
  if (lost.engine_rank != replacement.engine_rank) return "engine rank";
  if (lost.stream_dtypes != replacement.stream_dtypes) return "stream dtypes";
  if (lost.quantize != replacement.quantize) return "quantize";
  if (lost.layout != replacement.layout) return "trainer layout";
  if (lost.transfer_digest != replacement.transfer_digest) return "transfer plan digest";
  if (lost.feeds != replacement.feeds) return "feeds";
  return "";
}

Roster::Roster(int trainer_ranks, int engine_ranks, int engines, int slots)
    : trainer_ranks_(trainer_ranks), engine_ranks_(engine_ranks), engines_(engines), slots_(slots) {
  trainers_.resize(static_cast<std::size_t>(trainer_ranks));
  engine_slots_.resize(static_cast<std::size_t>(engine_ranks) * static_cast<std::size_t>(slots));
}

bool Roster::fits(const Join& join) const { return check_join(join, trainer_ranks_, engine_ranks_, slots_).ok(); }

StatusOr<std::string> Roster::admit(std::unique_ptr<Link> link, const Json& text) {
  auto refuse = [&](const std::string& why) {
    (void)send_message(*link, CoordinatorMessage(Refusal{FailedPrecondition(why)}),
                       Deadline::After(std::chrono::milliseconds(1000)));
    return FailedPrecondition("refused " + link->peer() + ": " + why);
  };
  auto message = decode_rank_message(text);
  if (!message.ok()) return refuse(message.status().message());
  if (const auto* failed = std::get_if<SetupFailed>(&*message)) {
    RETURN_IF_ERROR(take_setup_failure(*failed, link->peer()));
    return std::string();
  }
  const Join* join = std::get_if<Join>(&*message);
  if (join == nullptr) return refuse("the first message must be a join with role and rank");
  if (Status fits = check_join(*join, trainer_ranks_, engine_ranks_, slots_); !fits.ok()) {
    return refuse(fits.message());
  }
  auto& slot = join->role == Role::kTrainer
                   ? trainers_[static_cast<std::size_t>(join->rank)]
                   : engine_slots_[join->engine * static_cast<std::size_t>(engine_ranks_) +
                                     static_cast<std::size_t>(join->rank)];
  const std::string name = join_name(*join, slots_), pid = std::to_string(join->pid);
  if (slot) {
    return refuse("duplicate " + name + ": already joined (pid " + std::to_string(slot->join.pid) + "), now from " +
                  link->peer() + " (pid " + pid + ")");
  }
  const std::string from = link->peer();
  Member m;
  m.link = std::move(link);
  m.link->set_peer(name + " (pid " + pid + ")");
  m.join = *join;
  m.engines = slots_;
  slot = std::move(m);
  ++joined_;
  return name + " joined from " + from + " (pid " + pid + ")";
}

// A rank of this job that failed its own setup before joining: setup ends
// with its reason. One that does not fit this job (another protocol, a rank
// out of range) is only logged.
Status Roster::take_setup_failure(const SetupFailed& failed, const std::string& peer) {
  Join as_join;
  as_join.protocol = failed.protocol;
  as_join.role = failed.role;
  as_join.rank = failed.rank;
  as_join.engine = failed.engine;
  if (Status fits = check_join(as_join, trainer_ranks_, engine_ranks_, slots_); !fits.ok()) {
    return FailedPrecondition("ignored a setup failure from " + peer + ": " + fits.message());
  }
  if (as_join.engine >= static_cast<std::uint64_t>(engines_)) {  // one joining the running job: the job goes on
    return FailedPrecondition(join_name(as_join, slots_) + " failed its setup before joining the running job: " +
                              failed.error.message());
  }
  if (complete()) {
    return FailedPrecondition("ignored a setup failure from " + peer + " after every rank joined: " +
                              failed.error.message());
  }
  failed_rank_ = key(failed.role, failed.engine, failed.rank);
  setup_failure_ = Status(failed.error.code(), join_name(as_join, slots_) + " (pid " + std::to_string(failed.pid) +
                                                   ") failed its setup before joining: " + failed.error.message());
  return Status::Ok();
}

std::string Roster::missing() const {
  std::string out;
  auto add = [&](const std::string& name) { out += (out.empty() ? "" : ", ") + name; };
  for (std::size_t t = 0; t < trainers_.size(); ++t) {
    if (!trainers_[t]) add(rank_name(Role::kTrainer, static_cast<int>(t)));
  }
  const std::size_t ranks = static_cast<std::size_t>(engine_ranks_);
  for (std::size_t g = 0; g < ranks * static_cast<std::size_t>(engines_); ++g) {
    Join j;
    j.role = Role::kEngine;
    j.engine = g / ranks;
    j.rank = static_cast<int>(g % ranks);
    if (!engine_slots_[g]) add(join_name(j, slots_));
  }
  return out;
}

std::vector<Member*> Roster::joined() {
  std::vector<Member*> out;
  for (auto* group : {&trainers_, &engine_slots_}) {
    for (auto& m : *group) {
      if (m) out.push_back(&*m);
    }
  }
  return out;
}

std::vector<Member*> Roster::slots() {
  std::vector<Member*> out;
  for (auto* group : {&trainers_, &engine_slots_}) {
    for (auto& m : *group) out.push_back(m ? &*m : nullptr);
  }
  return out;
}

std::optional<std::vector<Join>> Roster::engine(std::uint64_t engine) const {
  std::vector<Join> out;
  const std::size_t ranks = static_cast<std::size_t>(engine_ranks_);
  for (std::size_t r = 0; r < ranks; ++r) {
    const auto& m = engine_slots_[engine * ranks + r];
    if (!m) return std::nullopt;
    out.push_back(m->join);
  }
  return out;
}

void Roster::free_engine(std::uint64_t engine) {
  const std::size_t ranks = static_cast<std::size_t>(engine_ranks_);
  for (std::size_t r = 0; r < ranks; ++r) {
    if (engine_slots_[engine * ranks + r]) --joined_;
    engine_slots_[engine * ranks + r].reset();
  }
}

std::vector<Join> Roster::trainer_joins() const {
  std::vector<Join> out;
  for (const auto& t : trainers_) out.push_back(t->join);
  return out;
}

std::vector<Join> Roster::engine_joins() const {
  std::vector<Join> out;
  for (std::size_t g = 0; g < static_cast<std::size_t>(engine_ranks_ * engines_); ++g) {
    out.push_back(engine_slots_[g]->join);
  }
  return out;
}

std::set<RankKey> Roster::joined_keys() const {
  std::set<RankKey> out;
  for (const auto* group : {&trainers_, &engine_slots_}) {
    for (const auto& m : *group) {
      if (m) out.insert(key(m->join.role, m->join.engine, m->join.rank));
    }
  }
  return out;
}

}  // namespace refit
