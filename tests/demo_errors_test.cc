// A failed demo job says its cause once, as the last line of stderr (issue
// 17: a setup failure was printed by the coordinator and every rank, 8
// times, above an empty results table, and a rank that failed on its own
// ended with "the coordinator wrote no report"). The rule, demo_errors.h:
// the demo holds back its children's error lines and prints only those that
// do not repeat the cause; the cause is the coordinator's report error, or
// the first failed process's own error.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "process_harness.h"
#include "testing/expect_has.h"

namespace refit {
namespace {

using testing::RunResult;
using testing::run_refit;

using testing::count_occurrences;

std::string last_line(const std::string& text) {
  std::string t = text;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  const auto nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

RunResult failing_demo(const std::string& engine_flag, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"demo", "--engine-ranks", "2", "--refits", "1", "--setup-timeout", "30",
                                   "--debug-engine-flag=" + engine_flag};
  args.insert(args.end(), extra.begin(), extra.end());
  return run_refit(args, 120);
}

// The coordinator refuses the job at setup (an engine that supports only
// bfloat16) and tells every rank, which each fail with that error. Catches:
// the children's error lines passed on as they come (mutation tried:
// pump_stderr's pass_lines writing the error line too: the cause appears 6
// times), and a table printed for a job that measured nothing.
TEST(DemoErrors, ASetupRefusalIsSaidOnceAsTheLastLine) {
  const std::string cause = "engine rank 0 supports only [\"bfloat16\"]";
  for (const char* output : {"--table", "--json"}) {
    std::vector<std::string> extra;
    if (std::string(output) == "--json") extra.push_back("--json");
    const RunResult r = failing_demo("--dtypes=bfloat16", extra);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_EQ(count_occurrences(r.err, cause), 1u) << output << ":\n" << r.err;
    EXPECT_EQ(last_line(r.err).rfind("refit demo: error: failed_precondition: unsupported dtype", 0), 0u) << r.err;
    EXPECT_NE(last_line(r.err).find(cause), std::string::npos) << r.err;
    if (extra.empty()) {
      EXPECT_EQ(r.out, "") << "no table for a job that measured nothing";
    } else {
      EXPECT_NE(r.out.find("\"verified\": false"), std::string::npos) << r.out;  // the report, as JSON
    }
  }
}

// Every engine rank refuses its own settings before joining; the
// coordinator never gets to report. The first to fail is the cause, said
// once with its name, in place of "the coordinator ... without a report".
// Catches: repeats_cause comparing whole texts (each rank names itself, so
// each line differs): mutation tried, the cause appears 3 times.
TEST(DemoErrors, ARankThatFailsAloneIsTheCause) {
  const RunResult r = failing_demo("--dtypes=nosuch");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(count_occurrences(r.err, "unknown dtype 'nosuch'"), 1u) << r.err;
  const std::string last = last_line(r.err);
  EXPECT_EQ(last.rfind("refit demo: error: invalid_argument: engine rank ", 0), 0u) << r.err;
  EXPECT_NE(last.find("unknown dtype 'nosuch'"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("without a report"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

}  // namespace
}  // namespace refit
