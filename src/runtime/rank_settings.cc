// Settings every rank checks on its own before it joins (DESIGN.md rule 10:
// unsupported configurations fail at setup with a message naming the setting).
#include "refit/transport.h"
#include "runtime/roles.h"

namespace refit {

Status validate_rank_settings(const RankOptions& o, bool engine) {
  const std::string who = std::string(engine ? "engine" : "trainer") + " rank " + std::to_string(o.rank);
  if (o.device != "cpu" && o.device != "cuda") {
    return InvalidArgument(who + ": --device " + o.device + " is not one of cpu, cuda");
  }
  if (o.mode != "staged" && o.mode != "direct") {
    return InvalidArgument(who + ": --mode " + o.mode + " is not one of staged, direct");
  }
  ASSIGN_OR_RETURN(auto transport, make_transport(o.transport));
  const TransportCapabilities caps = transport->capabilities();
  if (o.device == "cuda" && !caps.device_memory) {
    return FailedPrecondition(who + ": --device cuda needs a transport that moves device memory (cuda_ipc); --transport " +
                              o.transport + " moves host memory");
  }
  // A trainer with host weights may feed device engines (pinned copies).
  if (engine && o.device == "cpu" && !caps.host_memory) {
    return FailedPrecondition(who + ": --transport " + o.transport + " moves device memory only; use --device cuda");
  }
  if (o.mode == "direct" && !caps.direct) {
    return FailedPrecondition(who + ": --mode direct needs a transport that can expose the engine's weights (cuda_ipc); --transport " +
                              o.transport + " cannot");
  }
  return Status::Ok();
}

}  // namespace refit
