// Settings every rank checks on its own before it joins (DESIGN.md rule 10:
// unsupported configurations fail at setup with a message naming the setting).
#include <functional>

#include "cuda/device.h"
#include "transport/transport.h"
#include "refit/content.h"
#include "refit/roles.h"

namespace refit {
namespace {

// The transports of this build whose capabilities satisfy `has`, as
// "cuda_ipc, nccl" ("none in this build" when none do): errors list the
// choices from the registry, never from a hard-coded list.
std::string transports_with(const std::function<bool(const TransportCapabilities&)>& has) {
  std::string out;
  for (const std::string& name : transport_names()) {
    auto transport = make_transport(name);
    if (!transport.ok() || !has((*transport)->capabilities())) continue;
    out += (out.empty() ? "" : ", ") + name;
  }
  return out.empty() ? "none in this build" : out;
}

// --delta (issue 22): staged; host weights into host pools over a
// transport the host pack path uses (shm, tcp) or one that writes remotely
// (ucx); device weights into device pools through mapped slots (cuda_ipc)
// or remote writes (ucx, nccl); full-weight trainers. Under --quantize the
// buckets hold the FP8 codes and scales, encoded like any bytes. Each
// refusal names the setting.
Status check_delta_settings(const RankOptions& o, const TransportCapabilities& caps, const std::string& who) {
  if (!o.delta) return Status::Ok();
  auto refuse = [&](const std::string& what) {
    return FailedPrecondition(who + ": --delta is not built " + what + " yet (--mode staged; --device cpu over "
                              "--transport shm, tcp or ucx, or --device cuda over cuda_ipc, ucx or nccl; "
                              "--trainer-layout full)");
  };
  if (o.mode != "staged") return refuse("for --mode " + o.mode);
  if (o.device == "cpu" && !caps.host_memory) return refuse("over --transport " + o.transport);
  if (o.device == "cuda" && o.transport != "cuda_ipc" && !caps.remote_write) {
    return refuse("for --device cuda over --transport " + o.transport);
  }
  if (o.trainer_layout != "full") return refuse("for --trainer-layout " + o.trainer_layout);
  return Status::Ok();
}

}  // namespace

Status validate_rank_settings(const RankOptions& o, bool engine) {
  const std::string who = std::string(engine ? "engine" : "trainer") + " rank " + std::to_string(o.rank);
  if (o.device != "cpu" && o.device != "cuda") {
    return InvalidArgument(who + ": --device " + o.device + " is not one of cpu, cuda");
  }
  if (o.mode != "staged" && o.mode != "direct") {
    return InvalidArgument(who + ": --mode " + o.mode + " is not one of staged, direct");
  }
  if (Status change = change_parts(o.change_fraction).status(); !change.ok()) {
    return Status(change.code(), who + ": " + change.message());
  }
  ASSIGN_OR_RETURN(auto transport, make_transport(o.transport));
  const TransportCapabilities caps = transport->capabilities();
  RETURN_IF_ERROR(check_delta_settings(o, caps, who));
  if (caps.one_initiator && o.trainer_ranks != o.engine_ranks) {
    return FailedPrecondition(who + ": --transport " + o.transport +
                              " feeds each engine rank from exactly one trainer rank, so --trainer-ranks " +
                              std::to_string(o.trainer_ranks) + " must equal --engine-ranks " +
                              std::to_string(o.engine_ranks));
  }
  // Without a usable GPU nothing below matters: refuse --device cuda here,
  // before any rank allocates, joins or measures (no figures follow).
  if (o.device == "cuda") {
    if (Status usable = require_cuda_device(); !usable.ok()) {
      return Status(usable.code(), who + ": --device cuda: " + usable.message());
    }
  }
  if (o.device == "cuda" && !caps.device_memory) {
    return FailedPrecondition(who + ": --device cuda needs a transport that moves device memory (" +
                              transports_with([](const TransportCapabilities& c) { return c.device_memory; }) +
                              "); --transport " + o.transport + " moves host memory");
  }
  // A trainer with host weights may feed device engines (pinned copies into
  // mapped slots), except through a transport that sends from the trainer's
  // own buffers and only from device memory (nccl).
  if (o.device == "cpu" && !caps.host_memory && (engine || caps.remote_write)) {
    return FailedPrecondition(who + ": --transport " + o.transport + " moves device memory only (" +
                              (engine ? "into the engine's" : "from the trainer's") +
                              " weights), but --device cpu keeps them in host memory; use --device cuda");
  }
  if (o.mode == "direct" && !caps.direct) {
    return FailedPrecondition(who + ": --mode direct needs a transport that can expose the engine's weights (" +
                              transports_with([](const TransportCapabilities& c) { return c.direct; }) +
                              "); --transport " + o.transport + " cannot");
  }
  return Status::Ok();
}

}  // namespace refit
