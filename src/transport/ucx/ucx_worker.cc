#include "transport/ucx/ucx_worker.h"

#include "net/poll_wait.h"
#include "refit/log.h"

#if REFIT_HAVE_UCX

#include <poll.h>
#include <ucs/debug/log_def.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace refit {
namespace {

// Calls without progress before the progress thread sleeps on the event fd:
// long enough to ride out the gaps between a stream's fragments (sleeping
// and waking per fragment halves tcp throughput), short enough that an idle
// engine sleeps within microseconds.
constexpr int kIdleSpins = 256;
// The longest sleep; ucp_worker_signal wakes it sooner for a stop.
constexpr int kSleepMs = 100;
// tcp segment: one write chunk (kAmChunkBytes) plus headers per message.
constexpr std::uint64_t kUcxTcpSegmentBytes = kAmChunkBytes + 4096;

thread_local int t_quiet_logs = 0;

ucs_log_func_rc_t route_ucx_log(const char* file, unsigned line, const char*, ucs_log_level_t level,
                                const ucs_log_component_config_t*, const char* format, va_list ap) {
  if (level == UCS_LOG_LEVEL_FATAL) return UCS_LOG_FUNC_RC_CONTINUE;  // UCX's own handling
  if (t_quiet_logs > 0) return UCS_LOG_FUNC_RC_STOP;
  char message[1024];
  std::vsnprintf(message, sizeof message, format, ap);
  const char* base = std::strrchr(file, '/');
  log(level <= UCS_LOG_LEVEL_ERROR ? LogLevel::kError : LogLevel::kWarning, "refit ucx",
      std::string("UCX ") + ucs_log_level_names[level] + " " + (base ? base + 1 : file) + ":" + std::to_string(line) +
          ": " + message);
  return UCS_LOG_FUNC_RC_STOP;
}

void route_logs_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("UCX_LOG_FILE") == nullptr) ucs_log_push_handler(&route_ucx_log);
  });
}

}  // namespace

UcxQuietLogs::UcxQuietLogs() { ++t_quiet_logs; }
UcxQuietLogs::~UcxQuietLogs() { --t_quiet_logs; }

std::string ucx_status_text(ucs_status_t status) {
  return std::string(ucs_status_string(status)) + " (UCX status " + std::to_string(static_cast<int>(status)) + ")";
}

StatusOr<std::shared_ptr<UcxWorker>> UcxWorker::Create(const UcxOptions& options) {
  route_logs_once();
  std::shared_ptr<UcxWorker> w(new UcxWorker());
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return FailedPrecondition("reading UCX's configuration (UCX_* variables): " + ucx_status_text(s));
  struct Override {
    const char* name;
    const std::string& value;
  };
  // The tcp segment size, unless UCX's own variables set it. UCX 1.13 takes
  // transport settings in ucp_config_modify without their prefix ("TX_SEG_SIZE",
  // only tcp has it) and warns about settings no transport used: only when
  // tcp may be in use.
  const std::string segment = std::to_string(kUcxTcpSegmentBytes);
  std::vector<Override> overrides = {{"TLS", options.tls}, {"NET_DEVICES", options.net_devices}};
  const char* env_tls = std::getenv("UCX_TLS");
  const std::string tls = !options.tls.empty() ? options.tls : env_tls != nullptr ? env_tls : "";
  const bool excluding = !tls.empty() && tls[0] == '^';
  const bool tcp_possible = tls.empty() || tls == "all" || (tls.find("tcp") != std::string::npos) != excluding;
  if (tcp_possible && std::getenv("UCX_TCP_TX_SEG_SIZE") == nullptr) overrides.push_back({"TX_SEG_SIZE", segment});
  if (tcp_possible && std::getenv("UCX_TCP_RX_SEG_SIZE") == nullptr) overrides.push_back({"RX_SEG_SIZE", segment});
  for (const Override& o : overrides) {
    if (o.value.empty()) continue;
    s = ucp_config_modify(config, o.name, o.value.c_str());
    if (s != UCS_OK) {
      ucp_config_release(config);
      return InvalidArgument(std::string("ucx transport setting UCX_") + o.name + "=\"" + o.value +
                             "\" is not valid: " + ucx_status_text(s));
    }
  }
  auto setting = [&](const char* name, const std::string& value) {
    if (!value.empty()) return std::string(name) + "=" + value;
    const char* env = std::getenv(name);  // UCX's own variable, only to name it in messages
    return std::string(name) + "=" + (env != nullptr ? env : "<all>");
  };
  w->settings_ = setting("UCX_TLS", options.tls);
  const std::string devices = setting("UCX_NET_DEVICES", options.net_devices);
  if (devices != "UCX_NET_DEVICES=<all>") w->settings_ += " " + devices;

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = "refit";
  s = ucp_init(&params, config, &w->context_);
  ucp_config_release(config);
  if (s != UCS_OK) return FailedPrecondition("creating the UCX context (" + w->settings_ + "): " + ucx_status_text(s));

  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  s = ucp_context_query(w->context_, &attr);
  if (s != UCS_OK) return Internal("querying the UCX context: " + ucx_status_text(s));
  w->memory_types_ = attr.memory_types;

  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // mutex_ serializes every call
  s = ucp_worker_create(w->context_, &wparams, &w->worker_);
  if (s != UCS_OK) return FailedPrecondition("creating the UCX worker (" + w->settings_ + "): " + ucx_status_text(s));
  s = install_am_write_handlers(w->worker_, &w->am_);
  if (s != UCS_OK) return Internal("installing the UCX active message handlers: " + ucx_status_text(s));
  s = ucp_worker_get_efd(w->worker_, &w->event_fd_);
  if (s != UCS_OK) return Internal("getting the UCX worker's event fd: " + ucx_status_text(s));
  ucp_address_t* address = nullptr;
  std::size_t length = 0;
  s = ucp_worker_get_address(w->worker_, &address, &length);
  if (s != UCS_OK) return Internal("getting the UCX worker's address: " + ucx_status_text(s));
  const auto* bytes = reinterpret_cast<const unsigned char*>(address);
  w->address_.assign(bytes, bytes + length);
  ucp_worker_release_address(w->worker_, address);
  return w;
}

