// The `refit` command line refuses a bad number, version or path in words a
// user can act on (issue 16: "Value 0 not in range 0.000000 to
// 1797693...", a symbolic link loop reported as "internal", a push whose
// versions wrapped past the largest to 0), and a usage error still exits 2.
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "control/control_message.h"
#include "process_harness.h"
#include "refit/plan.h"

namespace refit {
namespace {

using testing::RunResult;
using testing::run_refit;

// `refit push` with a coordinator nobody runs: it must be refused before it
// dials.
RunResult push(const std::vector<std::string>& flags) {
  std::vector<std::string> args = {"push", "model.safetensors", "--coordinator", "127.0.0.1:1"};
  args.insert(args.end(), flags.begin(), flags.end());
  return run_refit(args, 30);
}

void expect_usage_error(const RunResult& r, const std::string& text) {
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find(text), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("not in range"), std::string::npos) << r.err;
}

// Catches: CLI11's PositiveNumber / NonNegativeNumber (doubles) back on a
// version or a count. Mutation tried: --version checked with
// CLI::PositiveNumber again (push.cc): "Value 0 not in range 0.000000 to
// 1797693..." and this test fails.
TEST(CliText, AVersionOrACountOutOfRangeSaysWhatItIs) {
  expect_usage_error(push({"--version", "0"}), "--version: 0 is not a version (versions start at 1)");
  expect_usage_error(push({"--version", "-1"}), "--version: -1 is not a version (versions start at 1)");
  expect_usage_error(push({"--version", "abc"}), "--version: abc is not a version (versions are whole numbers");
  expect_usage_error(push({"--version", "18446744073709551616"}),
                     "is not a version (the largest is 18446744073709551615)");
  expect_usage_error(push({"--repeat", "0"}), "--repeat: 0 is not a repeat count (counts start at 1)");
  expect_usage_error(push({"--ranks", "0"}), "--ranks: 0 is not a count of ranks");
  expect_usage_error(push({"--timeout", "0"}), "--timeout: 0 is not a duration (seconds, more than 0)");
  expect_usage_error(run_refit({"coordinator", "--refits", "-1"}, 30),
                     "--refits: -1 is not a count of refits (counts start at 0)");
  expect_usage_error(run_refit({"trainer", "--coordinator", "127.0.0.1:1", "--rank", "-1"}, 30),
                     "--rank: -1 is not a rank (ranks start at 0)");
}

// `refit push` takes its checkpoint as a positional path: a path it cannot
// open is named without a flag push does not have (issue 17: "no error
// suggests a flag the command does not have"). Catches: the model chooser's
// old "--model 'X' is not a preset" text.
TEST(CliText, APushOfAMissingCheckpointNamesThePathNotAFlagItLacks) {
  const RunResult r = push({});
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("'model.safetensors' is not a preset"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("--model"), std::string::npos) << r.err;
}

// Catches: a malformed fault hook accepted (a fault test would then inject
// nothing and pass) or refused as a runtime error instead of a usage one.
TEST(CliText, AMalformedFaultHookIsAUsageErrorNamingThePart) {
  expect_usage_error(run_refit({"engine", "--coordinator", "127.0.0.1:1", "--debug-fault", "comit:2:kill"}, 30),
                     "unknown step 'comit' (one of start, ready, go, sent, done, commit, committed)");
  expect_usage_error(run_refit({"trainer", "--coordinator", "127.0.0.1:1", "--debug-fault", "go:0:stop"}, 30),
                     "the version '0' is not a refit version");
  expect_usage_error(run_refit({"coordinator", "--debug-fault", "done:2:crash"}, 30), "unknown action 'crash'");
}

// Catches: versions version .. version + repeat - 1 computed in uint64 and
// wrapping to 0 (the push then asked for version 0). Mutation tried: the
// check in push.cc's check_ranks removed: the push gets past the parse
// (exit 1, it cannot reach the coordinator) and this test fails.
TEST(CliText, APushWhoseVersionsPassTheLargestIsRefusedAtParse) {
  expect_usage_error(push({"--version", "18446744073709551615", "--repeat", "2"}),
                     "--version 18446744073709551615 with --repeat 2 would push versions past the largest");
  // The largest version itself, once, is a version.
  RunResult last = push({"--version", "18446744073709551615"});
  EXPECT_NE(last.exit_code, 2) << last.err;
}

// Catches: a receive pool or bucket size that every rank would refuse at
// setup passing the parser (issue 17: --pool-slots 1, --bucket-size 0 and
// --memory-limit 1MiB each printed their error 6-8 times from the job's
// processes). Mutation tried: CLI::Range(1, 64) back on --pool-slots with
// the BucketSize check left off --bucket-size: the demo exits 1 after
// starting the job and this test fails.
TEST(CliText, APoolOrBucketEveryRankWouldRefuseIsAUsageError) {
  for (const char* command : {"demo", "bench"}) {
    auto run = [&](std::vector<std::string> flags) {
      flags.insert(flags.begin(), command);
      return run_refit(flags, 60);
    };
    expect_usage_error(run({"--pool-slots", "1"}), "--pool-slots: 1 is not a count of pool slots");
    expect_usage_error(run({"--pool-slots", "65"}), "the largest is 64");
    expect_usage_error(run({"--bucket-size", "0"}), "--bucket-size: 0 is not a bucket size (at least 4KiB");
    expect_usage_error(run({"--bucket-size", "5000"}), "5000 is not a bucket size");
    expect_usage_error(run({"--memory-limit", "1MiB", "--pool-slots", "2", "--bucket-size", "4MiB"}),
                       "--memory-limit: 1MiB cannot hold the receive pool: --pool-slots 2 x --bucket-size 4MiB = 8MiB");
    expect_usage_error(run({"--memory-limit", "11MiB", "--pool-slots", "4", "--bucket-size", "3MiB"}),
                       "--memory-limit: 11MiB cannot hold the receive pool: --pool-slots 4 x --bucket-size 3MiB");
  }
  // The largest bucket is the control protocol's bound: one byte-alignment
  // step beyond it is refused.
  expect_usage_error(run_refit({"demo", "--bucket-size", std::to_string(kMaxBucketSize + kPlanAlignment)}, 60),
                     "at most 256TiB");
  expect_usage_error(run_refit({"demo", "--mode", "direct", "--memory-limit", "7MiB", "--bucket-size", "4MiB"}, 60),
                     "2 slots (direct mode)");
  // A rank's bucket size too (each rank's make_plan would refuse it).
  expect_usage_error(run_refit({"engine", "--coordinator", "127.0.0.1:1", "--rank", "0", "--bucket-size", "0"}, 30),
                     "--bucket-size: 0 is not a bucket size");
}

// Catches: push refusing --bucket-timeout (the README's flag of every role
// that runs ranks), a push transport refusal that names a flag push does
// not have ("use --device cuda"), and one that offers GPU engines shm or
// tcp (the old "into host or GPU engines" after the whole list; mutation:
// check_transport's `gpu` list taken as `usable`).
TEST(CliText, PushTakesBucketTimeoutAndRefusesOnlyWithItsOwnFlags) {
  EXPECT_NE(push({"--bucket-timeout", "5", "--setup-timeout", "1"}).exit_code, 2);
  expect_usage_error(push({"--bucket-timeout", "0"}), "--bucket-timeout: 0 is not a duration");
  const RunResult help = run_refit({"push", "--help"}, 30);
  const std::size_t transports = help.out.find("--transport TEXT:{");
  ASSERT_NE(transports, std::string::npos) << help.out;
  if (help.out.substr(transports, help.out.find('}', transports) - transports).find("nccl") == std::string::npos) {
    GTEST_SKIP() << "this build has no nccl transport";
  }
  const RunResult nccl = push({"--transport", "nccl"});
  expect_usage_error(nccl, "--transport: nccl sends only from GPU memory");
  EXPECT_NE(nccl.err.find("refit push sends over shm, tcp"), std::string::npos) << nccl.err;
  EXPECT_NE(nccl.err.find("into host engines (cpu) over shm, tcp"), std::string::npos) << nccl.err;
  const std::size_t gpu = nccl.err.find("into GPU engines (cuda) over ");
  ASSERT_NE(gpu, std::string::npos) << nccl.err;
  const std::string gpu_part = nccl.err.substr(gpu, nccl.err.find('\n', gpu) - gpu);
  EXPECT_EQ(gpu_part.find("shm"), std::string::npos) << gpu_part;
  EXPECT_EQ(gpu_part.find("tcp"), std::string::npos) << gpu_part;
  // The one --device named is the engines' (a flag of `refit engine`).
  const std::string engines = "the engines' --device";
  const std::size_t at = nccl.err.find(engines);
  ASSERT_NE(at, std::string::npos) << nccl.err;
  EXPECT_EQ(nccl.err.find("--device"), at + engines.size() - std::string("--device").size()) << nccl.err;
  EXPECT_EQ(nccl.err.find("--device", at + engines.size()), std::string::npos) << nccl.err;
}

// Catches: the coordinator's --no-progress gone (the terminal default
// could then not be turned off: exit 2), and --help hiding the default.
TEST(CliText, TheCoordinatorsProgressIsOnAtATerminalUnlessTurnedOff) {
  const RunResult help = run_refit({"coordinator", "--help"}, 30);
  EXPECT_NE(help.out.find("(default: when stderr is a terminal)"), std::string::npos) << help.out;
  for (const char* flag : {"--progress", "--no-progress"}) {
    const RunResult r = run_refit({"coordinator", flag, "--setup-timeout", "0.2"}, 30);
    EXPECT_EQ(r.exit_code, 1) << flag << "\n" << r.err;  // parsed, then setup timed out
    EXPECT_NE(r.err.find("setup timed out"), std::string::npos) << flag << "\n" << r.err;
  }
}

// Catches: ErrnoStatus mapping ELOOP to internal. Mutation tried: the ELOOP
// case removed from ErrnoStatus (src/core/status.cc): "internal: ...".
TEST(CliText, ASymlinkLoopIsNamedAsAnInvalidArgument) {
  char dir[] = "/tmp/refit-cli-text-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string loop = std::string(dir) + "/loop";
  ASSERT_EQ(::symlink(loop.c_str(), loop.c_str()), 0) << std::strerror(errno);

  RunResult checkpoint = run_refit({"push", loop, "--coordinator", "127.0.0.1:1"}, 30);
  RunResult secret = run_refit({"push", "model.safetensors", "--coordinator", "127.0.0.1:1", "--secret-file", loop}, 30);
  ::unlink(loop.c_str());
  ::rmdir(dir);
  for (const RunResult& r : {checkpoint, secret}) {
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("invalid_argument"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(loop), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("Too many levels of symbolic links"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("internal"), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace refit
