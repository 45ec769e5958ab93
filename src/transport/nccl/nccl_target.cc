// The nccl transport's target side (nccl_target.h).
#include "transport/nccl/nccl_target.h"

#if REFIT_HAVE_NCCL

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <mutex>
#include <span>
#include <utility>

#include "net/frames.h"
#include "transport/nccl/nccl_communicator.h"
#include "transport/nccl/nccl_descriptor.h"

namespace refit::nccl_internal {
namespace {

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
    ASSIGN_OR_RETURN(const DataFrame data, decode_data(header, link.peer()));
    const std::uint64_t slot = data.slot, offset = data.offset, bytes = data.length;
    if (header.payload_bytes != 0) {
      return InvalidArgument("protocol error: kData frame from " + link.peer() + " for " + whose_ + " carries " +
                             std::to_string(header.payload_bytes) +
                             " payload bytes; nccl frames carry none (the bytes travel through NCCL)");
    }
    if (!in_range(slot, offset, bytes, slots_, slot_bytes_)) {
      return InvalidArgument("bad kData frame from " + link.peer() + " (version " + std::to_string(data.version) +
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
        std::to_string(offset) + " (refit " + std::to_string(data.version) + ")";
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
  // The sender may be a new feeder (many engines: the trainer or relay
  // parent that took the place of a dropped engine; the receiver admitted
  // its link as this rank's feeder): it feeds this target from now on.
  Status new_communicator_locked(Link& link, const FrameHeader& header, Deadline deadline) {
    ASSIGN_OR_RETURN(const DataFrame data, decode_data(header, link.peer()));
    if (data.payload_bytes != kNcclUniqueIdBytes || data.length != 0 || data.slot >= static_cast<std::uint64_t>(slots_)) {
      return InvalidArgument("protocol error: new-communicator frame from " + link.peer() + " for " + whose_ +
                             " carries " + std::to_string(header.payload_bytes) + " payload bytes (expected " +
                             std::to_string(kNcclUniqueIdBytes) + "), length " + std::to_string(data.length) +
                             " (expected 0), slot " + std::to_string(data.slot) + " " +
                             pool_shape(slots_, slot_bytes_));
    }
    if (!peer_.empty() && peer_ != link.peer()) {
      log(LogLevel::kInfo, "refit nccl", whose_ + ": fed by " + link.peer() + " from now on (before: " + peer_ + ")");
    }
    peer_ = link.peer();
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
            " (after a relink, refit " + std::to_string(data.version) + ")");
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

}  // namespace

StatusOr<std::unique_ptr<TargetMemory>> make_nccl_target(const std::string& whose, int device, DeviceBuffer pool,
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
                                                      format_nccl_descriptor(d), std::move(stream), std::move(done)));
}

}  // namespace refit::nccl_internal

#endif  // REFIT_HAVE_NCCL
