// The nccl transport's remote side (nccl_remote.h).
#include "transport/nccl/nccl_remote.h"

#if REFIT_HAVE_NCCL

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <span>
#include <utility>

#include "net/frames.h"
#include "cuda/ticket_queue.h"
#include "transport/nccl/nccl_communicator.h"

namespace refit::nccl_internal {
namespace {

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
    DataFrame frame;  // the bytes travel through NCCL, not the link
    frame.version = version;
    frame.slot = static_cast<std::uint64_t>(slot);
    frame.offset = offset;
    frame.length = bytes.size();
    Status sent = link_->send(encode(frame), {}, deadline);
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
    DataFrame frame;
    frame.flags = kNewCommunicator;
    frame.version = version;
    frame.slot = static_cast<std::uint64_t>(slot);
    frame.payload_bytes = kNcclUniqueIdBytes;
    Status sent =
        link_->send(encode(frame), std::span<const std::byte>(reinterpret_cast<const std::byte*>(&id), sizeof id), deadline);
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

}  // namespace

StatusOr<std::unique_ptr<RemoteTarget>> open_nccl_remote(const NcclDescriptor& d, Link* link, int device,
                                                         const std::string& what) {
  ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create(device));
  auto remote = std::make_unique<NcclRemote>(what, link, device, d.slots, d.slot_bytes, std::move(stream));
  ncclUniqueId id;
  std::memcpy(&id, d.id.data(), kNcclUniqueIdBytes);
  RETURN_IF_ERROR(remote->start(id));
  return std::unique_ptr<RemoteTarget>(std::move(remote));
}

}  // namespace refit::nccl_internal

#endif  // REFIT_HAVE_NCCL
