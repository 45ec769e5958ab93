#include "transport/nccl/nccl_transport.h"

#if REFIT_HAVE_NCCL

#include <cuda_runtime.h>
#include <nccl.h>
#include <poll.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/event_pool.h"
#include "cuda/ticket_queue.h"
#include "net/poll_wait.h"
#include "refit/log.h"
#include "cuda/device.h"
#include "cuda/device.h"
#include "transport/nccl/nccl_descriptor.h"
#include "transport/pool_layout.h"

namespace refit {
namespace {

static_assert(sizeof(ncclUniqueId) == kNcclUniqueIdBytes, "ncclUniqueId changed size");

constexpr int kEngineRank = 0;   // NCCL rank of the engine in each 2-rank communicator
constexpr int kTrainerRank = 1;  // NCCL rank of the trainer

// FrameHeader::flags of an nccl kData frame. 0: a write announcement (no
// payload). kNewCommunicator: after a relink, the trainer's new ncclUniqueId
// (kNcclUniqueIdBytes of payload; a = version, b = slot, c = 0, d = 0).
constexpr std::uint16_t kNewCommunicator = 1;
static_assert(kNcclUniqueIdBytes <= kMaxAnnouncementBytes, "the id must fit an announcement");

std::string pointer_text(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

bool in_range(std::uint64_t slot, std::uint64_t offset, std::uint64_t bytes, int slots, std::uint64_t slot_bytes) {
  return slot < static_cast<std::uint64_t>(slots) && offset <= slot_bytes && bytes <= slot_bytes - offset;
}

std::string pool_shape(int slots, std::uint64_t slot_bytes) {
  return "(slots=" + std::to_string(slots) + ", slot_bytes=" + std::to_string(slot_bytes) + ")";
}

std::string nccl_error_text(ncclResult_t r, ncclComm_t comm) {
  std::string s = std::string(ncclGetErrorString(r)) + " (ncclResult " + std::to_string(static_cast<int>(r)) + ")";
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') s += ": " + std::string(last);
  return s;
}

StatusCode nccl_code(ncclResult_t r) {
  switch (r) {
    case ncclRemoteError:
    case ncclSystemError: return StatusCode::kUnavailable;
    case ncclInvalidArgument:
    case ncclInvalidUsage: return StatusCode::kFailedPrecondition;
    default: return StatusCode::kInternal;
  }
}

// True when the link's socket reports that the peer closed its end (or died)
// or that the link was shut down locally (an abort). Never blocks.
bool link_lost(const Link& link) {
  pollfd p{link.fd(), POLLRDHUP, 0};
  return poll_until({&p, 1}, Deadline::After(std::chrono::milliseconds(0))) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

// ------------------------------------------------------------ one communicator

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

Status check_device(int device, const std::string& what) {
  if (device < 0) {
    return FailedPrecondition(what + " needs a CUDA device (device=" + std::to_string(device) +
                              "; a local index inside CUDA_VISIBLE_DEVICES)");
  }
  auto count = cuda_device_count();
  if (!count.ok()) return count.status().WithContext(what);
  if (device >= *count) {
    return FailedPrecondition(what + ": device " + std::to_string(device) + " is not visible; this process sees " +
                              std::to_string(*count) + " CUDA device(s)");
  }
  return Status::Ok();
}

// ------------------------------------------------------------ target side

class NcclTarget final : public TargetMemory {
 public:
  NcclTarget(std::string whose, int device, DeviceBuffer pool, std::byte* base, int slots, std::uint64_t slot_bytes,
             const ncclUniqueId& id, std::string descriptor, CudaStream stream, CudaEvent done)
      : whose_(std::move(whose)),
        device_(device),
        pool_(std::move(pool)),
        base_(base),
        slots_(slots),
        slot_bytes_(slot_bytes),
        id_(id),
        descriptor_(std::move(descriptor)),
        stream_(std::move(stream)),
        done_(std::move(done)),
        comm_(whose_, device) {}

  ~NcclTarget() override {
    std::lock_guard<std::mutex> lock(mu_);
    comm_.abort();  // before the stream, the event and the pool go
    if (Status s = stream_.synchronize(); !s.ok()) {
      log(LogLevel::kError, "refit nccl", "closing " + whose_ + ": " + s.ToString());
    }
  }

  std::string descriptor() const override { return descriptor_; }
  int slots() const override { return slots_; }
  std::uint64_t slot_bytes() const override { return slot_bytes_; }
  MemoryKind memory() const override { return MemoryKind::kCuda; }
  int device() const override { return device_; }
  std::byte* slot(int i) override {
    if (i < 0 || i >= slots_) return nullptr;
    return base_ + static_cast<std::uint64_t>(i) * slot_bytes_;
  }

  Status receive_data(Link& link, const FrameHeader& header, Deadline deadline) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (header.type != FrameType::kData) {
      return Internal("receive_data for " + whose_ + " called with a frame of type " +
                      std::to_string(static_cast<int>(header.type)) + " from " + link.peer() + " (expected kData)");
    }
    if (header.flags == kNewCommunicator) return new_communicator_locked(link, header, deadline);
    if (header.flags != 0) {
      return InvalidArgument("protocol error: kData frame from " + link.peer() + " for " + whose_ + " has flags " +
                             std::to_string(header.flags) + " (nccl knows 0 and " +
                             std::to_string(kNewCommunicator) + ")");
    }
    const std::uint64_t slot = header.b, offset = header.c, bytes = header.d;
    if (header.payload_bytes != 0) {
      return InvalidArgument("protocol error: kData frame from " + link.peer() + " for " + whose_ + " carries " +
                             std::to_string(header.payload_bytes) +
                             " payload bytes; nccl frames carry none (the bytes travel through NCCL)");
    }
    if (!in_range(slot, offset, bytes, slots_, slot_bytes_)) {
      return InvalidArgument("bad kData frame from " + link.peer() + " (version " + std::to_string(header.a) +
                             "): " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
                             " into slot " + std::to_string(slot) + " are outside " + whose_ + " " +
                             pool_shape(slots_, slot_bytes_));
    }
    RETURN_IF_ERROR(check_peer_locked(link));
    RETURN_IF_ERROR(start_locked(link.peer()));
    RETURN_IF_ERROR(comm_.wait("initializing the communicator", &link, deadline));
    if (bytes == 0) return Status::Ok();
    const std::string phase =
        "receiving " + std::to_string(bytes) + " bytes into slot " + std::to_string(slot) + " at offset " +
        std::to_string(offset) + " (refit " + std::to_string(header.a) + ")";
    {
      ScopedDevice scope(device_);
      RETURN_IF_ERROR(scope.status().WithContext(whose_ + ": " + phase));
      std::byte* dst = base_ + slot * slot_bytes_ + offset;
      const ncclResult_t r = ncclRecv(dst, static_cast<std::size_t>(bytes), ncclUint8, kTrainerRank, comm_.get(),
                                      static_cast<cudaStream_t>(stream_.handle()));
      RETURN_IF_ERROR(comm_.enqueued(r, "ncclRecv", phase, link.peer()));
      RETURN_IF_ERROR(comm_.wait(phase, &link, deadline));  // enqueued
      Status recorded = done_.record(stream_.handle());
      if (!recorded.ok()) return comm_.fail(recorded, phase, link.peer());
    }
    // The bytes are in device memory before the next frame (kLanded) is read.
    return comm_.wait(phase, &link, deadline, &done_);
  }

  // Every initiator has opened the target: start this side's initialization
  // (it completes in NCCL's thread while the trainers set up theirs).
  Status seal() override {
    std::lock_guard<std::mutex> lock(mu_);
    return start_locked("its trainer rank");
  }

 private:
  // REQUIRES: mu_ held. The first trainer to send a frame feeds this target;
  // frames from any other fail.
  Status check_peer_locked(const Link& link) {
    if (peer_.empty()) {
      peer_ = link.peer();
    } else if (peer_ != link.peer()) {
      return FailedPrecondition(whose_ + " is fed by " + peer_ + " and got a frame from " + link.peer() +
                                ": an nccl target takes one trainer rank (its 2-rank communicator); run as many "
                                "trainer ranks as engine ranks (--trainer-ranks = --engine-ranks)");
    }
    return Status::Ok();
  }

  // REQUIRES: mu_ held. After a relink the trainer's first frame carries the
  // id of a new communicator (it hosts its bootstrap): the old one (aborted
  // by the failed refit, or still alive with nothing pending) is aborted and
  // this side of the new one starts; the next frame's receive waits for it.
  Status new_communicator_locked(Link& link, const FrameHeader& header, Deadline deadline) {
    if (header.payload_bytes != kNcclUniqueIdBytes || header.d != 0 ||
        header.b >= static_cast<std::uint64_t>(slots_)) {
      return InvalidArgument("protocol error: new-communicator frame from " + link.peer() + " for " + whose_ +
                             " carries " + std::to_string(header.payload_bytes) + " payload bytes (expected " +
                             std::to_string(kNcclUniqueIdBytes) + "), d " + std::to_string(header.d) +
                             " (expected 0), slot " + std::to_string(header.b) + " " +
                             pool_shape(slots_, slot_bytes_));
    }
    RETURN_IF_ERROR(check_peer_locked(link));
    ncclUniqueId id;
    RETURN_IF_ERROR(link.recv_payload(std::span<std::byte>(reinterpret_cast<std::byte*>(&id), sizeof id), deadline)
                        .WithContext(whose_ + ": reading the new communicator's id from " + link.peer()));
    comm_.reset();  // its kernels stop: nothing writes into the pool any more
    if (Status s = stream_.synchronize(); !s.ok()) {
      return comm_.fail(s, "draining the aborted communicator's stream", link.peer());
    }
    ++generation_;
    log(LogLevel::kInfo, "refit nccl",
        whose_ + ": new communicator " + std::to_string(generation_) + " with " + link.peer() +
            " (after a relink, refit " + std::to_string(header.a) + ")");
    return comm_.start(id, kEngineRank, link.peer());
  }

  // REQUIRES: mu_ held.
  Status start_locked(const std::string& peer) {
    if (comm_.started()) return comm_.broken();
    return comm_.start(id_, kEngineRank, peer);
  }

  const std::string whose_;
  const int device_;
  DeviceBuffer pool_;  // empty for exposed memory (the caller owns it)
  std::byte* const base_;
  const int slots_;
  const std::uint64_t slot_bytes_;
  const ncclUniqueId id_;
  const std::string descriptor_;
  std::mutex mu_;  // seal() (setup thread) vs receive_data (the receiver's I/O thread)
  CudaStream stream_;
  CudaEvent done_;
  std::string peer_;  // the one trainer that feeds this target, once it sent a frame
  int generation_ = 1;  // communicators made: the descriptor's, then one per relink
  Communicator comm_;
};

// ------------------------------------------------------------ initiator side

class NcclRemote final : public RemoteTarget {
 public:
  NcclRemote(std::string what, Link* link, int device, int slots, std::uint64_t slot_bytes, CudaStream stream)
      : what_(std::move(what)),
        link_(link),
        device_(device),
        slots_(slots),
        slot_bytes_(slot_bytes),
        stream_(std::move(stream)),
        comm_(what_, device),
        events_(device) {}

  ~NcclRemote() override {
    // Sends still queued read the caller's buffers: stop them, then wait.
    comm_.abort();
    if (Status s = stream_.synchronize(); !s.ok()) {
      log(LogLevel::kError, "refit nccl", "closing " + what_ + ": " + s.ToString());
    }
  }

  Status start(const ncclUniqueId& id) { return comm_.start(id, kTrainerRank, link_->peer()); }

  std::byte* mapped_slot(int) override { return nullptr; }

  // Either side's communicator may have been aborted by the failed refit,
  // and a send that was never received may still be queued: abort this
  // side's, wait for its stream, forget every ticket; the next submit makes
  // a new communicator (new_communicator).
  Status relinked() override {
    comm_.reset();
    if (Status s = stream_.synchronize(); !s.ok()) {
      return s.WithContext(what_ + ": draining the aborted communicator's stream after the relink");
    }
    pending_.retire_all([&](Pending&& p) { events_.give_back(std::move(p.event)); });
    need_new_communicator_ = true;
    return Status::Ok();
  }

  StatusOr<Ticket> submit(int slot, std::uint64_t offset, std::span<const std::byte> bytes, std::uint64_t version,
                          Deadline deadline) override {
    if (slot < 0 || !in_range(static_cast<std::uint64_t>(slot), offset, bytes.size(), slots_, slot_bytes_)) {
      return InvalidArgument("write of " + std::to_string(bytes.size()) + " bytes at offset " +
                             std::to_string(offset) + " into slot " + std::to_string(slot) + " of " + what_ +
                             " is out of range " + pool_shape(slots_, slot_bytes_));
    }
    const std::string phase = "sending " + std::to_string(bytes.size()) + " bytes into slot " +
                              std::to_string(slot) + " at offset " + std::to_string(offset) + " (refit " +
                              std::to_string(version) + ")";
    if (need_new_communicator_) RETURN_IF_ERROR(new_communicator(slot, version, deadline));
    RETURN_IF_ERROR(comm_.wait("initializing the communicator", link_, deadline));
    if (!bytes.empty()) {
      cudaPointerAttributes attr{};
      const cudaError_t err = cudaPointerGetAttributes(&attr, bytes.data());
      if (err != cudaSuccess) (void)cudaGetLastError();
      if (err != cudaSuccess || attr.type != cudaMemoryTypeDevice || attr.device != device_) {
        return FailedPrecondition(what_ + ": " + phase + ": the bytes at " + pointer_text(bytes.data()) +
                                  " are not device memory of device " + std::to_string(device_) +
                                  " (the communicator's device, the initiator's device at open_target_on): " +
                                  (err != cudaSuccess ? std::string(cudaGetErrorString(err))
                                                      : "memory type " + std::to_string(static_cast<int>(attr.type)) +
                                                            " on device " + std::to_string(attr.device)));
      }
    }
    ASSIGN_OR_RETURN(CudaEvent event, events_.take());
    // The announcement goes first: the engine posts the matching ncclRecv
    // when it reads it, and NCCL connects the pair lazily at the first
    // send/recv, so the send cannot finish enqueuing (nor complete) before
    // the engine took part. A send that then fails leaves the engine waiting
    // for bytes: the communicator is aborted and the refit fails, which
    // shuts the engine's link down.
    FrameHeader h;
    h.type = FrameType::kData;
    h.a = version;
    h.b = static_cast<std::uint64_t>(slot);
    h.c = offset;
    h.d = bytes.size();
    h.payload_bytes = 0;
    Status sent = link_->send(h, {}, deadline);
    if (!sent.ok()) return comm_.fail(sent, phase, link_->peer());
    if (!bytes.empty()) {
      ScopedDevice scope(device_);
      RETURN_IF_ERROR(scope.status().WithContext(what_ + ": " + phase));
      const ncclResult_t r = ncclSend(bytes.data(), bytes.size(), ncclUint8, kEngineRank, comm_.get(),
                                      static_cast<cudaStream_t>(stream_.handle()));
      RETURN_IF_ERROR(comm_.enqueued(r, "ncclSend", phase, link_->peer()));
      RETURN_IF_ERROR(comm_.wait(phase, link_, deadline));  // enqueued
      Status recorded = event.record(stream_.handle());
      if (!recorded.ok()) return comm_.fail(recorded, phase, link_->peer());
    }
    return pending_.push(Pending{std::move(event), deadline, phase, bytes.empty()});
  }

  StatusOr<bool> poll(Ticket ticket) override {
    return pending_.poll(
        ticket, what_,
        [&](const Pending& p) -> StatusOr<bool> {
          if (p.empty) return true;
          return comm_.look(p.phase, link_, p.deadline, &p.event);
        },
        [&](Pending&& p) { events_.give_back(std::move(p.event)); });
  }

  // A send cannot be withdrawn from NCCL: a ticket still pending aborts the
  // communicator (its kernels stop; every later submit fails).
  void cancel(Ticket ticket) override {
    if (!pending_.pending(ticket)) return;
    (void)comm_.fail(Aborted("cancelled by the caller"), pending_.front()->phase, link_->peer());
  }

 private:
  // After relinked(): makes a new ncclUniqueId (its bootstrap root listens
  // in this process), sends it to the engine on the new link (a kData frame
  // with flags kNewCommunicator and the id as payload, for the slot the
  // first write goes to, which the engine's receiver checks is granted) and
  // starts this side; the engine starts its side when it reads the frame.
  Status new_communicator(int slot, std::uint64_t version, Deadline deadline) {
    const std::string phase = "creating a new communicator after the relink (refit " + std::to_string(version) + ")";
    ncclUniqueId id;
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
      return comm_.fail(Status(nccl_code(r), "ncclGetUniqueId failed: " + nccl_error_text(r, nullptr) +
                                                 " (NCCL_SOCKET_IFNAME names the interface its bootstrap listens on)"),
                        phase, link_->peer());
    }
    FrameHeader h;
    h.type = FrameType::kData;
    h.flags = kNewCommunicator;
    h.a = version;
    h.b = static_cast<std::uint64_t>(slot);
    h.c = 0;
    h.d = 0;
    h.payload_bytes = kNcclUniqueIdBytes;
    Status sent =
        link_->send(h, std::span<const std::byte>(reinterpret_cast<const std::byte*>(&id), sizeof id), deadline);
    if (!sent.ok()) return comm_.fail(sent, phase, link_->peer());
    need_new_communicator_ = false;
    return comm_.start(id, kTrainerRank, link_->peer());
  }

  struct Pending {
    CudaEvent event;
    Deadline deadline;
    std::string phase;
    bool empty;  // nothing was sent (zero bytes)
  };

  std::string what_;
  Link* link_;
  int device_;
  int slots_;
  std::uint64_t slot_bytes_;
  CudaStream stream_;
  Communicator comm_;
  TicketQueue<Pending> pending_;        // one entry per send, in stream order
  EventPool events_;                    // recorded and completed: reusable
  bool need_new_communicator_ = false;  // relinked() ran; no submit since
};

// ------------------------------------------------------------ the transport

class NcclTransport final : public Transport {
 public:
  std::string name() const override { return "nccl"; }
  TransportCapabilities capabilities() const override {
    TransportCapabilities c;
    c.one_sided = false;
    // submit moves the bytes itself (ncclSend), never as a kData payload: the
    // trainer takes its remote-write path (packs into its own device buffers,
    // submits each bucket, or in direct mode each run at its arena offset).
    // Unlike ucx, a payload-less kData frame announces each write, which the
    // target's receive_data turns into the matching ncclRecv.
    c.remote_write = true;
    c.cross_host = true;
    c.host_memory = false;
    c.device_memory = true;
    c.direct = true;
    c.one_initiator = true;  // one 2-rank communicator per target (nccl_transport.h)
    return c;
  }

