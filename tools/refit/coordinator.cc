// `refit coordinator`: the control plane of one job (control/coordinator.h).
// Prints the JSON report on stdout (or writes it to --report) and fails when
// the report holds an error.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "command.h"
#include "refit/coordinator.h"
#include "flags.h"
#include "report_table.h"

namespace refit::cli {
namespace {

struct CoordinatorFlags {
  CoordinatorOptions options;
  std::string secret_file;
  std::string port_file;    // "": say the port on stderr
  CLI::Option* progress = nullptr;  // --progress/--no-progress
};

// Writes `port` to `path` atomically (a reader never sees a partial file);
// a path that is not a regular file (a pipe: /dev/fd/N, as the demo passes)
// is written directly.
void write_port_file(const std::string& path, int port) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    std::ofstream(path) << port << "\n";
    return;
  }
  const std::string tmp = path + ".tmp";
  { std::ofstream(tmp) << port << "\n"; }
  std::rename(tmp.c_str(), path.c_str());
}

Status run_coordinator_command(CoordinatorFlags& f) {
  ASSIGN_OR_RETURN(f.options.secret, resolve_secret(f.secret_file));
  // Neither --progress nor --no-progress: draw when a person watches
  // stderr (a terminal), not into a pipe or a file.
  if (f.progress->count() == 0) f.options.progress = ::isatty(STDERR_FILENO) == 1;
  JobReport report = run_coordinator(f.options, [&](int port) {
    if (!f.port_file.empty()) {
      write_port_file(f.port_file, port);
    } else {
      std::fprintf(stderr, "refit coordinator: listening on port %d\n", port);
    }
  });
  // With --report the library kept the file up to date (CoordinatorOptions::report_path).
  if (f.options.report_path.empty()) std::printf("%s\n", report.json.c_str());
  return report.status;
}

}  // namespace

void add_coordinator_command(CLI::App& app, CommandTable& table) {
  auto f = std::make_shared<CoordinatorFlags>();
  CoordinatorOptions& o = f->options;
  CLI::App* cmd = app.add_subcommand("coordinator", "Run the control plane of a refit job");
  cmd->add_option("--listen", o.listen, "host:port to listen on (port 0: any)")->capture_default_str();
  add_rank_count_flags(*cmd, o.trainer_ranks, "Trainer ranks expected", o.engine_ranks, "Engine ranks expected");
  cmd->add_option("--refits", o.refits, "Number of refits to run; 0: on demand, as the trainer ranks ask")
      ->check(WholeInt(0, "a count of refits", "counts"))
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "Seed of the synthetic weights")->capture_default_str();
  add_timeout_flags(*cmd, o.setup_timeout_s, o.refit_timeout_s);
  add_heartbeat_flags(*cmd, o.heartbeat_interval_s, o.heartbeat_timeout_s);
  cmd->add_option("--handshake-timeout", o.handshake_timeout_s,
                  "Seconds a new connection has to authenticate and join before it is refused")
      ->check(PositiveSeconds())
      ->capture_default_str();
  cmd->add_option("--trainer-replace-timeout", o.trainer_replace_timeout_s,
                  "On-demand jobs (--refits 0): seconds to wait for a trainer rank started again with the same rank "
                  "after its process was lost during a refit (the refit is aborted; the engines keep their version; "
                  "the next refit commits); 0: a lost rank ends the job")
      ->capture_default_str();
  add_release_flag(*cmd, o.release_between_refits);
  add_only_flags(*cmd, o.only, o.only_from);
  add_engines_flags(*cmd, o.engines, o.relay_fanout, o.min_engines, o.max_engines);
  cmd->add_option("--port-file", f->port_file,
                  "Write the listening port to this file (default: none, say it on stderr)");
  cmd->add_option("--report", o.report_path,
                  "Write the JSON report to this file, at every commit decision and at the end (default: stdout, "
                  "at the end)");
  add_fault_hook_flag(*cmd, o.debug_fault);
  f->progress = cmd->add_flag("--progress,!--no-progress", o.progress,
                              "Draw setup progress and a progress bar on stderr (default: when stderr is a terminal)");
  cmd->add_flag("!--quiet", o.log_joins, "Do not log each rank that joins");
  add_secret_file_flag(*cmd, f->secret_file);
  table.push_back({cmd, [f] { return run_coordinator_command(*f); }});
}

}  // namespace refit::cli
