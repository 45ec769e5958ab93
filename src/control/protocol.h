// The control protocol: every message between the coordinator and the ranks
// (the authentication handshake's included), as one struct each.
//
// On the wire a message is one JSON object in a kControl frame
// (control_message.h): {"type": "<name>", <fields>}. This module is the only
// place that knows the names and fields: encode() writes a struct, the
// decode_* functions read one back after checking every field's kind and
// bounds. A decode error is kInvalidArgument naming the message type and the
// bad field ("'join' field 'rank': expected an integer in 0..1048576, got
// -1"). Unknown fields are ignored; an unknown type is refused.
//
// The protocol (one refit job, docs/DESIGN.md "Control plane"):
//
//   rank                          coordinator
//   auth_response          <->    auth_challenge, auth_ok | error   (auth.h)
//   join{protocol, ...}     ->                                      refused: error
//                          <-     setup
//   linked                  ->
//   [request | finish]      ->                                      on demand (trainers)
//                          <-     start(v)
//   ready(v)                ->
//                          <-     go(v)
//   progress(v), sent(v)    ->
//   done(v)                 ->    every rank done: commit decision, v committed
//                          <-     commit(v)
//   committed(v)            ->
//                          <-     release(v)        --release-between-refits: trainers
//   released(v, bytes)      ->                      first, then engines
//                          <-     acquire(v+1)      engines first: a new pool
//   acquired(v+1, descr)    ->
//                          <-     acquire(v+1, descriptors)  then the trainers
//   linked                  ->    (every rank) then start(v+1)
//   failed(v)               ->    a refit that fails before the decision:
//                          <-     abort(v), relink(v); then linked again
//                          <-     catch_up(v, k)    many engines: to the parent of a
//   sent(v)                 ->                      joining engine k, at a refit boundary
//                          <-     shutdown (the job's end; with an error
//                                 when it ended with one after a commit)
//   heartbeat              <->    heartbeat   (both ways, from setup on)
//
// Liveness: from the moment a rank has its setup until the job ends, each
// side sends a heartbeat every interval, and treats a peer it heard nothing
// from (no heartbeat, no other message) for the heartbeat deadline as lost,
// whatever the phase, idle included. A stopped process (SIGSTOP) sends
// nothing, so a stall is found as fast as a death. Between on-demand refits a
// trainer step may take hours: those waits have no fixed deadline, only this
// one (docs/RELIABILITY.md "Liveness").
//
// Thread safety: pure functions on values.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "control/amax_exchange.h"
#include "control/control_message.h"
#include "refit/model.h"
#include "refit/status.h"
#include "refit/tensor.h"

