// A failed demo job's cause, said once.
//
// Every process of a demo job that fails prints its error as the last line
// of its stderr, "refit <command>: error: <status>" (main.cc). Setup
// failures reach every rank, so each would repeat the cause the coordinator
// found. The rule: the demo holds back each child's error line (the other
// lines pass as they come), picks one cause, prints the held lines that do
// not repeat it, and returns the cause as its own error, which main prints
// as the last line of stderr:
//
//   - the coordinator's report error when it wrote one (it saw every rank);
//   - else the error line of the first process to fail, naming it;
//   - else how that process ended (a signal leaves no line).
//
// A held line repeats the cause when its text, less its status code and
// its own process's name, contains the cause's text less the same. And when
// the coordinator ended the job with an error of its own, a rank's error
// about the coordinator (it could not reach it, or lost it) is that ending
// seen from the rank: it is held back too.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace refit::cli {

// A process's error line, "refit engine: error: aborted: engine rank 0:
// ...", and its status text, "aborted: engine rank 0: ...".
struct ErrorLine {
  std::string line;
  std::string status;
};

// `line` (without its newline) when it is a process's error line, else
// nothing.
std::optional<ErrorLine> parse_error_line(std::string_view line);

// Whether `line` (no newline yet) may still grow into an error line: the
// demo holds such a beginning until its line ends; anything else (a
// progress bar redrawn with '\r') passes at once.
bool may_become_error_line(std::string_view line);

// `error` (a status text of the process named `name`) with `name` in it:
// "invalid_argument: bad" -> "invalid_argument: engine rank 0: bad"; as it
// is when it names the process already.
std::string naming_process(const std::string& error, const std::string& name);

// The cause of a failed job: a status text, and the process that found it
// ("" for the coordinator's report).
struct Cause {
  std::string text;
  std::string process;
};

// Whether `error`, printed by the process named `name`, repeats `cause`.
bool repeats_cause(const std::string& error, const std::string& name, const Cause& cause);

}  // namespace refit::cli
