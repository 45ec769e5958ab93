// Fault injection for tests: a role (a trainer rank, an engine rank, the
// coordinator) kills itself (SIGKILL) or stops itself (SIGSTOP) when it
// reaches one step of the control protocol in one refit, as a crash or a
// stall at that moment would (docs/RELIABILITY.md, "Faults by protocol
// step"). Written `STEP:VERSION:ACTION` on the command line
// (`--debug-fault commit:2:kill`).
//
// Where each step's hook fires, in refit v (the control protocol:
// src/control/protocol.h). A rank fires on a message it receives before it
// acts on it, and on one it sends before sending it; the coordinator fires
// on its first receipt of a message from any rank, before counting it.
//
//   step       trainer or engine rank            coordinator
//   start      start(v) received                 before start(v) goes out
//   ready      before ready(v) goes out          first ready(v) received
//   go         go(v) received                    before go(v) goes out
//   sent       before sent(v) goes out           first sent(v) received
//   done       before done(v) goes out           first done(v) received
//   commit     commit(v) received, not applied   the commit decision made and
//                                                recorded (the report file
//                                                written), before commit(v)
//                                                goes out
//   committed  commit applied, before            first committed(v) received
//              committed(v) goes out
//
// The hook logs one line ("dying by SIGKILL at step 'commit' of refit 2
// (--debug-fault commit:2:kill)") before the signal, so a test waits for
// that line instead of sleeping. It fires once.
//
// Thread safety: a FaultHook is a value; fire_fault_hook() is called by
// the thread that reaches the step.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "refit/status.h"

namespace refit {

enum class ProtocolStep { kStart, kReady, kGo, kSent, kDone, kCommit, kCommitted };
inline constexpr int kProtocolStepCount = 7;
// "start", "ready", "go", "sent", "done", "commit", "committed".
const char* protocol_step_name(ProtocolStep step);

enum class FaultAction { kKill, kStop };  // SIGKILL, SIGSTOP

struct FaultHook {
  ProtocolStep step = ProtocolStep::kStart;
  // The refit it fires in; 0: none (the hook is off, or has fired).
  std::uint64_t version = 0;
  FaultAction action = FaultAction::kKill;
};

// Parses "STEP:VERSION:ACTION" ("commit:2:kill", "go:3:stop"); an error
// names the part that is wrong and what it may be.
StatusOr<FaultHook> parse_fault_hook(std::string_view text);
// The text parse_fault_hook() reads back ("commit:2:kill").
std::string fault_hook_text(const FaultHook& hook);

// When `hook` names `step` of refit `version`: disarms it, logs the line
// as `who` and raises the signal (SIGKILL does not return; SIGSTOP returns
// once the process is continued). Otherwise does nothing.
void fire_fault_hook(FaultHook& hook, ProtocolStep step, std::uint64_t version, const std::string& who);

}  // namespace refit
