#include "refit/fault_hook.h"

#include <gtest/gtest.h>

#include "testing/status_matchers.h"

namespace refit {
namespace {

// Catches: a parser that drops or swaps a part (the text would not round-trip).
TEST(FaultHook, ParsesEveryStepAndActionAndWritesTheSameText) {
  for (int s = 0; s < kProtocolStepCount; ++s) {
    for (const char* action : {"kill", "stop"}) {
      const std::string text = std::string(protocol_step_name(static_cast<ProtocolStep>(s))) + ":7:" + action;
      ASSERT_OK_AND_ASSIGN(FaultHook hook, parse_fault_hook(text));
      EXPECT_EQ(hook.step, static_cast<ProtocolStep>(s));
      EXPECT_EQ(hook.version, 7u);
      EXPECT_EQ(fault_hook_text(hook), text);
    }
  }
}

// Catches: a malformed hook accepted silently (a test that would then
// inject nothing and pass).
TEST(FaultHook, RefusesMalformedTextNamingThePart) {
  const std::pair<const char*, const char*> cases[] = {
      {"commit", "expected STEP:VERSION:ACTION"},   {"comit:2:kill", "unknown step 'comit'"},
      {"commit:0:kill", "the version '0'"},         {"commit:x:kill", "the version 'x'"},
      {"commit:2:crash", "unknown action 'crash'"}, {"commit:2", "expected STEP:VERSION:ACTION"},
  };
  for (const auto& [text, expected] : cases) {
    auto hook = parse_fault_hook(text);
    ASSERT_FALSE(hook.ok()) << text;
    EXPECT_NE(hook.status().message().find(expected), std::string::npos) << hook.status().message();
  }
}

// Catches: a hook that fires at another step or version (it would stop
// this test's process).
TEST(FaultHook, DoesNothingAtOtherStepsOrVersions) {
  FaultHook hook{ProtocolStep::kCommit, 2, FaultAction::kKill};
  fire_fault_hook(hook, ProtocolStep::kDone, 2, "test");
  fire_fault_hook(hook, ProtocolStep::kCommit, 3, "test");
  EXPECT_EQ(hook.version, 2u);
}

}  // namespace
}  // namespace refit