  StatusOr<std::unique_ptr<TargetMemory>> create_target(const PoolOptions& options) override {
    const std::string owner = pool_owner(options);
    if (options.memory != MemoryKind::kCuda) {
      return FailedPrecondition("nccl moves device memory; " + owner + "'s pool is host memory (use --device cuda)");
    }
    ASSIGN_OR_RETURN(const std::uint64_t size,
                     validated_pool_bytes(options, std::numeric_limits<std::uint64_t>::max()));
    const std::string whose = owner + "'s nccl pool on device " + std::to_string(options.device);
    RETURN_IF_ERROR(check_device(options.device, whose));
    auto pool = DeviceBuffer::Allocate(options.device, size);
    if (!pool.ok()) return pool.status().WithContext("allocating " + whose);
    std::byte* base = pool->data();
    return make_target(whose, options.device, std::move(*pool), base, options.slots, options.slot_bytes);
  }

  StatusOr<std::unique_ptr<TargetMemory>> expose_memory(std::byte* base, std::uint64_t bytes, MemoryKind memory,
                                                        int device) override {
    const std::string what = "memory exposed at " + pointer_text(base) + " (" + std::to_string(bytes) +
                             " bytes) on device " + std::to_string(device);
    if (memory != MemoryKind::kCuda) {
      return FailedPrecondition("nccl moves device memory; the " + what + " is host memory");
    }
    if (base == nullptr || bytes == 0) {
      return InvalidArgument("nccl cannot expose " + what + ": base must be non-null and bytes positive");
    }
    RETURN_IF_ERROR(check_device(device, what));
    cudaPointerAttributes attr{};
    RETURN_IF_ERROR(cuda_check(cudaPointerGetAttributes(&attr, base), "cudaPointerGetAttributes for " + what));
    if (attr.type != cudaMemoryTypeDevice || attr.device != device) {
      return FailedPrecondition("nccl cannot expose " + what + ": it is not device memory of device " +
                                std::to_string(device) + " (cudaPointerGetAttributes: type " +
                                std::to_string(static_cast<int>(attr.type)) + ", device " +
                                std::to_string(attr.device) + ")");
    }
    return make_target("nccl " + what, device, DeviceBuffer(), base, 1, bytes);
  }

