#include "demo.h"

#include <fcntl.h>
#include <poll.h>
#include <cstring>

#include <dirent.h>
#include <sys/random.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "command.h"
#include "demo_children.h"
#include "demo_errors.h"
#include "flags.h"
#include "refit/trainer_layout.h"
#include "refit/coordinator.h"
#include "refit/model.h"
#include "refit/plan.h"
#include "report_table.h"
#include "refit/roles.h"
#include "refit/transfer_defaults.h"

namespace refit::cli {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string self_path() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "refit";
  buf[n] = '\0';
  return buf;
}

// ---- soak sampling (--soak-report) ----------------------------------------

// One process's resources, read from /proc.
struct ProcSample {
  bool ok = false;             // the process existed and /proc was readable
  std::uint64_t rss_kib = 0;   // VmRSS
  int fds = 0;                 // entries of /proc/PID/fd
  int shm_maps = 0;            // distinct /dev/shm files mapped (/proc/PID/maps)
};

ProcSample sample_process(pid_t pid) {
  ProcSample s;
  const std::string proc = "/proc/" + std::to_string(pid);
  {
    std::ifstream status(proc + "/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("VmRSS:", 0) == 0) {
        s.rss_kib = std::strtoull(line.c_str() + 6, nullptr, 10);
        s.ok = true;
      }
    }
  }
  if (!s.ok) return s;  // gone, or a zombie (no VmRSS)
  if (DIR* dir = ::opendir((proc + "/fd").c_str())) {
    while (dirent* e = ::readdir(dir)) {
      if (e->d_name[0] != '.') ++s.fds;
    }
    ::closedir(dir);
  } else {
    s.ok = false;
  }
  std::ifstream maps(proc + "/maps");
  std::string line;
  std::vector<std::string> seen;
  while (std::getline(maps, line)) {
    auto at = line.find("/dev/shm/");
    if (at == std::string::npos) continue;
    std::string path = line.substr(at);
    if (std::find(seen.begin(), seen.end(), path) == seen.end()) seen.push_back(path);
  }
  s.shm_maps = static_cast<int>(seen.size());
  return s;
}

// /dev/shm/refit-<pid>-* entries of these processes: 0 while the shm pools
// stay unnamed (a guard: a named pool would be a leak after a kill).
int shm_entries_of(const std::vector<pid_t>& pids) {
  int n = 0;
  if (DIR* dir = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(dir)) {
      for (pid_t pid : pids) {
        if (std::string(e->d_name).rfind("refit-" + std::to_string(pid) + "-", 0) == 0) ++n;
      }
    }
    ::closedir(dir);
  }
  return n;
}

// Samples every child now and then; keeps the first sample taken once the
// job settled (kSoakStartAfter after launch: setup done, the first refits
// committed) and the last one in which every child was still running.
class SoakSampler {
 public:
  static constexpr std::chrono::milliseconds kEvery{100};
  static constexpr std::chrono::milliseconds kSoakStartAfter{2000};
  // Growth beyond noise (docs/RELIABILITY.md, "Soak"): descriptors and
  // shared memory must not grow at all; resident memory may grow by
  // allocator noise only: at most max(kRssSlackKib, kRssSlackPercent%).
  static constexpr std::uint64_t kRssSlackKib = 4096;
  static constexpr std::uint64_t kRssSlackPercent = 5;

  explicit SoakSampler(const std::vector<Child>* children) : children_(children), launched_(Clock::now()) {}

  void maybe_sample() {
    auto now = Clock::now();
    if (now < next_) return;
    next_ = now + kEvery;
    Json snap{{"t_s", std::chrono::duration<double>(now - launched_).count()}, {"processes", Json::object()}};
    std::vector<pid_t> pids;
    for (const Child& c : *children_) {
      pids.push_back(c.pid);
      if (c.exit_code >= 0) return;  // only samples where every process runs
      ProcSample p = sample_process(c.pid);
      if (!p.ok) return;
      snap["processes"][c.name] = Json{{"pid", c.pid}, {"rss_kib", p.rss_kib}, {"fds", p.fds}, {"shm_maps", p.shm_maps}};
    }
    snap["dev_shm_entries"] = shm_entries_of(pids);
    ++samples_;
    if (start_.is_null() && now - launched_ >= kSoakStartAfter) start_ = snap;
    end_ = std::move(snap);
  }

