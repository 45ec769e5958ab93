// One side of a 2-rank NCCL communicator (Communicator), and what the nccl
// target (nccl_target.h) and remote (nccl_remote.h) share about it: the
// ranks, the frame flag that starts a new one after a relink, and the texts
// of its errors. Private to src/transport/nccl; built only with NCCL.
#pragma once

#if REFIT_HAVE_NCCL

#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>

#include "cuda/cuda_check.h"
#include "cuda/device.h"
#include "cuda/event_pool.h"
#include "net/frames.h"
#include "net/link.h"
#include "refit/deadline.h"
#include "refit/log.h"
#include "refit/status.h"
#include "transport/nccl/nccl_descriptor.h"
#include "transport/transport.h"

namespace refit::nccl_internal {

static_assert(sizeof(ncclUniqueId) == kNcclUniqueIdBytes, "ncclUniqueId changed size");

inline constexpr int kEngineRank = 0;   // NCCL rank of the engine in each 2-rank communicator
inline constexpr int kTrainerRank = 1;  // NCCL rank of the trainer

// FrameHeader::flags of an nccl kData frame. 0: a write announcement (no
// payload). kNewCommunicator: after a relink, the trainer's new ncclUniqueId
// (kNcclUniqueIdBytes of payload; a = version, b = slot, c = 0, d = 0).
inline constexpr std::uint16_t kNewCommunicator = 1;
static_assert(kNcclUniqueIdBytes <= kMaxAnnouncementBytes, "the id must fit an announcement");

// True when [offset, offset + bytes) of slot `slot` lies inside the pool.
bool in_range(std::uint64_t slot, std::uint64_t offset, std::uint64_t bytes, int slots, std::uint64_t slot_bytes);
// "(slots=S, slot_bytes=B)", for errors.
std::string pool_shape(int slots, std::uint64_t slot_bytes);
// A pointer as %p prints it, for errors.
std::string pointer_text(const void* p);
// NCCL's text for `r`, with the communicator's last error when it has one.
std::string nccl_error_text(ncclResult_t r, ncclComm_t comm);
// The status code of an NCCL failure (retry policy: status.h).
StatusCode nccl_code(ncclResult_t r);
// True when the link's socket reports that the peer closed its end (or died)
// or that the link was shut down locally (an abort). Never blocks.
bool link_lost(const Link& link);

// One side of a 2-rank non-blocking communicator, with every wait bounded.
// Not thread-safe: one thread at a time (the trainer's, or the engine's I/O
// thread).
class Communicator {
 public:
  // `who` names this side in errors ("engine rank 0's nccl pool on device 0").
  Communicator(std::string who, int device) : who_(std::move(who)), device_(device) {}
  ~Communicator() { abort(); }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  bool started() const { return comm_ != nullptr || !broken_.ok(); }
  // Aborts the communicator (if any) and forgets why it failed: start() may
  // run again, with a new id.
  void reset() {
    abort();
    broken_ = Status::Ok();
  }
  const Status& broken() const { return broken_; }
  ncclComm_t get() const { return comm_; }
  int device() const { return device_; }

  // Starts ncclCommInitRankConfig (blocking = 0) as `rank` of 2; returns at
  // once. The initialization finishes in NCCL's own thread: wait() for it.
  Status start(const ncclUniqueId& id, int rank, const std::string& peer) {
    ScopedDevice scope(device_);
    RETURN_IF_ERROR(scope.status().WithContext(who_ + ": creating the nccl communicator with " + peer));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&comm, 2, id, rank, &config);
    comm_ = comm;
    if (r != ncclSuccess && r != ncclInProgress) {
      return fail(Status(nccl_code(r), "ncclCommInitRankConfig(nranks=2, rank=" + std::to_string(rank) +
                                           ") failed: " + nccl_error_text(r, comm)),
                  "creating the communicator", peer);
    }
    return Status::Ok();
  }

  // Waits until the communicator's state is ncclSuccess (initialized, or the
  // last operation enqueued) and, when `event` is given, until it completed.
  // Fails (and aborts the communicator) on an NCCL error, a lost `link`, or
  // the deadline; the error names `phase` and the link's peer.
  Status wait(const std::string& phase, const Link* link, Deadline deadline, const CudaEvent* event = nullptr) {
    for (int spins = 0;; ++spins) {
      ASSIGN_OR_RETURN(bool done, look(phase, link, deadline, event));
      if (done) return Status::Ok();
      if (spins < 200) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  // One non-blocking look: true when ready (and `event` completed).
  StatusOr<bool> look(const std::string& phase, const Link* link, Deadline deadline, const CudaEvent* event) {
    const std::string peer = link != nullptr ? link->peer() : std::string("its peer");
    if (!broken_.ok()) return broken_;
    if (comm_ == nullptr) return fail(Internal("the communicator was never created"), phase, peer);
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) {
      return fail(Status(nccl_code(r), "ncclCommGetAsyncError failed: " + nccl_error_text(r, comm_)), phase, peer);
    }
    if (state != ncclSuccess && state != ncclInProgress) {
      return fail(Status(nccl_code(state), "NCCL reported " + nccl_error_text(state, comm_)), phase, peer);
    }
    if (state == ncclSuccess) {
      if (event == nullptr) return true;
      auto done = event->query();
      if (!done.ok()) return fail(done.status(), phase, peer);
      if (*done) return true;
    }
    if (link != nullptr && link_lost(*link)) {
      return fail(Unavailable("connection to " + peer + " closed or shut down (peer lost or refit aborted)"), phase,
                  peer);
    }
    if (deadline.expired()) return fail(DeadlineExceeded("timed out"), phase, peer);
    return false;
  }

  // Aborts the communicator and remembers why: every later use fails with it.
  Status fail(const Status& why, const std::string& phase, const std::string& peer) {
    abort();
    if (broken_.ok()) {
      broken_ = Status(why.code(), who_ + ": nccl " + phase + " with " + peer + " failed: " + why.message() +
                                       " (communicator aborted; the first refit after the relink creates a "
                                       "new one)");
    }
    return broken_;
  }

  // ncclCommAbort: returns without the peer's help, also mid-initialization
  // and with operations pending (their kernels stop).
  void abort() {
    if (comm_ == nullptr) return;
    ScopedDevice scope(device_);
    const ncclResult_t r = ncclCommAbort(comm_);
    if (r != ncclSuccess && r != ncclInProgress) {
      log(LogLevel::kError, "refit nccl", who_ + ": ncclCommAbort failed: " + ncclGetErrorString(r));
    }
    comm_ = nullptr;
  }

  // After ncclSend/ncclRecv returned `r`: ok, in progress (wait() for the
  // state), or a failure.
  Status enqueued(ncclResult_t r, const std::string& call, const std::string& phase, const std::string& peer) {
    if (r == ncclSuccess || r == ncclInProgress) return Status::Ok();
    return fail(Status(nccl_code(r), call + " failed: " + nccl_error_text(r, comm_)), phase, peer);
  }

 private:
  std::string who_;
  int device_;
  ncclComm_t comm_ = nullptr;
  Status broken_;
};

}  // namespace refit::nccl_internal

#endif  // REFIT_HAVE_NCCL
