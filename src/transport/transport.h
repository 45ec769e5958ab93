// Transport: how the bytes of a bucket get from a trainer rank into a slot of
// an engine rank's receive pool.
//
// Every transport (shm, tcp, cuda_ipc, ucx, nccl) implements the same
// three small interfaces, so nothing above them knows which one runs:
//
//   Transport     a factory per process; capabilities; creates the two ends.
//   TargetMemory  the engine side: the receive pool, allocated and registered
//                 ONCE at setup (a POSIX shm segment, a socket-fed buffer, a
//                 CUDA IPC export ...). Exposes a descriptor string that
//                 initiators use to reach it.
//   RemoteTarget  the trainer side's handle to one TargetMemory, opened ONCE
//                 from its descriptor: submit writes into a slot, poll for
//                 completion, cancel.
//
// Notifications (credits, "bucket landed") do not belong to the transport:
// they travel over the data-plane Link between the two ranks, in order after
// the bytes they announce. A two-sided transport (tcp) sends its bytes over
// that same Link as kData frames and the TargetMemory reads them
// (`receive_data`); a one-sided transport (shm) writes them directly and never
// sees a kData frame.
//
// Completion contract: once poll(ticket) has returned true, the bytes are
// visible to the target process (for tcp: written to the link in order before
// anything sent after them; for cuda_ipc: the copy into the device memory has
// finished). The source buffer may be reused once poll has returned true, or
// once the RemoteTarget was destroyed (a cancelled copy may still be reading
// it until then).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "refit/deadline.h"
#include "net/link.h"
#include "refit/status.h"
#include "refit/transports.h"
#include "refit/tensor.h"

