#include "control/coordinator.h"

#include <arpa/inet.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "control/join_gate.h"
#include "control/gpu_sharing.h"
#include "control/spec_json.h"
#include "refit/aligner.h"
#include "refit/link.h"
#include "refit/plan.h"

namespace refit {
namespace {

using Clock = std::chrono::steady_clock;

// 127.0.0.0/8, ::1 or "localhost": only this host's processes can connect.
bool is_loopback_host(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

// One joined rank as the coordinator sees it.
struct Member {
  std::unique_ptr<Link> link;
  // Messages that arrived ahead of the phase that expects them (a trainer's
  // "done" while the coordinator still waits for an engine's "sent").
  std::deque<Json> early;
  std::string role;  // "trainer" or "engine"
  int rank = 0;
  Json join;
  std::string name() const { return role + " rank " + std::to_string(rank); }
};

class Coordinator {
 public:
  explicit Coordinator(const CoordinatorOptions& options) : options_(options) {
    report_["verified"] = false;
    report_["refits"] = Json::array();
    report_["failures"] = Json::array();  // refits that failed and were recovered from
    report_["ranks"] = Json::array();
    report_["trainer_ranks"] = Json::array();
  }

  Json run(const std::function<void(int)>& on_listening) {
    Status status = setup(on_listening);
    if (status.ok()) status = refits();
    if (!status.ok()) {
      report_["error"] = status.ToString();
      report_["verified"] = false;
      broadcast(Json{{"type", "abort"}, {"version", current_version_}, {"error", status_to_json(status)}});
    } else {
      report_["verified"] = all_verified_ && report_["failures"].empty();
      broadcast(Json{{"type", "shutdown"}});
    }
    return report_;
  }

 private:
  // ---- setup -------------------------------------------------------------

  Status setup(const std::function<void(int)>& on_listening) {
    RETURN_IF_ERROR(validate_rank_counts(options_.trainer_ranks, options_.engine_ranks));
    std::string host;
    int port = 0;
    RETURN_IF_ERROR(split_host_port(options_.listen, &host, &port));
    if (options_.secret.empty()) {
      if (!is_loopback_host(host)) {
        return FailedPrecondition("refusing to listen on " + options_.listen +
                                  " without a secret: any host that reaches it could join and replace the weights; "
                                  "give the coordinator and every rank --secret-file (or REFIT_SECRET), or listen on "
                                  "a loopback address");
      }
      log("warning: no secret (--secret-file or REFIT_SECRET): ranks are not authenticated; any local process can "
          "join");
    }
    ASSIGN_OR_RETURN(auto listener, Listener::Listen(host, port));
    const int listening_port = listener->port();
    JoinGate::Options gate;
    gate.secret = options_.secret;
    ASSIGN_OR_RETURN(gate_, JoinGate::Start(std::move(listener), std::move(gate)));
    on_listening(listening_port);
    trainers_.resize(options_.trainer_ranks);
    engines_.resize(options_.engine_ranks);

    Deadline deadline = Deadline::AfterSeconds(options_.setup_timeout_s);
    RETURN_IF_ERROR(accept_joins(deadline));
    RETURN_IF_ERROR(validate_topology());
    RETURN_IF_ERROR(send_setup(deadline));
    RETURN_IF_ERROR(wait_all("setup", "linked", deadline, nullptr));
    if (options_.log_joins) {
      log("setup complete: " + std::to_string(options_.trainer_ranks) + " trainer ranks, " +
          std::to_string(options_.engine_ranks) + " engine ranks linked");
    }
    return Status::Ok();
  }

  // Admits joins (authenticated and read by the gate) until every rank
  // joined; refusals are logged and never disturb the ranks already in.
  Status accept_joins(Deadline deadline) {
    while (joined_ < options_.trainer_ranks + options_.engine_ranks) {
      pollfd gate{gate_->fd(), POLLIN, 0};
      int ready = ::poll(&gate, 1, std::min(deadline.remaining_ms(), 200));
      if (ready < 0 && errno != EINTR) return ErrnoStatus("coordinator poll", errno);
      if (deadline.expired()) return DeadlineExceeded(missing_ranks_message());
      while (auto candidate = gate_->take()) {
        Status st = admit(std::move(candidate->link), std::move(candidate->join));
        if (!st.ok()) log(st.message());
      }
    }
    return Status::Ok();
  }

  std::string missing_ranks_message() const {
    std::string missing;
    for (std::size_t t = 0; t < trainers_.size(); ++t) {
      if (!trainers_[t]) missing += (missing.empty() ? "" : ", ") + std::string("trainer rank ") + std::to_string(t);
    }
    for (std::size_t e = 0; e < engines_.size(); ++e) {
      if (!engines_[e]) missing += (missing.empty() ? "" : ", ") + std::string("engine rank ") + std::to_string(e);
    }
    return "setup timed out after " + std::to_string(options_.setup_timeout_s) + " s: missing " + missing;
  }

  // Checks one join message; refuses (and tells) a rank that is out of range
  // or a duplicate, without disturbing the ranks already admitted.
  Status admit(std::unique_ptr<Link> link, Json join) {
    auto refuse = [&](const std::string& why) {
      (void)send_control(*link, Json{{"type", "error"}, {"error", status_to_json(FailedPrecondition(why))}},
                         Deadline::After(std::chrono::milliseconds(1000)));
      return FailedPrecondition("refused " + link->peer() + ": " + why);
    };
    auto type = json_string(join, "type");
    auto role = json_string(join, "role");
    auto rank = json_int(join, "rank");
    if (!type.ok() || *type != "join" || !role.ok() || !rank.ok()) {
      return refuse("the first message must be a join with role and rank");
    }
    std::vector<std::optional<Member>>* group = nullptr;
    if (*role == "trainer") group = &trainers_;
    if (*role == "engine") group = &engines_;
    if (group == nullptr) return refuse("unknown role '" + *role + "' (expected trainer or engine)");
    if (*rank < 0 || *rank >= static_cast<std::int64_t>(group->size())) {
      return refuse(*role + " rank " + std::to_string(*rank) + " is out of range: the coordinator expects " +
                    std::to_string(group->size()) + " " + *role + " ranks (0.." + std::to_string(group->size() - 1) +
                    ")");
    }
    auto& slot = (*group)[static_cast<std::size_t>(*rank)];
    if (slot) {
      return refuse("duplicate " + *role + " rank " + std::to_string(*rank) + ": already joined from " +
                    slot->link->peer() + " (pid " + std::to_string(slot->join.value("pid", 0)) + "), now from " +
                    link->peer() + " (pid " + std::to_string(join.value("pid", 0)) + ")");
    }
    const std::string from = link->peer();
    Member m;
    m.role = *role;
    m.rank = static_cast<int>(*rank);
    m.link = std::move(link);
    m.link->set_peer(m.name() + " (pid " + std::to_string(join.value("pid", 0)) + ")");
    m.join = std::move(join);
    if (options_.log_joins) log(m.name() + " joined from " + from + " (pid " + std::to_string(m.join.value("pid", 0)) + ")");
    slot = std::move(m);
    ++joined_;
    return Status::Ok();
  }

  // Every cross-rank check of DESIGN.md rules 1, 4 and 10, naming the setting
  // and both values.
  Status validate_topology() {
    const Member& first = *engines_[0];
    // Settings every rank must agree on.
    for (const char* field : {"bucket_size", "transport", "mode", "trainer_ranks", "engine_ranks"}) {
      for (auto* group : {&trainers_, &engines_}) {
        for (const auto& m : *group) {
          if (!m->join.contains(field)) return FailedPrecondition(m->name() + " joined without '" + field + "'");
          if (m->join[field] != first.join[field]) {
            std::string a = first.join[field].dump(), b = m->join[field].dump();
            if (std::string(field) == "bucket_size") {
              a = format_bytes(first.join[field].get<std::uint64_t>()) + " (" + a + ")";
              b = format_bytes(m->join[field].get<std::uint64_t>()) + " (" + b + ")";
            }
            return FailedPrecondition(std::string(field) + " differs: " + first.name() + " has " + a + ", " +
                                      m->name() + " has " + b);
          }
        }
      }
    }
    if (first.join["trainer_ranks"] != options_.trainer_ranks || first.join["engine_ranks"] != options_.engine_ranks) {
      return FailedPrecondition("the ranks were started for " + first.join["trainer_ranks"].dump() +
                                " trainer and " + first.join["engine_ranks"].dump() +
                                " engine ranks, the coordinator for " + std::to_string(options_.trainer_ranks) +
                                " and " + std::to_string(options_.engine_ranks));
    }
    report_["transport"] = first.join["transport"];
    report_["mode"] = first.join["mode"];
    report_["device"] = first.join.value("device", std::string("cpu"));
    report_["bucket_size"] = first.join["bucket_size"];
    if (first.join["transport"] == "nccl") {
      std::vector<RankGpu> placed;
      for (auto* group : {&trainers_, &engines_}) {
        for (const auto& m : *group) placed.push_back({m->name(), m->join.value("gpu", std::string())});
      }
      for (const std::string& warning : nccl_shared_gpu_warnings(placed)) log(warning);
    }

    // Engine-local resources.
    for (const auto& e : engines_) {
      std::uint64_t slots = e->join.value("pool_slots", 0ull);
      std::uint64_t pool = slots * e->join.value("bucket_size", 0ull);
      std::uint64_t limit = e->join.value("memory_limit", 0ull);
      if (slots < 2) {
        return FailedPrecondition("pool_slots of " + e->name() + " is " + std::to_string(slots) +
                                  ": the rotating receive pool needs at least 2 slots");
      }
      if (limit != 0 && pool > limit) {
        return FailedPrecondition("the receive pool of " + e->name() + " (" + std::to_string(slots) + " x " +
                                  format_bytes(e->join["bucket_size"].get<std::uint64_t>()) + " = " +
                                  format_bytes(pool) + ") does not fit its memory limit " + format_bytes(limit) +
                                  " (--memory-limit)");
      }
    }
    // Trainer vs the engine rank it feeds: plan digest and dtypes.
    for (const auto& t : trainers_) {
      const Member& e = *engines_[static_cast<std::size_t>(t->rank % options_.engine_ranks)];
      if (t->join.value("plan_digest", std::string()) != e.join.value("plan_digest", std::string())) {
        return FailedPrecondition("plan digest mismatch: " + t->name() + " computed " +
                                  t->join.value("plan_digest", std::string("?")) + " for " + e.name() + "'s stream, " +
                                  e.name() + " computed " + e.join.value("plan_digest", std::string("?")) +
                                  " (same bucket_size " + e.join["bucket_size"].dump() +
                                  "; the two sides disagree on the tensor specs)");
      }
      const Json supported = e.join.value("supported_dtypes", Json::array());
      const Json examples = t->join.value("stream_dtypes", Json::object());
      for (auto it = examples.begin(); it != examples.end(); ++it) {
        bool ok = false;
        for (const Json& s : supported) ok = ok || s == it.key();
        if (!ok) {
          return FailedPrecondition("unsupported dtype: " + t->name() + " sends " + it.key() + " (tensor '" +
                                    it.value().get<std::string>() + "') but " + e.name() + " supports only " +
                                    supported.dump());
        }
      }
    }
    // Alignment across the engine's ranks (rule 4), decided here at setup.
    streams_.resize(engines_.size());
    std::vector<Plan> plans;
    for (std::size_t e = 0; e < engines_.size(); ++e) {
      auto specs = specs_from_json(engines_[e]->join.value("specs", Json()), engines_[e]->name());
      if (!specs.ok()) return specs.status();
      streams_[e] = *specs;
      RETURN_IF_ERROR(check_plan_bounds(*specs, engines_[e]->join["bucket_size"].get<std::uint64_t>(),
                                        engines_[e]->name()));
      auto plan = make_plan(*specs, engines_[e]->join["bucket_size"].get<std::uint64_t>());
      if (!plan.ok()) return plan.status().WithContext(engines_[e]->name());
      if (plan->digest_hex() != engines_[e]->join.value("plan_digest", std::string())) {
        return FailedPrecondition("plan digest mismatch: " + engines_[e]->name() + " sent " +
                                  engines_[e]->join.value("plan_digest", std::string("?")) +
                                  " but its specs give " + plan->digest_hex());
      }
      plans.push_back(std::move(*plan));
    }
    std::vector<const Plan*> plan_ptrs;
    for (const Plan& p : plans) plan_ptrs.push_back(&p);
    auto schedule = aligned_schedule(plan_ptrs);
    if (!schedule.ok()) return schedule.status().WithContext("engine streams cannot be aligned");
    report_["aligned_batches"] = schedule->size();
    report_["divergent_boundaries"] = boundaries_differ(plans);
    for (const Plan& p : plans) total_bytes_ += p.total_bytes;
    report_["bytes_per_refit"] = total_bytes_;
    return Status::Ok();
  }

  static bool boundaries_differ(const std::vector<Plan>& plans) {
    auto boundaries = [](const Plan& p) {
      std::vector<std::size_t> ends;
      std::size_t n = 0;
      for (const Bucket& b : p.buckets) {
        n += b.completes.size();
        if (!b.completes.empty()) ends.push_back(n);
      }
      return ends;
    };
    for (const Plan& p : plans) {
      if (boundaries(p) != boundaries(plans[0])) return true;
    }
    return false;
  }

  Status send_setup(Deadline deadline) {
    Json all_streams = Json::array();
    for (const auto& s : streams_) all_streams.push_back(specs_to_json(s));
    for (std::size_t e = 0; e < engines_.size(); ++e) {
      Json feeders = Json::array();
      for (int t = static_cast<int>(e); t < options_.trainer_ranks; t += options_.engine_ranks) feeders.push_back(t);
      Json setup{{"type", "setup"}, {"seed", options_.seed}, {"feeders", feeders}, {"streams", all_streams}};
      RETURN_IF_ERROR(send_control(*engines_[e]->link, setup, deadline).WithContext("setup of " + engines_[e]->name()));
    }
    for (const auto& t : trainers_) {
      int e = t->rank % options_.engine_ranks;
      const Member& engine = *engines_[static_cast<std::size_t>(e)];
      int feeders = (options_.trainer_ranks - e + options_.engine_ranks - 1) / options_.engine_ranks;
      Json setup{{"type", "setup"},
                 {"seed", options_.seed},
                 {"engine_rank", e},
                 {"engine_address", engine.join.value("data_address", std::string())},
                 {"descriptor", engine.join.value("descriptor", std::string())},
                 {"trainer_index", t->rank / options_.engine_ranks},
                 {"feeders", feeders},
                 {"engine_device", engine.join.value("device", std::string("cpu"))},
                 {"on_demand", options_.refits == 0}};
      RETURN_IF_ERROR(send_control(*t->link, setup, deadline).WithContext("setup of " + t->name()));
    }
    return Status::Ok();
  }

  // ---- refits ------------------------------------------------------------

  std::vector<Member*> members() {
    std::vector<Member*> out;
    for (auto& t : trainers_) out.push_back(&*t);
    for (auto& e : engines_) out.push_back(&*e);
    return out;
  }

  void broadcast(const Json& message) {
    for (auto* group : {&trainers_, &engines_}) {
      for (auto& m : *group) {
        if (m && m->link) (void)send_control(*m->link, message, Deadline::After(std::chrono::milliseconds(2000)));
      }
    }
  }

  Status send_all(const Json& message, Deadline deadline) {
    for (Member* m : members()) RETURN_IF_ERROR(send_control(*m->link, message, deadline).WithContext(m->name()));
    return Status::Ok();
  }

  // Waits until every rank sent `type` (engines and trainers), handling
  // progress and failure messages. `on_message` sees each awaited message.
  // `only`: wait for these members instead of every one; `alternative`: a
  // second message type that also counts.
  Status wait_all(const std::string& phase, const std::string& type, Deadline deadline,
                  const std::function<Status(Member&, const Json&)>& on_message,
                  const std::vector<Member*>* only = nullptr, const std::string& alternative = "",
                  bool recovering = false) {
    std::vector<Member*> all = only ? *only : members();
    std::vector<bool> have(all.size(), false);
    std::size_t count = 0;
    auto accept = [&](std::size_t i, const Json& message) -> Status {
      if (have[i]) {
        return InvalidArgument("protocol error: " + all[i]->name() + " sent '" + type + "' twice during " +
                               phase_name(phase));
      }
      if (on_message) RETURN_IF_ERROR(on_message(*all[i], message));
      have[i] = true;
      ++count;
      return Status::Ok();
    };
    for (std::size_t i = 0; i < all.size(); ++i) {
      if (!all[i]->early.empty() &&
          (all[i]->early.front()["type"] == type || (!alternative.empty() && all[i]->early.front()["type"] == alternative))) {
        Json message = std::move(all[i]->early.front());
        all[i]->early.pop_front();
        RETURN_IF_ERROR(accept(i, message));
      }
    }
    while (count < all.size()) {
      std::vector<pollfd> fds;
      for (Member* m : all) fds.push_back({m->link->fd(), POLLIN, 0});
      fds.push_back({gate_->fd(), POLLIN, 0});
      int ready = ::poll(fds.data(), fds.size(), std::min(deadline.remaining_ms(), 100));
      if (ready > 0 && (fds.back().revents & POLLIN)) refuse_latecomer();
      if (ready < 0 && errno != EINTR) return ErrnoStatus("coordinator poll", errno);
      if (ready <= 0) {
        if (deadline.expired()) {
          std::string waiting;
          for (std::size_t i = 0; i < all.size(); ++i) {
            if (!have[i]) waiting += (waiting.empty() ? "" : ", ") + all[i]->name();
          }
          return DeadlineExceeded(phase_name(phase) + " timed out waiting for '" + type + "' from " + waiting);
        }
        continue;
      }
      for (std::size_t i = 0; i < all.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        auto message = recv_control(*all[i]->link, Deadline::After(std::chrono::milliseconds(5000)));
        if (!message.ok()) {
          lost_ = true;
          return Aborted("lost " + all[i]->name() + " during " + phase_name(phase) + ": " +
                         message.status().message());
        }
        if (recovering && (*message)["type"] != type) {
          // What the aborted refit still had in flight (its reports, the
          // failures it caused) is dropped; a request for the next refit is kept.
          const std::string kind = (*message)["type"].get<std::string>();
          if (kind == "request" || kind == "finish") all[i]->early.push_back(std::move(*message));
          continue;
        }
        const std::string kind = (*message)["type"].get<std::string>();
        if (kind == "failed") {
          Status why = status_from_json(message->value("error", Json()));
          std::string report = all[i]->name() + " failed during " + phase_name(phase) + ": " + why.message();
          // A rank usually fails because a peer died: name the dead peer as
          // the cause when its connection is gone too.
          if (std::optional<std::string> lost = find_lost_member(all, all[i])) {
            lost_ = true;
            return Aborted("lost " + *lost + " during " + phase_name(phase) + " (" + report + ")");
          }
          return Status(why.code(), report);
        }
        if (kind == "progress") {
          on_progress(*all[i], *message);
          continue;
        }
        if ((kind != type && (alternative.empty() || kind != alternative)) || have[i]) {
          if (comes_later(kind, type)) {
            all[i]->early.push_back(std::move(*message));
            continue;
          }
          return InvalidArgument("protocol error: " + all[i]->name() + " sent '" + kind + "' during " +
                                 phase_name(phase) + " (expected '" + type + "')");
        }
        RETURN_IF_ERROR(accept(i, *message));
      }
    }
    return Status::Ok();
  }

  // Watches every other member's connection for a short grace period and
  // returns the name of one whose connection closed, if any.
  std::optional<std::string> find_lost_member(const std::vector<Member*>& all, const Member* reporter) {
    Deadline grace = Deadline::After(std::chrono::milliseconds(500));
    // A member that reported its own failure and then exited is not "lost".
    std::vector<bool> reported(all.size(), false);
    while (!grace.expired()) {
      std::vector<pollfd> fds;
      for (Member* m : all) fds.push_back({m->link->fd(), POLLIN, 0});
      if (::poll(fds.data(), fds.size(), std::min(grace.remaining_ms(), 50)) <= 0) continue;
      for (std::size_t i = 0; i < all.size(); ++i) {
        if (all[i] == reporter || reported[i] || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        // Drain what the member still sends; an error means it is gone.
        auto message = recv_control(*all[i]->link, Deadline::After(std::chrono::milliseconds(50)));
        if (!message.ok()) return all[i]->name();
        if ((*message)["type"] == "failed") reported[i] = true;
      }
    }
    return std::nullopt;
  }

  // A connection after setup can only be a duplicate or a stray: refuse it
  // (with the reason) and log it; the running job is not disturbed.
  void refuse_latecomer() {
    while (auto candidate = gate_->take()) {
      Status st = admit(std::move(candidate->link), std::move(candidate->join));
      if (st.ok()) {
        // admit() only accepts a rank whose slot is free, which cannot happen
        // after setup; keep the invariant loud.
        log("internal error: a rank was admitted after setup");
      } else {
        log(st.message());
      }
    }
  }

  // True when `kind` is a per-refit report that follows `expected` in the
  // protocol (ready, sent, done, committed).
  static bool comes_later(const std::string& kind, const std::string& expected) {
    // On demand, a trainer rank asks for the next refit as soon as it is
    // ready, which may be before the others linked or committed.
    if ((kind == "request" || kind == "finish") && expected != "request") return true;
    static const std::vector<std::string> order = {"ready", "sent", "done", "committed"};
    auto a = std::find(order.begin(), order.end(), kind), b = std::find(order.begin(), order.end(), expected);
    return a != order.end() && b != order.end() && a > b;
  }

  std::string phase_name(const std::string& phase) const {
    if (phase == "setup") return "setup";
    return "refit " + std::to_string(current_version_) + " (" + phase + ")";
  }

  void on_progress(Member& m, const Json& message) {
    progress_bytes_[m.rank] = message.value("bytes", 0ull);
    draw_progress(false);
  }

  void draw_progress(bool final) {
    if (!options_.progress) return;
    auto now = Clock::now();
    if (!final && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    std::uint64_t sent = 0;
    for (auto& [rank, bytes] : progress_bytes_) sent += bytes;
    if (final) sent = total_bytes_;
    double frac = total_bytes_ ? static_cast<double>(sent) / static_cast<double>(total_bytes_) : 1.0;
    frac = std::min(frac, 1.0);
    double secs = std::chrono::duration<double>(now - go_time_).count();
    int width = 30, filled = static_cast<int>(frac * width);
    std::fprintf(stderr, "\rrefit %llu%s [%s%s] %3d%% %s %.2f GB/s%s",
                 static_cast<unsigned long long>(current_version_),
                 options_.refits > 0 ? ("/" + std::to_string(options_.refits)).c_str() : "",
                 std::string(static_cast<std::size_t>(filled), '#').c_str(),
                 std::string(static_cast<std::size_t>(width - filled), ' ').c_str(), static_cast<int>(frac * 100),
                 format_bytes(sent).c_str(), secs > 0 ? static_cast<double>(sent) / secs / 1e9 : 0.0,
                 final ? "\n" : "");
    std::fflush(stderr);
  }

  // On demand (--refits 0): each refit starts when every trainer rank asked
  // for it ("request", the same version, above the last committed one); the
  // job ends when every trainer rank said "finish".
  Status refits_on_demand() {
    all_verified_ = true;
    std::vector<Member*> trainers;
    for (auto& t : trainers_) trainers.push_back(&*t);
    for (;;) {
      std::optional<std::uint64_t> version;
      int finished = 0;
      RETURN_IF_ERROR(wait_all(
          "request", "request", Deadline::Never(),
          [&](Member& m, const Json& message) -> Status {
            if (message["type"] == "finish") {
              ++finished;
              return Status::Ok();
            }
            auto v = json_uint(message, "version");
            if (!v.ok()) return v.status().WithContext("request from " + m.name());
            if (*v <= committed_version_) {
              return InvalidArgument(m.name() + " asked for refit " + std::to_string(*v) +
                                     ", not above the last committed version " + std::to_string(committed_version_));
            }
            if (version && *version != *v) {
              return InvalidArgument("the trainer ranks ask for different versions: " + std::to_string(*version) +
                                     " and " + std::to_string(*v) + " (" + m.name() + ")");
            }
            version = *v;
            return Status::Ok();
          },
          &trainers, "finish"));
      if (finished == static_cast<int>(trainers.size())) return Status::Ok();
      if (finished > 0) {
        return InvalidArgument(std::to_string(finished) + " trainer ranks finished while the others asked for refit " +
                               std::to_string(*version));
      }
      current_version_ = *version;
      RETURN_IF_ERROR(refit_or_recover());
    }
  }

  // Runs refit current_version_; when it fails while every rank lives, aborts
  // it on every rank and relinks them (recover) so that the job goes on: the
  // failure is recorded in the report and the next refit starts clean. A
  // lost rank, or one that does not relink in time, ends the job.
  Status refit_or_recover() {
    Status failure = refit_once();
    if (failure.ok()) {
      committed_version_ = current_version_;
      return Status::Ok();
    }
    if (lost_) return failure;
    log("refit " + std::to_string(current_version_) + " failed: " + failure.message() + "; recovering");
    report_["failures"].push_back(Json{{"version", current_version_}, {"error", failure.ToString()}});
    if (!report_.contains("error")) report_["error"] = failure.ToString();
    broadcast(Json{{"type", "abort"}, {"version", current_version_}, {"error", status_to_json(failure)}});
    for (Member* m : members()) m->early.clear();
    Deadline deadline = Deadline::AfterSeconds(options_.setup_timeout_s);
    Status relinked = send_all(Json{{"type", "relink"}, {"version", current_version_}}, deadline);
    Json engines = Json::array();
    if (relinked.ok()) {
      relinked = wait_all("recovery", "linked", deadline, [&](Member& m, const Json& message) {
        if (m.role == "engine") {
          engines.push_back(Json{{"rank", m.rank},
                                 {"version", message.value("version", 0ull)},
                                 {"weights_complete", message.value("weights_complete", false)}});
        }
        return Status::Ok();
      }, nullptr, "", /*recovering=*/true);
    }
    if (!relinked.ok()) {
      return Status(failure.code(), failure.message() + "; recovery failed: " + relinked.message());
    }
    report_["failures"].back()["engines_after"] = engines;
    log("recovered from the failed refit " + std::to_string(current_version_) + ": every rank relinked, engine weights " +
        "at version " + std::to_string(committed_version_) + " (incomplete until the next refit commits)");
    return Status::Ok();
  }

  Status refits() {
    if (options_.refits == 0) return refits_on_demand();
    all_verified_ = true;
    for (int i = 1; i <= options_.refits; ++i) {
      current_version_ = static_cast<std::uint64_t>(i);
      RETURN_IF_ERROR(refit_or_recover());
    }
    return Status::Ok();
  }

  Status refit_once() {
    const std::uint64_t v = current_version_;
    Deadline deadline = Deadline::AfterSeconds(options_.refit_timeout_s);
    progress_bytes_.clear();
    RETURN_IF_ERROR(send_all(Json{{"type", "start"}, {"version", v}}, deadline));
    RETURN_IF_ERROR(wait_all("prepare", "ready", deadline, nullptr));
    go_time_ = Clock::now();
    RETURN_IF_ERROR(send_all(Json{{"type", "go"}, {"version", v}}, deadline));
    Clock::time_point last_applied = go_time_;
    RETURN_IF_ERROR(wait_all("transfer", "sent", deadline, [&](Member&, const Json&) {
      last_applied = Clock::now();
      return Status::Ok();
    }));
    double seconds = std::chrono::duration<double>(last_applied - go_time_).count();
    draw_progress(true);
    Json ranks = Json::array(), trainer_stats = Json::array();
    bool verified = true;
    RETURN_IF_ERROR(wait_all("verify", "done", deadline, [&](Member& m, const Json& message) {
      if (m.role == "engine") {
        Json stats = message.value("stats", Json::object());
        stats["rank"] = m.rank;
        ranks.push_back(stats);
        if (!message.value("verified", false)) verified = false;
      } else {
        Json stats = message.value("stats", Json::object());
        stats["rank"] = m.rank;
        trainer_stats.push_back(stats);
      }
      return Status::Ok();
    }));
    if (!verified) all_verified_ = false;
    RETURN_IF_ERROR(send_all(Json{{"type", "commit"}, {"version", v}}, deadline));
    RETURN_IF_ERROR(wait_all("commit", "committed", deadline, [&](Member& m, const Json& message) {
      if (message.value("version", 0ull) != v) {
        return Internal(m.name() + " committed version " + message.value("version", Json()).dump() + ", expected " +
                        std::to_string(v));
      }
      return Status::Ok();
    }));
    std::sort(ranks.begin(), ranks.end(), [](const Json& a, const Json& b) { return a["rank"] < b["rank"]; });
    std::sort(trainer_stats.begin(), trainer_stats.end(),
              [](const Json& a, const Json& b) { return a["rank"] < b["rank"]; });
    report_["ranks"] = ranks;
    report_["trainer_ranks"] = trainer_stats;
    if (report_.value("transport", std::string()) == "ucx") {
      // Which memory path the ucx transport took (issue 5): "host-staged" when
      // any rank's device memory went through pinned host buffers, else
      // "cuda" when any rank's device memory was written directly, else "host".
      std::string path = "host";
      for (const Json* list : {&ranks, &trainer_stats}) {
        for (const Json& r : *list) {
          const std::string p = r.value("memory_path", std::string("host"));
          if (p == "host-staged" || (p == "cuda" && path == "host")) path = p;
        }
      }
      report_["ucx_memory_path"] = path;
    }
    report_["refits"].push_back(Json{{"version", v},
                                     {"bytes", total_bytes_},
                                     {"seconds", seconds},
                                     {"gbps", seconds > 0 ? static_cast<double>(total_bytes_) / seconds / 1e9 : 0.0},
                                     {"verified", verified}});
    return Status::Ok();
  }

  void log(const std::string& line) { std::fprintf(stderr, "refit coordinator: %s\n", line.c_str()); }

  CoordinatorOptions options_;
  // Accepts, authenticates and reads joins off this thread (join_gate.h).
  std::unique_ptr<JoinGate> gate_;
  std::vector<std::optional<Member>> trainers_, engines_;
  int joined_ = 0;
  std::vector<std::vector<TensorSpec>> streams_;
  std::uint64_t total_bytes_ = 0;
  std::uint64_t current_version_ = 0;
  std::uint64_t committed_version_ = 0;
  bool lost_ = false;  // a rank's connection was lost: no recovery
  bool all_verified_ = false;
  std::map<int, std::uint64_t> progress_bytes_;
  Clock::time_point go_time_{}, last_draw_{};
  Json report_;
};

}  // namespace

Status validate_rank_counts(int trainer_ranks, int engine_ranks) {
  if (trainer_ranks < 1 || engine_ranks < 1) {
    return FailedPrecondition("trainer_ranks (" + std::to_string(trainer_ranks) + ") and engine_ranks (" +
                              std::to_string(engine_ranks) + ") must be at least 1");
  }
  if (trainer_ranks < engine_ranks) {
    return FailedPrecondition("fewer trainer ranks (" + std::to_string(trainer_ranks) + ") than engine ranks (" +
                              std::to_string(engine_ranks) +
                              "): every engine rank needs at least one trainer rank to feed it");
  }
  return Status::Ok();
}

Json run_coordinator(const CoordinatorOptions& options, const std::function<void(int port)>& on_listening) {
  Coordinator coordinator(options);
  // Every message is validated before use (control_message.h), so no JSON
  // exception is expected; should one escape anyway, the job fails with a
  // report instead of the process terminating.
  try {
    return coordinator.run(on_listening);
  } catch (const std::exception& e) {
    return Json{{"verified", false}, {"refits", Json::array()}, {"error", "internal: coordinator: " + std::string(e.what())}};
  }
}

}  // namespace refit
