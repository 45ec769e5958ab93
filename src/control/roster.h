// Roster: the coordinator's list of the ranks a job expects and of those
// that joined (coordinator.cc is its only user). It decides admission on the
// coordinator's thread: a join that does not fit the job (protocol, role,
// rank or engine out of range, a duplicate) is refused and told why; a
// rank's SetupFailed before every rank joined is kept as the setup's end.
//
// Members are numbered as the phase machine numbers them: trainer ranks
// 0..T-1, then engine ranks, engine k's rank r at T + k * R + r, for every
// engine slot (--max-engines M): engines [E, M) join the running job, so
// setup is complete once engines 0..E-1 joined.
//
// Thread safety: none; the coordinator's thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "control/control_message.h"
#include "control/protocol.h"
#include "net/link.h"
#include "refit/status.h"

namespace refit {

// One joined rank as the coordinator sees it.
struct Member {
  std::unique_ptr<Link> link;
  Join join;
  int engines = 1;      // the job's engine slots, for its name
  bool closed = false;  // its connection was lost (reported to the machine)
  std::string name() const;  // "trainer rank 1", "engine 2 rank 0" (topology.h join_name)
};

// Who a rank is: (role, engine, rank).
using RankKey = std::tuple<Role, std::uint64_t, int>;

class Roster {
 public:
  Roster(int trainer_ranks, int engine_ranks, int engines, int slots);

  int expected() const { return trainer_ranks_ + engine_ranks_ * engines_; }  // at setup
  int joined_count() const { return joined_; }
  bool complete() const { return joined_ == expected(); }

  // Decodes and checks one join and admits it. A join that does not fit is
  // refused (the peer is told, best effort) and the error says why
  // ("refused <peer>: ..."). A SetupFailed of this job's rank before every
  // rank joined is kept (setup_failure()). On admission returns the line
  // to log ("engine 1 rank 0 joined from ... (pid N)"); "" otherwise.
  StatusOr<std::string> admit(std::unique_ptr<Link> link, const Json& text);

  // A rank's own setup failure, once one reported it: the setup's error.
  const Status& setup_failure() const { return setup_failure_; }
  // The rank that reported it, if one did.
  const std::optional<RankKey>& failed_rank() const { return failed_rank_; }
  // Whether `join` is a rank of this job (check_join), for the latecomers.
  bool fits(const Join& join) const;

  // "trainer rank 1, engine 2 rank 0": every expected rank not joined.
  std::string missing() const;
  // Every joined member in the machine's numbering.
  std::vector<Member*> joined();
  // Every member slot in the machine's numbering, null where none joined.
  std::vector<Member*> slots();
  // Engine `engine`'s joined ranks (by rank), all of them or none.
  std::optional<std::vector<Join>> engine(std::uint64_t engine) const;
  // Engine `engine`'s slots are free again (a joiner refused before it was admitted).
  void free_engine(std::uint64_t engine);
  Member& trainer(int rank) { return *trainers_[static_cast<std::size_t>(rank)]; }
  Member& engine_rank(std::size_t index) { return *engine_slots_[index]; }  // k * R + r
  std::vector<Join> trainer_joins() const;
  std::vector<Join> engine_joins() const;  // the setup's engines' ranks, by k * R + r
  std::set<RankKey> joined_keys() const;
  static RankKey key(Role role, std::uint64_t engine, int rank) { return {role, engine, rank}; }

 private:
  Status take_setup_failure(const SetupFailed& failed, const std::string& peer);
  int trainer_ranks_, engine_ranks_, engines_, slots_;
  std::vector<std::optional<Member>> trainers_, engine_slots_;  // engine_slots_ by k * R + r
  int joined_ = 0;
  Status setup_failure_;
  std::optional<RankKey> failed_rank_;
};

// The first field of a trainer rank's join that a replacement process must
// share with the lost one (what its Setup and the plan were built from),
// or "" when they agree.
std::string join_difference(const Join& lost, const Join& replacement);

}  // namespace refit
