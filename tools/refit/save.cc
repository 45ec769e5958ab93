// `refit save`: an engine rank that writes what it holds (its shards) as
// safetensors after each refit: `refit engine --save` with --out required.
#include <memory>
#include <string>

#include "command.h"
#include "flags.h"

namespace refit::cli {

void add_save_command(CLI::App& app, CommandTable& table) {
  struct SaveFlags {
    EngineOptions options;
    std::string secret_file;
  };
  auto f = std::make_shared<SaveFlags>();
  CLI::App* cmd = app.add_subcommand(
      "save", "Run one engine rank and write what it holds (its shards) as safetensors after each refit");
  add_engine_flags(*cmd, f->options, f->secret_file);
  cmd->add_option("--out", f->options.save_path, "The safetensors file to write")->required();
  table.push_back({cmd, [f]() -> Status {
                     RETURN_IF_ERROR(finish_engine_options(f->options, f->secret_file));
                     return run_engine(f->options);
                   }});
}

}  // namespace refit::cli