  // The report: start, end, growth per process and the verdict.
  Json report() const {
    Json r{{"samples", samples_}, {"start", start_}, {"end", end_},
           {"thresholds", {{"rss_slack_kib", kRssSlackKib}, {"rss_slack_percent", kRssSlackPercent},
                           {"fds", 0}, {"shm_maps", 0}, {"dev_shm_entries", 0}}}};
    std::vector<std::string> problems;
    if (start_.is_null() || end_.is_null() || start_["t_s"] == end_["t_s"]) {
      problems.push_back("the job ended before a start and an end sample could be taken (" +
                         std::to_string(samples_) + " samples); run more refits");
    } else {
      Json growth = Json::object();
      for (auto it = start_["processes"].begin(); it != start_["processes"].end(); ++it) {
        const Json& a = it.value();
        const Json& b = end_["processes"][it.key()];
        auto delta = [&](const char* k) { return b[k].get<std::int64_t>() - a[k].get<std::int64_t>(); };
        growth[it.key()] = Json{{"rss_kib", delta("rss_kib")}, {"fds", delta("fds")}, {"shm_maps", delta("shm_maps")}};
        const auto start_rss = a["rss_kib"].get<std::int64_t>();
        const auto slack = std::max<std::int64_t>(kRssSlackKib, start_rss * static_cast<std::int64_t>(kRssSlackPercent) / 100);
        if (delta("rss_kib") > slack) {
          problems.push_back(it.key() + ": VmRSS grew by " + std::to_string(delta("rss_kib")) + " KiB (from " +
                             std::to_string(start_rss) + " KiB; noise allowance " + std::to_string(slack) + " KiB)");
        }
        if (delta("fds") > 0) problems.push_back(it.key() + ": open descriptors grew by " + std::to_string(delta("fds")));
        if (delta("shm_maps") > 0) {
          problems.push_back(it.key() + ": mapped /dev/shm files grew by " + std::to_string(delta("shm_maps")));
        }
      }
      r["growth"] = growth;
      if (end_["dev_shm_entries"].get<int>() > start_["dev_shm_entries"].get<int>()) {
        problems.push_back("/dev/shm entries of the job grew from " + start_["dev_shm_entries"].dump() + " to " +
                           end_["dev_shm_entries"].dump());
      }
    }
    r["problems"] = problems;
    r["ok"] = problems.empty();
    return r;
  }

 private:
  const std::vector<Child>* children_;
  Clock::time_point launched_;
  Clock::time_point next_{};
  int samples_ = 0;
  Json start_, end_;
};