  // Without a device: the calling thread's current one.
  StatusOr<std::unique_ptr<RemoteTarget>> open_target(const std::string& descriptor, Link* link) override {
    int device = -1;
    RETURN_IF_ERROR(cuda_check(cudaGetDevice(&device), "cudaGetDevice opening the nccl target of " +
                                                           (link != nullptr ? link->peer() : std::string("?"))));
    return open_target_on(descriptor, link, device);
  }

  StatusOr<std::unique_ptr<RemoteTarget>> open_target_on(const std::string& descriptor, Link* link,
                                                         int device) override {
    ASSIGN_OR_RETURN(const NcclDescriptor d, parse_nccl_descriptor(descriptor));
    if (link == nullptr) {
      return InvalidArgument("nccl target \"" + descriptor.substr(0, 40) + "...\" needs the data-plane link (got none)");
    }
    int local_version = 0;
    const ncclResult_t vr = ncclGetVersion(&local_version);
    if (vr != ncclSuccess) return Internal("ncclGetVersion failed: " + std::string(ncclGetErrorString(vr)));
    if (local_version != d.version) {
      return FailedPrecondition("cannot open the nccl target of " + link->peer() + ": it runs NCCL version code " +
                                std::to_string(d.version) + ", this process " + std::to_string(local_version) +
                                " (both ranks of a communicator must load the same libnccl)");
    }
    const std::string what = "nccl target of " + link->peer() + " (from device " + std::to_string(device) + ")";
    RETURN_IF_ERROR(check_device(device, "the trainer side of the " + what +
                                             " (nccl sends from device memory; -1 is host memory)"));
    ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create(device));
    auto remote = std::make_unique<NcclRemote>(what, link, device, d.slots, d.slot_bytes, std::move(stream));
    ncclUniqueId id;
    std::memcpy(&id, d.id.data(), kNcclUniqueIdBytes);
    RETURN_IF_ERROR(remote->start(id));
    return std::unique_ptr<RemoteTarget>(std::move(remote));
  }

