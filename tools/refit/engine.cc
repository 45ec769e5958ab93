// `refit engine`: one engine rank (a receiver and the reference engine,
// runtime/roles.h), optionally saving its shards after each refit.
#include <memory>
#include <string>

#include "command.h"
#include "flags.h"

namespace refit::cli {

void add_engine_command(CLI::App& app, CommandTable& table) {
  struct EngineFlags {
    EngineOptions options;
    std::string secret_file;
  };
  auto f = std::make_shared<EngineFlags>();
  CLI::App* cmd = app.add_subcommand("engine", "Run one engine rank (receiver + reference engine)");
  add_engine_flags(*cmd, f->options, f->secret_file);
  cmd->add_option("--save", f->options.save_path,
                  "After each refit, write this rank's shards to this safetensors file");
  cmd->add_option("--debug-die-at-commit", f->options.debug_die_at_commit,
                  "Debug: in refit N, die by SIGKILL on receiving the commit, before applying it");
  cmd->add_option("--debug-stop-at-commit", f->options.debug_stop_at_commit,
                  "Debug: in refit N, stop (SIGSTOP) on receiving the commit, before applying it");
  table.push_back({cmd, [f]() -> Status {
                     RETURN_IF_ERROR(finish_engine_options(f->options, f->secret_file));
                     return run_engine(f->options);
                   }});
}

}  // namespace refit::cli