std::string fmt(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

Json failed_report(const std::string& error) { return Json{{"verified", false}, {"error", error}}; }

// The processes of one demo job. The coordinator's port and report come
// back over pipes, so nothing of the job is named in /tmp.
struct DemoJob {
  std::string self = self_path();
  std::vector<std::string> common;  // flags every process takes
  std::vector<std::string> env;     // every process's environment (job_environment)
  std::vector<Child> children;      // [0]: the coordinator
  int port_read = -1, report_read = -1;
  std::string report_text;  // what the coordinator printed on stdout so far
  int first_failure = -1;   // index in children of the first to exit non-zero

  ~DemoJob() {
    for (int fd : {port_read, report_read}) {
      if (fd >= 0) ::close(fd);
    }
    for (const Child& c : children) {
      if (c.stderr_read >= 0) ::close(c.stderr_read);
    }
  }

  // Appends what the coordinator printed (its report) since the last call.
  void drain_report() {
    char buf[65536];
    ssize_t n;
    while (report_read >= 0 && (n = ::read(report_read, buf, sizeof buf)) > 0) report_text.append(buf, n);
  }
};

// The environment of the job's processes: REFIT_SECRET set to the job's
// secret, so that every process authenticates with it: the user's
// (--secret-file, read here once, or REFIT_SECRET), else a fresh one for
// this run. The demo's coordinator listens on loopback, but no process of
// the job then runs unauthenticated, and none warns that it does. Empty
// (this process's environment) for a secret file that holds a NUL byte:
// each process then reads the file itself.
StatusOr<std::vector<std::string>> job_environment(const DemoOptions& o) {
  ASSIGN_OR_RETURN(Secret secret, resolve_secret(o.secret_file));
  std::string bytes = secret.bytes();
  if (bytes.find('\0') != std::string::npos) return std::vector<std::string>{};  // not for an environment
  if (bytes.empty()) {
    unsigned char random[32];
    if (::getrandom(random, sizeof random, 0) != static_cast<ssize_t>(sizeof random)) {
      return ErrnoStatus("drawing the demo's secret (getrandom)", errno);
    }
    for (unsigned char c : random) {
      char hex[3];
      std::snprintf(hex, sizeof hex, "%02x", c);
      bytes += hex;
    }
  }
  return environment_with("REFIT_SECRET", bytes);
}

// Starts the coordinator and returns the port it listens on, once it said
// it; "" when it exited or did not say within the setup timeout (then it is
// killed and reaped). Its port (fd 3) and its report (stdout) come over
// pipes.
std::string start_coordinator(const DemoOptions& o, DemoJob& job) {
  int port_pipe[2], report_pipe[2];
  if (::pipe2(port_pipe, O_CLOEXEC) != 0) return "";
  if (::pipe2(report_pipe, O_CLOEXEC) != 0) {
    ::close(port_pipe[0]);
    ::close(port_pipe[1]);
    return "";
  }
  job.port_read = port_pipe[0];
  job.report_read = report_pipe[0];
  ::fcntl(job.report_read, F_SETFL, O_NONBLOCK);
  std::vector<std::string> args = {job.self, "coordinator", "--listen", "127.0.0.1:0",
                                   "--refits", std::to_string(o.refits), "--seed", std::to_string(o.seed),
                                   "--port-file", "/dev/fd/3"};
  if (!o.debug_log_processes) args.push_back("--quiet");
  if (o.release_between_refits) args.push_back("--release-between-refits");
  for (const std::string& arg : coordinator_only_args(o)) args.push_back(arg);
  if (o.engines > 1 || o.max_engines > 1) {
    args.insert(args.end(), {"--engines", std::to_string(o.engines), "--relay-fanout", std::to_string(o.relay_fanout)});
    if (o.min_engines > 0) args.insert(args.end(), {"--min-engines", std::to_string(o.min_engines)});
    if (o.max_engines > 0) args.insert(args.end(), {"--max-engines", std::to_string(o.max_engines)});
  }
  args.insert(args.end(), job.common.begin(), job.common.end());
  if (!o.json && ::isatty(2)) args.push_back("--progress");
  job.children.push_back(start_child("coordinator", args, {{port_pipe[1], 3}, {report_pipe[1], 1}}, job.env));
  ::close(port_pipe[1]);
  ::close(report_pipe[1]);
  Child& coordinator = job.children[0];
  std::string port;
  for (auto until = Clock::now() + std::chrono::duration<double>(o.setup_timeout_s); Clock::now() < until;) {
    stop_if_signalled(job.children);
    pollfd p{job.port_read, POLLIN, 0};
    if (::poll(&p, 1, 10) > 0) {
      char buf[32];
      const ssize_t n = ::read(job.port_read, buf, sizeof buf - 1);
      if (n > 0) {
        port.append(buf, static_cast<std::size_t>(n));
        if (port.find('\n') != std::string::npos) return port.substr(0, port.find('\n'));
        continue;
      }
    }
    job.drain_report();
    pump_stderr(coordinator);
    int st = 0;
    if (::waitpid(coordinator.pid, &st, WNOHANG) == coordinator.pid) {
      coordinator.exit_code = exit_code_of(st);
      break;
    }
  }
  if (coordinator.exit_code < 0) {
    ::kill(coordinator.pid, SIGKILL);
    ::waitpid(coordinator.pid, nullptr, 0);
  }
  return "";
}

// A size or count as its command-line text: "auto" for the auto value.
std::string flag_value(std::uint64_t value, std::uint64_t auto_value) {
  return value == auto_value ? "auto" : std::to_string(value);
}

// Starts every engine rank, then every trainer rank, against `port`.
void start_ranks(const DemoOptions& o, int trainers, const std::string& port, DemoJob& job) {
  std::vector<std::string> rank_common = {"--coordinator", "127.0.0.1:" + port, "--model", o.model,
                                          "--layers", std::to_string(o.layers), "--transport", o.transport,
                                          "--mode", o.mode, "--engine-experts", o.engine_experts,
                                          "--quantize", o.quantize,
                                          "--change-fraction", fmt(o.change_fraction),
                                          "--bucket-size", flag_value(o.bucket_size, kAutoBucketSize)};
  rank_common.insert(rank_common.end(), job.common.begin(), job.common.end());
  if (o.delta) rank_common.push_back("--delta");
  for (int g = 0; g < o.engine_ranks * o.engines; ++g) {
    const int e = g % o.engine_ranks, k = g / o.engine_ranks;
    std::vector<std::string> args = {job.self,
                                     "engine",
                                     "--rank",
                                     std::to_string(e),
                                     "--engine",
                                     std::to_string(k),
                                     "--pool-slots",
                                     flag_value(static_cast<std::uint64_t>(o.pool_slots), kAutoPoolSlots),
                                     "--memory-limit",
                                     std::to_string(o.memory_limit),
                                     "--device",
                                     o.device,
                                     "--engine-gpus",
                                     std::to_string(o.engine_gpus)};
    args.insert(args.end(), rank_common.begin(), rank_common.end());
    if (o.poison_recycled) args.push_back("--poison-recycled");
    if (o.shadow) args.push_back("--shadow");
    if (o.readers > 0) args.insert(args.end(), {"--readers", std::to_string(o.readers)});
    args.insert(args.end(), o.debug_engine_flags.begin(), o.debug_engine_flags.end());
    for (const std::string& fault : o.debug_engine_faults) {
      const std::size_t colon = fault.find(':');
      if (fault.substr(0, colon) == std::to_string(k)) args.insert(args.end(), {"--debug-fault", fault.substr(colon + 1)});
    }
    const std::string name = o.engines > 1 ? "engine " + std::to_string(k) + " rank " + std::to_string(e)
                                           : "engine rank " + std::to_string(e);
    job.children.push_back(start_child(name, args, {}, job.env));
  }
  for (int t = 0; t < trainers; ++t) {
    std::vector<std::string> args = {job.self, "trainer", "--rank", std::to_string(t), "--device", trainer_device(o),
                                     "--register-host-weights", o.register_host_weights ? "true" : "false",
                                     "--trainer-layout", o.trainer_layout, "--trainer-names", o.trainer_names};
    args.insert(args.end(), rank_common.begin(), rank_common.end());
    job.children.push_back(start_child("trainer rank " + std::to_string(t), args, {}, job.env));
  }
  if (o.debug_log_processes) {
    std::string line = "refit demo: processes:";
    for (const Child& c : job.children) line += " " + c.name + " pid " + std::to_string(c.pid) + ";";
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

// Reads the stderr of exited children to its end (bounded: a pipe that some
// other process still holds open is left after 2 s).
void finish_stderr(std::vector<Child>& children) {
  const auto until = Clock::now() + std::chrono::seconds(2);
  for (;;) {
    std::vector<pollfd> open;
    for (const Child& c : children) {
      if (c.stderr_read >= 0) open.push_back({c.stderr_read, POLLIN, 0});
    }
    if (open.empty() || Clock::now() > until) return;
    ::poll(open.data(), open.size(), 100);
    pump_stderr(children);
  }
}

// Waits for every process. Each one enforces its own deadlines; the demo only
// steps in (SIGKILL) if one outlives them all by a wide margin. Once a
// process failed, the others fail on their own within their deadlines; a
// rank that failed during setup leaves the rest waiting for it, so the demo
// ends them after a short grace period instead.
void wait_for_children(const DemoOptions& o, DemoJob& job, SoakSampler* soak) {
  std::vector<Child>& children = job.children;
  const auto hard_limit = Clock::now() + std::chrono::duration<double>(o.setup_timeout_s + 60 +
                                                                      o.refit_timeout_s * (o.refits + 1));
  std::size_t running = children.size() - (children[0].exit_code >= 0 ? 1 : 0);
  std::optional<Clock::time_point> grace_until;
  while (running > 0) {
    stop_if_signalled(children);
    job.drain_report();
    pump_stderr(children);
    if (soak != nullptr) soak->maybe_sample();
    int st = 0;
    pid_t pid = ::waitpid(-1, &st, WNOHANG);
    if (pid > 0) {
      for (std::size_t i = 0; i < children.size(); ++i) {
        Child& c = children[i];
        if (c.pid == pid && c.exit_code < 0) {
          c.exit_code = exit_code_of(st);
          --running;
          // With --min-engines an engine process may end and the job go on: the coordinator decides.
          const bool droppable = o.min_engines > 0 && c.name.rfind("engine ", 0) == 0;
          if (c.exit_code != 0 && job.first_failure < 0 && !droppable) job.first_failure = static_cast<int>(i);
          if (c.exit_code != 0 && !grace_until && !droppable) grace_until = Clock::now() + std::chrono::seconds(5);
        }
      }
      continue;
    }
    if (Clock::now() > hard_limit || (grace_until && Clock::now() > *grace_until)) {
      std::string killed;  // one line for them all
      for (Child& c : children) {
        if (c.exit_code < 0 && !c.killed_by_demo) {
          killed += (killed.empty() ? "" : ", ") + c.name + " (pid " + std::to_string(c.pid) + ")";
          c.killed_by_demo = true;
          ::kill(c.pid, SIGKILL);
        }
      }
      if (!killed.empty()) {
        std::fprintf(stderr, "refit demo: killing %s: still running after %s\n", killed.c_str(),
                     grace_until ? "another process failed" : "every deadline");
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  job.drain_report();
  finish_stderr(children);
}

// How a process ended, in words: "exited 1", "was killed by the demo",
// "died of signal 9 (Killed)".
std::string how_it_ended(const Child& c) {
  if (c.killed_by_demo) return "was killed by the demo";
  if (c.exit_code > 128) {
    return "died of signal " + std::to_string(c.exit_code - 128) + " (" + ::strsignal(c.exit_code - 128) + ")";
  }
  return "exited " + std::to_string(c.exit_code);
}

// The cause of a failed job (demo_errors.h): the coordinator's report
// error, else the error line of the first process to fail, else how it
// ended.
Cause job_cause(const DemoJob& job, const Json& report) {
  if (report.contains("error")) {
    return {report["error"].is_string() ? report["error"].get<std::string>() : report["error"].dump(), ""};
  }
  const Child* first = job.first_failure >= 0 ? &job.children[static_cast<std::size_t>(job.first_failure)] : nullptr;
  if (first != nullptr && first->error) return {naming_process(first->error->status, first->name), first->name};
  std::string text = "the coordinator " + how_it_ended(job.children[0]) + " without a report";
  if (first != nullptr && first != &job.children[0]) {
    text += "; the first process to fail was " + first->name + " (pid " + std::to_string(first->pid) + "), which " +
            how_it_ended(*first);
  }
  return {text, first != nullptr ? first->name : ""};
}

// Prints the children's held error lines that do not repeat `cause`, as
// they wrote them.
void print_other_errors(const DemoJob& job, const Cause& cause) {
  for (const Child& c : job.children) {
    if (c.error && !repeats_cause(c.error->status, c.name, cause)) std::fprintf(stderr, "%s\n", c.error->line.c_str());
  }
}

// A rank of an engine the report lists as lost (--min-engines: the job
// dropped it and went on): its end is the job's business, not a failure.
bool dropped_by_the_job(const Child& c, const Json& report) {
  if (!report.contains("engines") || !report["engines"].is_array()) return false;
  for (const Json& engine : report["engines"]) {
    const std::string prefix = "engine " + std::to_string(engine.value("engine", std::uint64_t{0})) + " rank ";
    if (c.name.rfind(prefix, 0) == 0 && engine.contains("lost") && engine["lost"].is_string()) return true;
  }
  return false;
}

// The coordinator's report, with the processes that failed added, and
// "error" set to the job's cause when one failed; the children's errors
// that say something else are printed.
Json collect_report(const DemoJob& job) {
  Json report = Json::parse(job.report_text, nullptr, /*allow_exceptions=*/false);
  if (report.is_discarded() || !report.is_object()) {
    report = Json{{"verified", false}, {"refits", Json::array()}, {"ranks", Json::array()}};
  }
  std::string failed;
  for (const Child& c : job.children) {
    if (c.exit_code != 0 && !dropped_by_the_job(c, report)) {
      failed += (failed.empty() ? "" : ", ") + c.name + " " + how_it_ended(c);
    }
  }
  if (!failed.empty()) {
    report["verified"] = false;
    report["process_failures"] = failed;
  }
  if (report.contains("error") || !failed.empty()) {
    const Cause cause = job_cause(job, report);
    report["error"] = cause.text;
    print_other_errors(job, cause);
  }
  return report;
}

// Writes the soak report to o.soak_report; growth fails the demo's report.
void finish_soak(const DemoOptions& o, const SoakSampler& soak, Json& report) {
  Json soak_report = soak.report();
  std::ofstream(o.soak_report) << soak_report.dump(2) << "\n";
  if (!soak_report["ok"].get<bool>()) {
    report["verified"] = false;
    if (!report.contains("error")) report["error"] = "soak: resources grew: " + soak_report["problems"].dump();
  }
}

}  // namespace

Json run_demo_report(const DemoOptions& o) {
  const int trainers = o.trainer_ranks > 0 ? o.trainer_ranks : o.engine_ranks;
  // Fail fast on a bad preset or layer count, before any process starts.
  if (Status st = check_demo_settings(o); !st.ok()) return failed_report(st.ToString());
  auto model = make_model(o.model, o.layers);

  catch_stop_signals();
  DemoJob job;
  job.common = {"--trainer-ranks", std::to_string(trainers), "--engine-ranks", std::to_string(o.engine_ranks),
                "--setup-timeout", fmt(o.setup_timeout_s), "--timeout", fmt(o.refit_timeout_s)};
  auto env = job_environment(o);
  if (!env.ok()) return failed_report(env.status().ToString());
  job.env = std::move(*env);
  if (job.env.empty()) job.common.insert(job.common.end(), {"--secret-file", o.secret_file});

  const std::string port = start_coordinator(o, job);
  if (port.empty()) {
    Child& coordinator = job.children[0];
    finish_stderr(job.children);
    if (coordinator.error) return failed_report(naming_process(coordinator.error->status, "the coordinator"));
    return failed_report("the coordinator " +
                         (coordinator.exit_code >= 0 ? how_it_ended(coordinator) + " before it listened"
                                                     : std::string("did not listen within the setup timeout")));
  }
  start_ranks(o, trainers, port, job);
  std::optional<SoakSampler> soak;
  if (!o.soak_report.empty()) soak.emplace(&job.children);
  wait_for_children(o, job, soak ? &*soak : nullptr);

  Json report = collect_report(job);
  report["model"] = o.model;
  report["layers"] = o.layers;
  report["model_bytes"] = model->total_bytes();
  report["tensors"] = model->weights.size();
  report["engine_ranks_count"] = o.engine_ranks;
  report["engines_count"] = o.engines;
  report["trainer_ranks_count"] = trainers;
  if (soak) finish_soak(o, *soak, report);
  return report;
}

namespace {

// Prints the table (or the JSON with options.json); OK only when verified.
Status run_demo(const DemoOptions& o) {
  // Fail before starting any process; the children read the same file or
  // inherit REFIT_SECRET.
  RETURN_IF_ERROR(resolve_secret(o.secret_file).status());
  // Settings no process could run with (--device cuda without a GPU) end
  // here, on stderr only: no table.
  RETURN_IF_ERROR(check_demo_settings(o));
  Json report = run_demo_report(o);
  if (o.json) {
    std::printf("%s\n", report.dump(2).c_str());
  } else {
    print_report_table(report, stdout);
  }
  RETURN_IF_ERROR(report_status(report));
  if (!report.value("verified", false)) return DataLoss("not every refit verified");
  return Status::Ok();
}

}  // namespace

void add_demo_command(CLI::App& app, CommandTable& table) {
  auto o = std::make_shared<DemoOptions>();
  CLI::App* cmd =
      app.add_subcommand("demo", "Run a coordinator, trainer and engine ranks as processes and refit N times");
  add_demo_flags(*cmd, *o);
  cmd->add_option("--refits", o->refits, "Number of refits")->check(CLI::Range(1, 1000000))->capture_default_str();
  add_demo_hidden_flags(*cmd, *o);
  table.push_back({cmd, [o] { return run_demo(*o); }});
}

}  // namespace refit::cli
