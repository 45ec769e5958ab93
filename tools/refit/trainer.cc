// `refit trainer`: one trainer rank (runtime/roles.h), and its hidden fault
// injection flags for the tests.
#include <memory>
#include <string>

#include "command.h"
#include "flags.h"

namespace refit::cli {
namespace {

struct TrainerFlags {
  RankOptions options;
  std::string secret_file;
  std::string debug_data_secret_file;  // "": the data link uses the job's secret
};

Status run_trainer_command(TrainerFlags& f) {
  ASSIGN_OR_RETURN(Secret secret, resolve_secret(f.secret_file));
  f.options.secret = secret.bytes();
  if (!f.debug_data_secret_file.empty()) {
    ASSIGN_OR_RETURN(Secret data_secret, Secret::FromFile(f.debug_data_secret_file));
    f.options.debug_data_secret = data_secret.bytes();
  }
  return run_trainer(f.options);
}

// Fault injection for tests, hidden from --help.
void add_debug_flags(CLI::App& cmd, TrainerFlags& f) {
  RankOptions& o = f.options;
  cmd.add_option("--debug-pack-rank", o.debug_pack_rank, "Fault injection for tests: pack another engine rank's shards")
      ->group("");
  cmd.add_option("--debug-fail-refit", o.debug_fail_refit,
                 "Fault injection for tests: fail refit N after its first bucket")
      ->group("");
  cmd.add_option("--debug-cuda-fault-refit", o.debug_cuda_fault_refit,
                 "Fault injection for tests: break the trainer's CUDA context in refit N")
      ->group("");
  add_fault_hook_flag(cmd, o.debug_fault);
  cmd.add_option("--debug-die-after-announce", o.debug_die_after_announce,
                 "Fault injection for tests: in refit N, send a bucket behind a GPU delay, then SIGKILL")
      ->group("");
  cmd.add_option("--debug-stop-after-bucket", o.debug_stop_after_bucket,
                 "Fault injection for tests: in refit N, stop by SIGSTOP after sending the first bucket")
      ->group("");
  cmd.add_option("--debug-gpu-delay-ms", o.debug_gpu_delay_ms,
                 "Fault injection for tests: a sharded rank's stream waits N ms on the GPU before each bucket part")
      ->group("");
  cmd.add_option("--debug-host-delay-ms", o.debug_host_delay_ms,
                 "Fault injection for tests: a sharded rank sleeps N ms before each bucket part")
      ->group("");
  cmd.add_option("--debug-data-secret-file", f.debug_data_secret_file,
                 "Fault injection for tests: authenticate the data link with this secret instead")
      ->group("");
}

}  // namespace

void add_trainer_command(CLI::App& app, CommandTable& table) {
  auto f = std::make_shared<TrainerFlags>();
  CLI::App* cmd = app.add_subcommand("trainer", "Run one trainer rank");
  add_rank_flags(*cmd, f->options);
  add_trainer_layout_flags(*cmd, f->options.trainer_layout, f->options.trainer_names);
  add_secret_file_flag(*cmd, f->secret_file);
  add_debug_flags(*cmd, *f);
  cmd->add_option("--gpu", f->options.gpu, "Local CUDA device of this trainer rank (inside CUDA_VISIBLE_DEVICES)")
      ->check(WholeInt(0, "a device index", "device indices"))
      ->capture_default_str();
  add_register_host_weights_flag(*cmd, f->options.register_host_weights);
  table.push_back({cmd, [f] { return run_trainer_command(*f); }});
}

}  // namespace refit::cli