namespace refit {

// The version of this protocol. A rank sends it in its join; the coordinator
// refuses a rank of another version, naming both. Bump it whenever a message
// or a field changes meaning.
// Version 3 added heartbeat; version 4 setup_failed; version 5 sharded
// trainers (the join's layout, transfer_digest and feeds; the setup's parts
// and targets); version 6 shadow weights in direct mode (the engine's join
// says shadow, start says which arena the trainers write); version 7
// release between refits (setup's release; release, released, acquire,
// acquired) and the join's change (--change-fraction); version 8 the join's
// delta (--delta) with the data plane's credit base and encoded kLanded
// (net/frames.h); version 9 many engines (the join's engine, the setup's
// engines, engine and relay; issue 18); version 10 engines joining a running
// job (the join's catch_up, catch_up(v, engine)); version 11 partial
// refits (request's and start's only, ready's plan_digest, the join's
// partial; issue 22).
inline constexpr std::uint64_t kControlProtocolVersion = 11;

// How often a side sends a heartbeat, and how long it waits for a word from
// its peer before it treats the peer as lost (stalled, dead or cut off).
struct HeartbeatTiming {
  std::chrono::milliseconds interval{1000};
  std::chrono::milliseconds timeout{10000};
};
// The timing of `interval_s` and `timeout_s` seconds; kInvalidArgument
// naming `who`'s setting when the interval is not positive or the timeout
// is not above it.
StatusOr<HeartbeatTiming> heartbeat_timing(double interval_s, double timeout_s, const std::string& who);

// "I am alive"; sent both ways every HeartbeatTiming::interval. It carries
// nothing: any message from a peer proves it alive.
struct Heartbeat {};

enum class Role { kTrainer, kEngine };
const char* role_name(Role role);  // "trainer", "engine"

// ---- authentication (auth.h) -------------------------------------------------

struct AuthChallenge {
  std::uint64_t protocol = 0;  // the authentication protocol (auth.cc)
  std::string auth;            // "hmac-sha256" or "none"
  std::string nonce;           // hex; empty with "none"
};
struct AuthResponse {
  std::string auth;
  std::string nonce, mac;  // hex; empty with "none"
};
struct AuthOk {
  std::string mac;  // hex; empty when neither side has a secret
};
// A refusal, in either direction, at any point before setup.
struct Refusal {
  Status error;
};

// ---- sharded trainers (issue 19) -----------------------------------------------

// One (bucket, bytes) part a link writes: on the join, a bucket of the fed
// engine rank's plan and the bytes this trainer rank writes into it; on an
// engine's setup, the index of a feeder (into Setup::feeders) and its bytes.
struct Part {
  std::uint64_t index = 0;
  std::uint64_t bytes = 0;
  friend bool operator==(const Part&, const Part&) = default;
};
// A sharded trainer rank's join: one engine rank it writes into.
struct Feed {
  std::uint64_t engine_rank = 0;
  std::string plan_digest;  // its plan of that engine rank's stream
  std::vector<Part> parts;  // (bucket, bytes), ascending bucket, bytes > 0
  friend bool operator==(const Feed&, const Feed&) = default;
};
// A sharded trainer rank's setup: how to reach one engine rank it feeds. An
// engine rank's setup (`relay`): how to reach the same rank of an engine it
// relays to (`engine`: that engine's number; on the wire only when not 0).
struct EngineTarget {
  std::uint64_t engine_rank = 0;
  std::string address, descriptor, device = "cpu";
  std::uint64_t engine = 0;
  friend bool operator==(const EngineTarget&, const EngineTarget&) = default;
};

// The feeder id (Setup::feeders, the data link's hello) of engine `engine`
// relaying to the same rank of another engine: above every trainer rank.
inline constexpr std::uint64_t kRelayFeederBase = std::uint64_t{1} << 32;
inline std::uint64_t relay_feeder(std::uint64_t engine) { return kRelayFeederBase + engine; }
inline bool is_relay_feeder(std::uint64_t feeder) { return feeder >= kRelayFeederBase; }
// "trainer rank 3", or "engine 1 (relay)".
std::string feeder_name(std::uint64_t feeder);

// ---- rank -> coordinator -------------------------------------------------------

// The first message after authentication: who the rank is and the settings
// the coordinator checks across ranks. Fields after `transport` belong to
// one role (the other leaves them at their defaults).
struct Join {
  std::uint64_t protocol = kControlProtocolVersion;
  Role role = Role::kTrainer;
  int rank = 0;
  // Engine: the engine this rank belongs to (--engine; many engines, issue
  // 18). Absent on the wire: 0.
  std::uint64_t engine = 0;
  std::int64_t pid = 0;
  std::string device = "cpu";  // "cpu" or "cuda"
  std::string gpu;             // the GPU's UUID, "" when unknown or none
  std::string mode;            // "staged" or "direct"
  std::uint64_t trainer_ranks = 0, engine_ranks = 0;
  std::uint64_t bucket_size = 0;
  std::string transport;
  std::string plan_digest;
  // Trainer: the engine rank it feeds, and one tensor per dtype it sends.
  std::uint64_t engine_rank = 0;
  std::map<std::string, std::string> stream_dtypes;  // dtype name -> an example tensor
  // Engine: where trainers connect, its target's descriptor, its pool and
  // what it accepts.
  std::string data_address, descriptor;
  std::uint64_t pool_slots = 0, memory_limit = 0;
  std::vector<std::string> supported_dtypes;
  // Engine: its --quantize (quantize.h QuantizeSpec::ToString) and how many
  // of its weights that converts, for the report. Absent on the wire: none.
  std::string quantize = "none";
  std::uint64_t quantized_tensors = 0;
  // Either role with synthetic weights: --change-fraction as parts of 2^32
  // (content.h change_parts). Absent on the wire: every element (2^32).
  std::uint64_t change = std::uint64_t{1} << 32;
  // Either role: --delta (delta refits; every rank must agree). Absent on
  // the wire: false.
  bool delta = false;
  // Engine: it holds shadow weights (--shadow); in direct mode its exposed
  // memory is both arenas (shadow_arena_stride) and the trainers write the
  // one each start names. Absent on the wire: false.
  bool shadow = false;
  // Engine: its engine takes partial refits (Engine::takes_partial_refits).
  // Absent on the wire: false.
  bool partial = false;
  // Engine: it can read its committed weights back (EngineBinding::
  // read_committed), so it can send them to an engine that joins the
  // running job (catch_up). Absent on the wire: false.
  bool catch_up = false;
  // Engine: its stream. Trainer (optional): its plan of the stream of the
  // engine rank it feeds, so that a digest mismatch names the first tensor
  // that differs; empty: not sent.
  std::vector<TensorSpec> specs;
  // Optional: the shard rule that cut each tensor of `specs` out of its full
  // tensor (model.h), in stream order, so that a digest mismatch names the
  // rule on each side; empty: not sent (an engine bound to tensors without a
  // model, or a rank from before this field). On the wire: "rules", one rule
  // name per spec ("column", ...); another count or an unknown name is
  // refused.
  std::vector<ShardRule> rules;
  // Trainer: how the trainer ranks hold the weights (trainer_layout.h,
  // TrainerLayout::ToString: "full", "fsdp:4", ...). A sharded layout also
  // sends the transfer plan's digest and every engine rank it writes into
  // (`feeds`, ascending engine rank) in place of engine_rank / plan_digest.
  std::string layout = "full";
  std::string transfer_digest;
  std::vector<Feed> feeds;
};
// Setup done (every data link up), or after a relink the rank's state.
struct Linked {
  std::optional<std::uint64_t> version;  // after a relink: the rank's committed version
  std::optional<bool> weights_complete;  // engine, after a relink
};
// `plan_digest`: the digest (16 hex digits) of the plan this rank moves
// refit `version` by: the setup's, or a partial refit's subset plan
// (refit/partial.h). The coordinator compares each trainer rank's with the
// engine rank it feeds. Empty: a rank that plans no stream of its own (a
// sharded trainer rank).
struct Ready {
  std::uint64_t version = 0;
  std::string plan_digest;
};
struct Progress {
  std::uint64_t version = 0, bytes = 0;
};
struct Sent {
  std::uint64_t version = 0;
};
// The rank's share of refit `version` is complete: an engine applied (and,
// when `verified`, compared) every byte. `stats` goes into the report as is.
struct Done {
  std::uint64_t version = 0;
  bool verified = false;
  Json stats = Json::object();
  std::string memory_path;  // stats' "memory_path" ("" when absent)
};
struct Committed {
  std::uint64_t version = 0;
};
struct Failed {
  std::uint64_t version = 0;
  Status error;
};
// --release-between-refits, after release(version): what this rank freed
// (engine: the receive pool and any idle shadow arena, `bytes` as the device
// reports them returned, or the host bytes; trainer: its staging and
// mappings, 0 unless it measured device memory returned).
struct Released {
  std::uint64_t version = 0, bytes = 0;
};
// An engine rank's answer to acquire(version): its receive pool again, and
// the new pool's descriptor for the trainers that write into it.
struct Acquired {
  std::uint64_t version = 0;
  std::string descriptor;
};
struct Request {  // on demand: run refit `version` next
  std::uint64_t version = 0;
  std::vector<std::string> only;  // a partial refit's globs (canonical_scope); empty: every tensor
};
struct Finish {};  // on demand: this trainer rank asks for no more refits
// In place of a join: this rank failed its own setup before it could join
// (a bad setting, a model it cannot open, no device). The coordinator ends
// setup at once, naming the rank and `error`, so that no process waits out
// the setup deadline for a rank that will never come.
struct SetupFailed {
  std::uint64_t protocol = kControlProtocolVersion;
  Role role = Role::kTrainer;
  int rank = 0;
  std::int64_t pid = 0;
  Status error;
  std::uint64_t engine = 0;  // an engine rank's engine (absent on the wire: 0)
};

// Sharded trainers under --quantize, after go (control/amax_exchange.h):
// the partial amax of every block this trainer rank shares with another.
// On the wire: "entries": [[tensor, block, bits], ...].
struct AmaxShare {
  std::uint64_t version = 0;
  std::vector<AmaxEntry> entries;
};

using RankMessage = std::variant<Join, Linked, Ready, Progress, Sent, Done, Committed, Failed, Request, Finish,
                                 Heartbeat, SetupFailed, AmaxShare, Released, Acquired>;

// ---- coordinator -> rank -------------------------------------------------------

struct Setup {
  std::uint64_t seed = 0;
  // Engine: the trainer ranks that feed it (trainer-index order) and every
  // engine rank's stream as the coordinator validated them.
  std::vector<std::uint64_t> feeders;
  std::vector<std::vector<TensorSpec>> streams;
  // Trainer: the engine rank it feeds and how to reach it, its index among
  // that engine rank's feeders and their count.
  std::uint64_t engine_rank = 0;
  std::string engine_address, descriptor, engine_device = "cpu";
  std::uint64_t trainer_index = 0, feeder_count = 0;
  bool on_demand = false;
  // Sharded trainers. Engine: per bucket of its plan, the feeders that
  // write a part of it (index into `feeders`, bytes), ascending; empty:
  // bucket j comes whole from feeder j % feeders. Trainer: every engine rank
  // it feeds (its feeds, in order), in place of engine_rank .. feeder_count.
  std::vector<std::vector<Part>> parts;
  std::vector<EngineTarget> targets;
  // --release-between-refits: after each commit the coordinator sends
  // release, before the next start acquire. Absent on the wire: false.
  bool release_between_refits = false;
  // Many engines (issue 18). Engine: the job's engine count and this rank's
  // engine (absent on the wire: 1 and 0), and the same rank of every engine
  // it relays each landed bucket to (relay_topology.h); an engine other
  // than 0 is fed by one relay feeder (relay_feeder(parent)) in `feeders`.
  std::uint64_t engines = 1, engine = 0;
  std::vector<EngineTarget> relay;
};
struct Start {
  std::uint64_t version = 0;
  // Direct mode over shadow weights: the arena the trainers write (0 or 1,
  // the one not served; shadow_arena_stride apart). Absent on the wire: 0.
  std::uint64_t arena = 0;
  // A partial refit: the globs of the tensors it moves (canonical, refit/
  // partial.h); empty (absent on the wire): every tensor.
  std::vector<std::string> only;
};
struct Go {
  std::uint64_t version = 0;
};
struct Commit {
  std::uint64_t version = 0;
};
// Refit `version` failed before its commit decision; nothing of it counts.
struct Abort {
  std::uint64_t version = 0;
  Status error;
};
// Many engines: an engine rank's place in the relay tree once the tree
// changed (an engine dropped or joined; relay_topology.h): its feeders and
// relay targets, as in its Setup. A trainer rank's, once the engine the
// trainers fed was dropped: `targets`, the engine rank it feeds from now on
// (the new root's rank; its address and pool descriptor; a sharded trainer
// rank: every engine rank it feeds), feeders and relay empty. The new
// root's engine ranks get the trainer ranks as feeders and, from sharded
// trainers, `parts` as in engine 0's Setup.
struct Route {
  std::vector<std::uint64_t> feeders;
  std::vector<EngineTarget> relay;
  std::vector<EngineTarget> targets;
  std::vector<std::vector<Part>> parts;
  friend bool operator==(const Route&, const Route&) = default;
};
// After an abort: reconnect the data links and say linked again. Many
// engines: also, to the engine ranks only and with no abort before it, once
// an engine was dropped between refits. `route`: this rank's new place in
// the relay tree (absent: the links as before).
struct Relink {
  std::uint64_t version = 0;
  std::optional<Route> route;
};
// Many engines, an engine joining the running job: to the ranks of its
// parent in the relay tree (which linked to it with the relink before),
// send committed version `version`, read from the weights served, to the
// same rank of engine `engine` only, as a relay sends a refit's buckets;
// answer sent(version) once it has every bucket (or failed(version)). The
// joining engine meanwhile runs start(version), go, commit as a refit.
struct CatchUp {
  std::uint64_t version = 0;
  std::uint64_t engine = 0;
};
// --release-between-refits, once every rank committed `version`: free what
// the next refit will allocate again (trainers first, then engines), answer
// released.
struct Release {
  std::uint64_t version = 0;
};
// Before refit `version` (after a release): to the engine ranks, allocate
// the receive pool again and answer acquired; then to the trainer ranks with
// every engine rank's new descriptor (by engine rank), to open and link as
// at setup. Every rank then says linked, and start(version) follows.
struct Acquire {
  std::uint64_t version = 0;
  std::vector<std::string> descriptors;  // empty for the engine ranks
};
// The job is over. `error`: it ended with an error after refit
// `committed_version` was committed (a rank lost or stalled since); the
// ranks keep that version and exit with the error.
struct Shutdown {
  std::optional<Status> error;
  std::uint64_t committed_version = 0;
};

// To every trainer rank once each shared: the combined amax of every block
// any trainer rank shared (combine_amax), as AmaxShare's entries.
struct AmaxTable {
  std::uint64_t version = 0;
  std::vector<AmaxEntry> entries;
};

using CoordinatorMessage =
    std::variant<Setup, Start, Go, Commit, Abort, Relink, Shutdown, Refusal, Heartbeat, AmaxTable, Release, Acquire,
                 CatchUp>;
using AuthMessage = std::variant<AuthChallenge, AuthResponse, AuthOk, Refusal>;

// ---- encode / decode -----------------------------------------------------------

Json encode(const RankMessage& message);
Json encode(const CoordinatorMessage& message);
Json encode(const AuthMessage& message);

StatusOr<RankMessage> decode_rank_message(const Json& message);
StatusOr<CoordinatorMessage> decode_coordinator_message(const Json& message);
StatusOr<AuthMessage> decode_auth_message(const Json& message);

// The wire name of a message ("join", "commit", ...).
std::string message_name(const RankMessage& message);
std::string message_name(const CoordinatorMessage& message);
std::string message_name(const AuthMessage& message);

// Checks `message` against the schema of its type: an object with a string
// "type" (at most 64 bytes); each known field, when present, has the right
// JSON kind and is within its bounds; required fields are present. Unknown
// types and fields pass (decode_* refuses an unknown type).
Status validate_control_message(const Json& message);

// Status <-> JSON {"code": "...", "message": "..."}; status_from_json never
// throws: a malformed status becomes kInternal saying so.
Json status_to_json(const Status& status);
Status status_from_json(const Json& json);

// ---- on a Link -----------------------------------------------------------------

// Sends one message as a control frame.
Status send_message(Link& link, const RankMessage& message, Deadline deadline);
Status send_message(Link& link, const CoordinatorMessage& message, Deadline deadline);
Status send_message(Link& link, const AuthMessage& message, Deadline deadline);
// Receives and decodes one message (recv_control's bounds); errors name the
// peer.
StatusOr<RankMessage> recv_rank_message(Link& link, Deadline deadline);
StatusOr<CoordinatorMessage> recv_coordinator_message(Link& link, Deadline deadline);
StatusOr<AuthMessage> recv_auth_message(Link& link, Deadline deadline, std::uint64_t max_bytes);

}  // namespace refit
