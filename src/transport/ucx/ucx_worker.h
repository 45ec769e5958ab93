// UcxWorker: the UCP context and worker of one ucx Transport, shared (through
// shared_ptr) by every target and remote it made, and the progress thread
// that drives the worker while a target needs it. Private to
// src/transport/ucx; built only with UCX (REFIT_HAVE_UCX).
//
// Thread-safety contract: every call into UCP on this context or worker
// (progress, arm, put, flush, endpoint and memory calls) is made with mutex()
// held, so the worker is created in UCS_THREAD_MODE_SERIALIZED and the
// progress thread and callers (the trainer's poll, tests that hold a target
// and a remote in one process) never overlap inside UCP. Callbacks that UCP
// invokes from ucp_worker_progress (the endpoint error handler) therefore run
// with mutex() held and must not take it.
#pragma once

#if REFIT_HAVE_UCX

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "refit/status.h"
#include "transport/ucx/ucx_am_writes.h"
#include "transport/ucx/ucx_transport.h"

namespace refit {

// "Destination is unreachable (UCS_ERR_UNREACHABLE)": the UCX status in words.
std::string ucx_status_text(ucs_status_t status);

// UCX logs to stdout, where refit prints reports (demo --json): the first
// worker of a process routes UCX's log lines to refit::log (source "refit ucx"),
// unless UCX_LOG_FILE says where they go. While a UcxQuietLogs lives, this
// thread's UCX log lines below fatal are dropped: for calls whose failure
// refit handles and reports itself (an endpoint tried with peer error
// handling first).
class UcxQuietLogs {
 public:
  UcxQuietLogs();
  ~UcxQuietLogs();
  UcxQuietLogs(const UcxQuietLogs&) = delete;
  UcxQuietLogs& operator=(const UcxQuietLogs&) = delete;
};

class UcxWorker {
 public:
  // Reads UCX's configuration (its environment variables), applies `options`
  // over it, and creates the context (RMA, active message and wakeup
  // features) and the worker, with the active-message write handlers
  // (ucx_am_writes.h) installed. Unless UCX_TCP_TX_SEG_SIZE /
  // UCX_TCP_RX_SEG_SIZE are set, tcp segments are made large enough for one
  // write chunk per message (UCX's 8 KiB default costs most of the link).
  static StatusOr<std::shared_ptr<UcxWorker>> Create(const UcxOptions& options);
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  ucp_context_h context() const { return context_; }
  ucp_worker_h worker() const { return worker_; }
  std::mutex& mutex() { return mutex_; }
  // This worker's address (ucp_worker_get_address), for descriptors.
  const std::vector<unsigned char>& address() const { return address_; }
  // Bitmap of the ucs_memory_type_t this UCX build can register and move.
  std::uint64_t memory_types() const { return memory_types_; }
  // The transport-selection settings in effect, for messages: "UCX_TLS=tcp"
  // or "UCX_TLS=<all>", plus UCX_NET_DEVICES when set.
  const std::string& settings() const { return settings_; }
  // The active-message write state. REQUIRES: mutex() held.
  AmState& am() { return am_; }

  // The progress thread runs while at least one lease is alive (the first
  // starts it, the last one's destruction stops and joins it).
  class ProgressLease {
   public:
    explicit ProgressLease(std::shared_ptr<UcxWorker> worker);
    ~ProgressLease();
    ProgressLease(const ProgressLease&) = delete;
    ProgressLease& operator=(const ProgressLease&) = delete;

   private:
    std::shared_ptr<UcxWorker> worker_;
  };

  // Progresses the worker on the calling thread until it reports no more
  // work (at most `rounds` calls). Takes mutex().
  void progress(int rounds = 64);

  // Sleeps until the worker has an event or `wait` passed; false when it
  // did not sleep because events are already waiting (progress first).
  // Takes mutex() only to arm.
  bool wait_for_event(std::chrono::milliseconds wait);

 private:
  UcxWorker() = default;
  void start_progress();
  void stop_progress();
  void progress_loop();

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int event_fd_ = -1;
  std::vector<unsigned char> address_;
  std::uint64_t memory_types_ = 0;
  std::string settings_;
  std::mutex mutex_;  // see the thread-safety contract above
  AmState am_;        // guarded by mutex_; the handlers' argument

  std::mutex lease_mutex_;  // guards leases_ and thread_ (never held inside UCP)
  int leases_ = 0;
  std::thread thread_;
  std::atomic<bool> stop_{false};
};

}  // namespace refit

#endif  // REFIT_HAVE_UCX
