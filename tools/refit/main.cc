// The `refit` command: registers every subcommand (command.h), parses the
// command line, runs the chosen one and decides the exit code.
//
// Configuration is parsed at the edge, once, in the subcommands' files; the
// library below takes options structs and reads no environment variables.
#include <cstdio>

#include <CLI/CLI.hpp>

#include "command.h"
#include "flags.h"

int main(int argc, char** argv) {
  using namespace refit::cli;
  CLI::App app{"refit: move model weights from trainer ranks into inference engine ranks"};
  app.require_subcommand(1);
  CommandTable commands;
  add_demo_command(app, commands);
  add_bench_command(app, commands);
  add_coordinator_command(app, commands);
  add_trainer_command(app, commands);
  add_engine_command(app, commands);
  add_save_command(app, commands);
  add_push_command(app, commands);
  add_inspect_command(app, commands);
  add_make_checkpoint_command(app, commands);
  add_ceiling_command(app, commands);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);  // prints the usage error
    // A rank refused here would leave the rest of its job waiting out the
    // setup timeout for it: its coordinator hears why first (flags.h).
    for (const Command& command : commands) {
      if (*command.app) report_refused_command_line(*command.app, e.what());
    }
    return 2;
  }
  for (const Command& command : commands) {
    if (!*command.app) continue;
    const refit::Status status = command.run();
    if (status.ok()) return 0;
    std::fflush(stdout);
    std::fprintf(stderr, "refit %s: error: %s\n", command.app->get_name().c_str(), status.ToString().c_str());
    return 1;
  }
  return 2;  // unreachable: require_subcommand(1)
}
