#include "refit/fault_hook.h"

#include <signal.h>

#include <charconv>

#include "refit/log.h"

namespace refit {

const char* protocol_step_name(ProtocolStep step) {
  switch (step) {
    case ProtocolStep::kStart: return "start";
    case ProtocolStep::kReady: return "ready";
    case ProtocolStep::kGo: return "go";
    case ProtocolStep::kSent: return "sent";
    case ProtocolStep::kDone: return "done";
    case ProtocolStep::kCommit: return "commit";
    case ProtocolStep::kCommitted: return "committed";
  }
  return "?";
}

StatusOr<FaultHook> parse_fault_hook(std::string_view text) {
  const std::string shown = "fault hook '" + std::string(text) + "'";
  const std::size_t first = text.find(':'), second = first == std::string_view::npos ? first : text.find(':', first + 1);
  if (second == std::string_view::npos) {
    return InvalidArgument(shown + ": expected STEP:VERSION:ACTION, as in commit:2:kill");
  }
  const std::string_view step = text.substr(0, first), version = text.substr(first + 1, second - first - 1),
                         action = text.substr(second + 1);
  FaultHook hook;
  bool known = false;
  std::string steps;
  for (int s = 0; s < kProtocolStepCount; ++s) {
    const auto candidate = static_cast<ProtocolStep>(s);
    steps += std::string(s == 0 ? "" : ", ") + protocol_step_name(candidate);
    if (step == protocol_step_name(candidate)) {
      hook.step = candidate;
      known = true;
    }
  }
  if (!known) return InvalidArgument(shown + ": unknown step '" + std::string(step) + "' (one of " + steps + ")");
  const auto parsed = std::from_chars(version.data(), version.data() + version.size(), hook.version);
  if (parsed.ec != std::errc() || parsed.ptr != version.data() + version.size() || hook.version == 0) {
    return InvalidArgument(shown + ": the version '" + std::string(version) + "' is not a refit version (1 or more)");
  }
  if (action == "kill") {
    hook.action = FaultAction::kKill;
  } else if (action == "stop") {
    hook.action = FaultAction::kStop;
  } else {
    return InvalidArgument(shown + ": unknown action '" + std::string(action) + "' (kill or stop)");
  }
  return hook;
}

std::string fault_hook_text(const FaultHook& hook) {
  return std::string(protocol_step_name(hook.step)) + ":" + std::to_string(hook.version) + ":" +
         (hook.action == FaultAction::kKill ? "kill" : "stop");
}

void fire_fault_hook(FaultHook& hook, ProtocolStep step, std::uint64_t version, const std::string& who) {
  if (hook.version == 0 || hook.step != step || hook.version != version) return;
  const std::string text = fault_hook_text(hook);
  const bool kill = hook.action == FaultAction::kKill;
  hook.version = 0;
  log(LogLevel::kWarning, who,
      std::string(kill ? "dying by SIGKILL" : "stopping by SIGSTOP") + " at step '" + protocol_step_name(step) +
          "' of refit " + std::to_string(version) + " (--debug-fault " + text + ")");
  ::raise(kill ? SIGKILL : SIGSTOP);
}

}  // namespace refit
