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
                  "After each refit, write this rank's shards to this safetensors file (default: none)");
  add_fault_hook_flag(*cmd, f->options.debug_fault);
  table.push_back({cmd, [f]() -> Status {
                     RETURN_IF_ERROR(finish_engine_options(f->options, f->secret_file));
                     return run_engine(f->options);
                   }});
}

}  // namespace refit::cli
