// The subcommands of `refit`, each in its own file, registered by main.
//
// A subcommand's add_*_command function adds its CLI11 app to `app`, binds
// its flags to an options struct it owns (flags.h: the shared flags bind to
// the library's options structs, so defaults live there), and appends a
// Command to `table`. Once the command line parsed, main calls the chosen
// command's `run` and turns its Status into the exit code, in one place:
//
//   exit 0  run returned OK
//   exit 1  run returned an error: main prints "refit <command>: error:
//           <status>" once, as the last line of stderr
//   exit 2  a usage error: CLI11's parse errors, including a
//           CLI::ValidationError thrown by a command's callback when flags
//           that parse alone do not fit together
//
// `run` prints its own results (tables, JSON) on stdout and never prints its
// error: it returns it.
#pragma once

#include <functional>
#include <vector>

#include <CLI/CLI.hpp>

#include "refit/status.h"

namespace refit::cli {

struct Command {
  CLI::App* app = nullptr;
  std::function<Status()> run;
};

using CommandTable = std::vector<Command>;

// In the order `refit --help` lists them.
void add_demo_command(CLI::App& app, CommandTable& table);
void add_bench_command(CLI::App& app, CommandTable& table);
void add_coordinator_command(CLI::App& app, CommandTable& table);
void add_trainer_command(CLI::App& app, CommandTable& table);
void add_engine_command(CLI::App& app, CommandTable& table);
void add_save_command(CLI::App& app, CommandTable& table);
void add_push_command(CLI::App& app, CommandTable& table);
void add_inspect_command(CLI::App& app, CommandTable& table);
void add_make_checkpoint_command(CLI::App& app, CommandTable& table);  // hidden: benchmarks' helper
void add_ceiling_command(CLI::App& app, CommandTable& table);          // hidden: benchmarks' helper

}  // namespace refit::cli
