// Many engines (issue 18): a job of E engines, each of the same R engine
// ranks (TP). Engine 0 is fed by the trainer ranks (topology.h, unchanged);
// every other engine k is fed by its parent in the relay tree, rank r by
// rank r: parent(k) = (k - 1) / F with F = --relay-fanout (1, the default:
// a chain 0 -> 1 -> 2 ..., every link carries each byte once). A relaying
// rank forwards each bucket as it lands to the same rank of each child
// (runtime/relay_forwarder.h), so the trainers' links carry each byte once
// whatever E is.
//
// The coordinator numbers engine rank (k, r) as k * R + r: its member slot,
// its setup and its stats in the report.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "control/protocol.h"
#include "control/topology.h"
#include "refit/status.h"

namespace refit {

// The parent of engine `engine` (>= 1) in a relay tree of fanout `fanout` (>= 1).
std::uint64_t relay_parent(std::uint64_t engine, std::uint64_t fanout);

// Every engine k > 0's rank r agrees with engine 0's rank r (settings, plan
// digest, stream: kFailedPrecondition naming both ranks, the field and both
// values, or the first tensor that differs), and the job is one relays
// carry today (staged mode, host pools, no release between refits: else
// kFailedPrecondition naming the setting). Then `topology` (engine 0's, by
// plan_topology) grows to every engine: engine_setups[k * R + r] (a child's
// fed by its parent's relay feeder, protocol.h), each saying the job's
// engine count and its engine, each relaying rank's listing its children.
// `engines`: every engine rank's join, by k * R + r; `engine_ranks`: R;
// `slots`: --max-engines (>= the engines joined; engines may join later, so
// a job of one engine with more slots is checked for relays too, and every
// setup says `slots` as the job's engine count).
Status plan_relay(const std::vector<Join>& engines, int engine_ranks, std::uint64_t fanout, bool release_between_refits,
                  int slots, Topology& topology);

// Engine `other`'s ranks (by rank) agree with engine 0's (`first`), as
// plan_relay checks each engine: kFailedPrecondition naming both ranks, the
// field and both values (or the first tensor that differs). For an engine
// that joins the running job.
Status check_relay_engine(const std::vector<Join>& first, const std::vector<Join>& other, int slots);

// The parent of live engine `engine` in the tree of the live engines
// (`live[k]`): the i-th live engine's parent is the ((i - 1) / fanout)-th.
std::uint64_t live_relay_parent(const std::vector<bool>& live, std::uint64_t engine, std::uint64_t fanout);

// Engines dropped from the job or joined (`live[k]`): every engine rank's
// route in the tree of the live engines, by k * R + r: the i-th live
// engine's parent is the ((i - 1) / F)-th; the first live engine (the
// root) is fed by the trainer ranks, with the feeders of engine 0's setup
// (`setups`, by k * R + r as plan_relay left them); a dropped engine's
// route is empty.
std::vector<Route> relay_routes(const std::vector<Join>& engines, int engine_ranks, std::uint64_t fanout,
                                const std::vector<bool>& live, const std::vector<Setup>& setups);

}  // namespace refit