 private:
  // Makes the target's unique id (and with it NCCL's bootstrap listener in
  // this process) and its descriptor.
  static StatusOr<std::unique_ptr<TargetMemory>> make_target(const std::string& whose, int device, DeviceBuffer pool,
                                                             std::byte* base, int slots, std::uint64_t slot_bytes) {
    int version = 0;
    ncclResult_t r = ncclGetVersion(&version);
    if (r != ncclSuccess) return Internal(whose + ": ncclGetVersion failed: " + std::string(ncclGetErrorString(r)));
    ncclUniqueId id;
    r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
      return Status(nccl_code(r), whose + ": ncclGetUniqueId failed: " + nccl_error_text(r, nullptr) +
                                      " (NCCL_SOCKET_IFNAME names the interface its bootstrap listens on)");
    }
    NcclDescriptor d;
    d.version = version;
    d.slots = slots;
    d.slot_bytes = slot_bytes;
    std::memcpy(d.id.data(), &id, kNcclUniqueIdBytes);
    ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create(device));
    ASSIGN_OR_RETURN(CudaEvent done, CudaEvent::Create(device));
    return std::unique_ptr<TargetMemory>(new NcclTarget(whose, device, std::move(pool), base, slots, slot_bytes, id,
                                                        format_nccl_descriptor(d), std::move(stream),
                                                        std::move(done)));
  }
};

}  // namespace

std::unique_ptr<Transport> make_nccl_transport() {
  // NVLink SHARP (multicast) serves collectives, never these 2-rank
  // point-to-point communicators, and the GPU machines' notes require it off:
  // set NCCL_NVLS_ENABLE=0 unless the user chose otherwise, before any
  // communicator exists (NCCL reads it at initialization).
  static const bool nvls_off = [] { return ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0) == 0; }();
  (void)nvls_off;
  return std::make_unique<NcclTransport>();
}

}  // namespace refit

#endif  // REFIT_HAVE_NCCL