namespace refit {

struct TransportCapabilities {
  bool one_sided = false;      // the initiator can address the target's memory directly (mapped_slot)
  bool remote_write = false;   // submit moves the bytes itself though mapped_slot is nullptr (ucx put, nccl
                               // send): they never travel as a kData payload (nccl announces each write with a
                               // payload-less kData frame that the target's receive_data turns into its recv)
  bool cross_host = false;     // works between hosts
  bool host_memory = true;     // can target host memory
  bool device_memory = false;  // can target CUDA device memory
  bool device_memory_staged = false;  // ... but only through pinned host buffers (the transport cannot register
                                      // device memory; ucx without CUDA support): reports say "host-staged"
  bool direct = false;         // can expose existing memory for one-sided writes: direct mode (expose_memory)
  bool one_initiator = false;  // a target takes ONE initiator (nccl: one 2-rank communicator per target), so
                               // --trainer-ranks must equal --engine-ranks (refused at setup otherwise)
};

// The largest payload a kData frame of a remote_write transport may carry:
// an in-band announcement (nccl: a new communicator's id after a relink),
// never bucket bytes. Direct-mode engines read frames with this bound.
inline constexpr std::uint64_t kMaxAnnouncementBytes = 4096;

struct PoolOptions {
  int slots = 2;                   // staging buffers in the rotating pool
  std::uint64_t slot_bytes = 0;    // = pool_slot_bytes(plan)
  MemoryKind memory = MemoryKind::kHost;
  int device = -1;                 // local CUDA index for kCuda
  std::string owner;               // names the pool in errors and in shm names ("engine rank 2")
};

// The engine side. Owns the pool memory; freed (and any OS object removed) in
// the destructor. Thread safety: slot() and descriptor() are safe from any
// thread; receive_data is called by one I/O thread at a time.
class TargetMemory {
 public:
  virtual ~TargetMemory() = default;
  virtual std::string descriptor() const = 0;
  virtual int slots() const = 0;
  virtual std::uint64_t slot_bytes() const = 0;
  // Local address of slot i (0 <= i < slots()); nullptr out of range. A
  // device address when memory() is kCuda: read it on a stream of device().
  virtual std::byte* slot(int i) = 0;
  // Where the slots live: kHost, or kCuda on device() (a local CUDA index;
  // -1 for host memory).
  virtual MemoryKind memory() const = 0;
  virtual int device() const = 0;
  // Handles one kData frame whose header was just read from `link`: reads its
  // payload into the slot it names. One-sided transports return an error
  // (they never expect one).
  virtual Status receive_data(Link& link, const FrameHeader& header, Deadline deadline) = 0;
  // Returns once the bytes of slot i are in place, for transports whose
  // initiators may announce a bucket (kLanded) before its writes finished
  // (cuda_ipc: a cross-process event per slot, recorded after the writes).
  // `interrupted` is polled while waiting; a non-OK status from it, or the
  // deadline, ends the wait with that error. Call it after kLanded for the
  // slot and before reading it. Default: in place when kLanded arrives.
  virtual Status wait_landed(int slot, Deadline deadline, const std::function<Status()>& interrupted) {
    (void)slot;
    (void)deadline;
    (void)interrupted;
    return Status::Ok();
  }
  // Called once every initiator has opened this target (after their kHello).
  // Transports whose OS objects have names remove the names now, so nothing
  // is left behind if this process is killed later; already-mapped peers keep
  // access. Idempotent.
  virtual Status seal() = 0;
  // Recovery, before the engine accepts its trainers' links again: a trainer
  // rank may come back as a new process (a replacement, CoordinatorOptions::
  // trainer_replace_timeout_s) that has to open this target, so serve it to
  // new initiators again until the next seal(). True when it does (the
  // caller seals it again once the links are in); false, the default, when
  // nothing was withdrawn at seal().
  virtual StatusOr<bool> unseal() { return false; }
};

using Ticket = std::uint64_t;

// The trainer side's handle to one engine rank's TargetMemory.
// Thread safety: one thread at a time.
class RemoteTarget {
 public:
  virtual ~RemoteTarget() = default;
  // Address the initiator may write into directly (pack in place), or
  // nullptr when the transport is two-sided (or `slot` is out of range;
  // submit then reports the error). Bytes written there are visible to the
  // target once a frame sent on the link after the write is received.
  virtual std::byte* mapped_slot(int slot) = 0;
  // Starts writing `bytes` into `slot` at `offset`.
  virtual StatusOr<Ticket> submit(int slot, std::uint64_t offset, std::span<const std::byte> bytes,
                                  std::uint64_t version, Deadline deadline) = 0;
  // True once the write completed (see the completion contract above).
  virtual StatusOr<bool> poll(Ticket ticket) = 0;
  // Best effort: a cancelled ticket may still complete; poll until it is done
  // or drop the target.
  virtual void cancel(Ticket ticket) = 0;
  // Orders the end of the writes queued so far on `stream` (a CUDA stream of
  // the initiator's writing device) into `slot` with the target: true when
  // the transport did (the target's wait_landed waits for them), so kLanded
  // may go out before they finish; false when the initiator must wait for
  // them itself before kLanded. Default: false.
  virtual StatusOr<bool> record_landed(int slot, void* stream) {
    (void)slot;
    (void)stream;
    return false;
  }
  // Recovery after a failed refit: the data-plane Link this target was
  // opened with has just been replaced (Link::adopt) and every earlier ticket
  // is abandoned (cancelled or complete). Transports whose connection to the
  // target lives apart from the Link and may have failed on either side
  // rebuild it here or at the next submit, telling the target in-band on the
  // new Link (nccl: aborts its communicator; the next submit makes a new one
  // and announces its id in a kData frame). Called before any submit on the
  // new Link. Default: nothing to rebuild.
  virtual Status relinked() { return Status::Ok(); }
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string name() const = 0;
  virtual TransportCapabilities capabilities() const = 0;
  // Engine side: allocate and register the receive pool.
  virtual StatusOr<std::unique_ptr<TargetMemory>> create_target(const PoolOptions& options) = 0;
  // Engine side, direct mode: exposes EXISTING memory [base, base + bytes)
  // (`memory` on local CUDA index `device`, -1 for host) as a target of ONE
  // slot of `bytes` bytes, slot(0) == base, registered once. The caller keeps
  // ownership: the memory must outlive the target, and initiators must drop
  // their RemoteTargets before it is freed. Transports without
  // capabilities().direct return kFailedPrecondition.
  virtual StatusOr<std::unique_ptr<TargetMemory>> expose_memory(std::byte* base, std::uint64_t bytes,
                                                                MemoryKind memory, int device) = 0;
  // Trainer side: open a target from its descriptor. `link` is the data-plane
  // link to that engine rank; it must outlive the RemoteTarget.
  virtual StatusOr<std::unique_ptr<RemoteTarget>> open_target(const std::string& descriptor,
                                                              Link* link) = 0;
  // As open_target, for an initiator that submits bytes from device memory
  // of local CUDA index `device` (-1: host memory). Transports that bind a
  // device when they open a target (nccl: its communicator and stream) bind
  // this one instead of the calling thread's current device; cuda_ipc
  // enables peer access from it to the target's GPU (the initiator's
  // kernels write into the mapped slots); the default ignores it.
  virtual StatusOr<std::unique_ptr<RemoteTarget>> open_target_on(const std::string& descriptor, Link* link,
                                                                 int device) {
    (void)device;
    return open_target(descriptor, link);
  }
};


// What the coordinator asks about a job's transport at setup, by name and
// without creating it (creating one may open a device or a UCX context).
// Known for every transport refit has, built into this binary or not; an
// unknown name has none of these traits.
struct TransportTopology {
  // Two ranks on one GPU take turns, and each spins until its peer on
  // another GPU runs (nccl): the coordinator warns where ranks share a GPU.
  bool shared_gpu_serializes = false;
  // The transport chooses per rank between writing device memory itself and
  // staging it through pinned host buffers (ucx); the report adds up the
  // paths the ranks took under this field name. nullptr: not reported.
  const char* memory_path_report_field = nullptr;
};
TransportTopology transport_topology(const std::string& name);
// Creates a transport by name; unknown names give kInvalidArgument listing
// the known ones.
StatusOr<std::unique_ptr<Transport>> make_transport(const std::string& name);

}  // namespace refit