UcxWorker::~UcxWorker() {
  // Every lease holds a shared_ptr to this worker: no thread runs now.
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
}

void UcxWorker::progress(int rounds) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int i = 0; i < rounds && ucp_worker_progress(worker_) != 0; ++i) {
  }
}

bool UcxWorker::wait_for_event(std::chrono::milliseconds wait) {
  ucs_status_t armed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    armed = ucp_worker_arm(worker_);
  }
  if (armed == UCS_ERR_BUSY) return true;  // events are waiting: look again at once
  if (armed != UCS_OK) return false;
  pollfd fd{event_fd_, POLLIN, 0};
  return poll_until({&fd, 1}, Deadline::After(wait)) > 0;
}

UcxWorker::ProgressLease::ProgressLease(std::shared_ptr<UcxWorker> worker) : worker_(std::move(worker)) {
  std::lock_guard<std::mutex> lock(worker_->lease_mutex_);
  if (worker_->leases_++ == 0) worker_->start_progress();
}

UcxWorker::ProgressLease::~ProgressLease() {
  std::lock_guard<std::mutex> lock(worker_->lease_mutex_);
  if (--worker_->leases_ == 0) worker_->stop_progress();
}

void UcxWorker::start_progress() {
  stop_ = false;
  thread_ = std::thread([this] { progress_loop(); });
}

void UcxWorker::stop_progress() {
  stop_ = true;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ucp_worker_signal(worker_);  // wakes the thread from its sleep on the event fd
  }
  thread_.join();
}

void UcxWorker::progress_loop() {
  int idle = 0;
  bool reported = false;
  while (!stop_.load(std::memory_order_relaxed)) {
    ucs_status_t armed = UCS_OK;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (ucp_worker_progress(worker_) != 0) {
        idle = 0;
        continue;
      }
      if (++idle < kIdleSpins) continue;
      // No work for a while: sleep until the worker has an event. arm says
      // BUSY when events arrived since the last progress.
      armed = ucp_worker_arm(worker_);
    }
    idle = 0;
    if (armed == UCS_ERR_BUSY) continue;
    if (armed != UCS_OK && !reported) {
      reported = true;  // keep progressing by polling every kSleepMs
      log(LogLevel::kWarning, "refit ucx",
          "ucp_worker_arm failed (" + ucx_status_text(armed) + "); the progress thread polls instead");
    }
    pollfd fd{event_fd_, POLLIN, 0};
    (void)poll_until({&fd, 1}, Deadline::After(std::chrono::milliseconds(kSleepMs)));
  }
}

}  // namespace refit

#endif  // REFIT_HAVE_UCX
