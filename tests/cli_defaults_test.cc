// `refit <command> --help` shows every default, and each one is the
// library's: the options structs (RankOptions, EngineOptions in
// runtime/roles.h, CoordinatorOptions in control/coordinator.h) hold the
// defaults once, and the CLI registers its flags on default-constructed
// structs. Python's side: python/tests/defaults_test.py.
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "refit/coordinator.h"
#include "process_harness.h"
#include "refit/plan.h"
#include "refit/roles.h"

namespace refit {
namespace {

// The default --help shows for `flag` ("--bucket-size SIZE=4MiB" -> "4MiB"),
// or "<none>" when the flag shows none, or "<missing>" when it is absent.
std::string help_default(const std::string& help, const std::string& flag) {
  std::istringstream lines(help);
  for (std::string line; std::getline(lines, line);) {
    const auto start = line.find_first_not_of(' ');
    if (start == std::string::npos || line.compare(start, flag.size() + 1, flag + " ") != 0) continue;
    std::string column = line.substr(start);
    column = column.substr(0, column.find("  "));  // the option column ends at the description
    const auto eq = column.rfind('=');
    return eq == std::string::npos ? "<none>" : column.substr(eq + 1);
  }
  return "<missing>";
}

std::string help_of(const std::string& command) {
  testing::RunResult r = testing::run_refit({command, "--help"}, 30);
  EXPECT_EQ(r.exit_code, 0) << command << ": " << r.err;
  return r.out;
}

// How --help shows a pool slot count: "auto" for kAutoPoolSlots.
std::string slots_text(int slots) { return slots == kAutoPoolSlots ? "auto" : std::to_string(slots); }

std::string number(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// Catches: a literal default in the CLI that differs from the struct's (the
// CLI's bucket size was 4 MiB while RankOptions said 64 MiB; demo, bench,
// push and inspect carried copies of it), and a flag whose --help shows no
// default.
TEST(CliDefaults, EveryCommandShowsTheStructsBucketSize) {
  const RankOptions rank;
  for (const char* command : {"trainer", "engine", "save", "demo", "bench", "push", "inspect"}) {
    const std::string shown = help_default(help_of(command), "--bucket-size");
    if (shown == "auto") {
      EXPECT_EQ(rank.bucket_size, kAutoBucketSize) << command << " --help shows auto";
      continue;
    }
    auto parsed = parse_byte_size(shown);
    ASSERT_TRUE(parsed.ok()) << command << " --help shows bucket size '" << shown << "'";
    EXPECT_EQ(*parsed, rank.bucket_size) << command << " --help shows " << shown;
  }
}

// Catches: any rank, engine or coordinator flag whose shown default is not
// the struct's field (a copied literal, a flag registered on a struct that
// was changed first).
TEST(CliDefaults, RoleFlagsShowTheStructsDefaults) {
  const EngineOptions e;
  const CoordinatorOptions c;
  const std::map<std::string, std::map<std::string, std::string>> expected = {
      {"trainer",
       {{"--trainer-ranks", std::to_string(e.trainer_ranks)}, {"--engine-ranks", std::to_string(e.engine_ranks)},
        {"--model", e.model}, {"--layers", std::to_string(e.layers)}, {"--transport", e.transport},
        {"--setup-timeout", number(e.setup_timeout_s)}, {"--timeout", number(e.refit_timeout_s)},
        {"--bucket-timeout", number(e.bucket_timeout_s)}, {"--device", e.device}, {"--mode", e.mode},
        {"--gpu", std::to_string(e.gpu)}}},
      {"engine",
       {{"--pool-slots", slots_text(e.pool_slots)}, {"--memory-limit", std::to_string(e.memory_limit)},
        {"--listen-host", e.listen_host}, {"--base-gpu-id", std::to_string(e.base_gpu_id)},
        {"--setup-timeout", number(e.setup_timeout_s)}, {"--bucket-timeout", number(e.bucket_timeout_s)}}},
      {"coordinator",
       {{"--listen", c.listen}, {"--trainer-ranks", std::to_string(c.trainer_ranks)},
        {"--engine-ranks", std::to_string(c.engine_ranks)}, {"--refits", std::to_string(c.refits)},
        {"--seed", std::to_string(c.seed)}, {"--setup-timeout", number(c.setup_timeout_s)},
        {"--timeout", number(c.refit_timeout_s)}}},
      {"demo",
       {{"--pool-slots", slots_text(e.pool_slots)}, {"--transport", e.transport}, {"--device", e.device},
        {"--mode", e.mode}, {"--setup-timeout", number(e.setup_timeout_s)}, {"--timeout", number(e.refit_timeout_s)}}},
      {"push", {{"--timeout", number(e.refit_timeout_s)}, {"--mode", e.mode}, {"--transport", e.transport}}},
  };
  for (const auto& [command, flags] : expected) {
    const std::string help = help_of(command);
    for (const auto& [flag, value] : flags) {
      EXPECT_EQ(help_default(help, flag), value) << "refit " << command << " " << flag << " in:\n" << help;
    }
  }
}

// One option of a --help: its column ("--bucket-size SIZE=4MiB") and its
// description (on the same line, or the lines below it).
struct HelpOption {
  std::string column, description;
};

std::vector<HelpOption> help_options(const std::string& help) {
  std::vector<HelpOption> options;
  std::istringstream lines(help);
  for (std::string line; std::getline(lines, line);) {
    const auto start = line.find_first_not_of(' ');
    if (start == std::string::npos) continue;
    if (start <= 4 && line[start] == '-') {
      const auto gap = line.find("  ", start);
      options.push_back({line.substr(start, gap == std::string::npos ? std::string::npos : gap - start),
                         gap == std::string::npos ? "" : line.substr(gap)});
    } else if (!options.empty() && start > 4) {
      options.back().description += " " + line.substr(start);
    }
  }
  return options;
}

// Catches: an option that takes a value and has a default, registered
// without capture_default_str() / default_str() (its --help shows no
// "=VALUE"), in any subcommand, hidden ones included. An option whose
// default is not a value says so in words ("(default: the rest)"); a
// required one has none. Mutation tried: capture_default_str() removed from
// --listen-host (flags.cc): engine and save fail here.
TEST(CliDefaults, EveryOptionOfEveryCommandShowsItsDefault) {
  for (const char* command :
       {"demo", "bench", "coordinator", "trainer", "engine", "save", "push", "inspect", "make-checkpoint", "ceiling"}) {
    const std::vector<HelpOption> options = help_options(help_of(command));
    EXPECT_GT(options.size(), 1u) << command;
    for (const HelpOption& o : options) {
      const auto space = o.column.find(' ');
      if (space == std::string::npos || o.column.find('{') != std::string::npos) continue;  // a flag: no value
      const bool shown = o.column.find('=') != std::string::npos;
      const bool required = o.column.find("REQUIRED") != std::string::npos;
      const bool in_words = o.description.find("default: ") != std::string::npos;
      EXPECT_TRUE(shown || required || in_words) << "refit " << command << " --help: " << o.column << o.description;
    }
  }
}

// Catches: push without --bucket-timeout (the README names it a flag of
// every role that runs ranks), or one showing another default.
TEST(CliDefaults, PushTakesBucketTimeout) {
  EXPECT_EQ(help_default(help_of("push"), "--bucket-timeout"), number(RankOptions{}.bucket_timeout_s));
}

}  // namespace
}  // namespace refit
