// BucketSender: how a trainer rank moves one bucket from its weights into
// the engine rank it feeds. One implementation per path (src/runtime/senders/),
// chosen ONCE at setup by make_bucket_sender from the settings and the
// transport's capabilities, like NCCL's transport table: the trainer rank
// keeps the protocol (join, per refit go, sent, done) and calls the chosen
// sender for every bucket without asking which one it is.
//
//   kind             weights        engine pool        how
//   kHostPack        host           host, staged       memcpy into the mapped slot (shm), or into a local
//                                                      buffer that the transport writes (tcp)
//   kHostDelta       host           host, staged,      as kHostPack, then each bucket encoded against the
//                                   --delta            engine's committed version where smaller (issue 22)
//   kHostDirect      host           host, direct       memcpy straight into the exposed weights (shm)
//   kPinned          host           device, staged     pack into two pinned buffers, copy each to the slot
//   kPinnedDirect    host           device, direct     pinned buffer -> device bucket -> scatter kernel
//   kDeviceKernel    device         device, staged     one prepared copy kernel per bucket into the slot
//   kDeviceDelta     device         device, staged,    the bucket packed into a buffer on the trainer's
//                                   --delta            device, encoded there against the engine's committed
//                                                      version, the smaller copied into the slot (issue 22)
//   kRegisteredHost  host, pinned   device, staged     the copy engines read the registered weights
//                    in place                          (cudaHostRegister) straight into the slot
//   kDeviceDirect    device, or     device, direct     batched kernels (or copy-engine copies) of >= 1 GiB
//                    registered                        into the exposed weights, announced at the end
//   kRemoteWrite     host or device any (ucx, nccl)    pack into two staging buffers; the transport writes
//                                                      one while the other is packed
//
// Each sender owns its buffers, streams and registrations.
//
// The one ordering rule every sender keeps: bucket j-1 is announced
// (kLanded) before the credit of bucket j is awaited. The engine grants the
// slot for bucket j only after it asked for the batch after j-1's, so with
// two pool slots a sender that waits for j's credit first waits forever
// (issue 16's push deadlock).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "refit/deadline.h"
#include "cuda/device.h"
#include "delta/bucket_bases.h"
#include "delta/device_bucket_bases.h"
#include "refit/plan.h"
#include "refit/status.h"
#include "transport/transport.h"
#include "refit/weight_source.h"
#include "reshard/bucket_feed.h"

namespace refit {

// A credit as a sender takes it: the slot, and the version the engine rank
// holds committed and whole (0: none), which a delta may be encoded against.
struct GrantedSlot {
  std::uint64_t slot = 0;
  std::uint64_t base = 0;
};

// The trainer rank's data-plane protocol, as a sender uses it.
class BucketProtocol {
 public:
  virtual ~BucketProtocol() = default;
  // Staged mode: waits for the engine's credit for `bucket` of refit
  // `version` (bounded by the bucket deadline too) and returns its slot.
  virtual StatusOr<std::uint64_t> wait_credit(std::uint64_t version, std::uint64_t bucket, Deadline deadline) = 0;
  // kLanded: `bucket` of refit `version` is in `slot` (0 in direct mode).
  virtual Status send_landed(std::uint64_t version, std::uint64_t bucket, std::uint64_t slot, Deadline deadline) = 0;
  // The engine side, in errors ("engine rank 1 at 127.0.0.1:4000").
  virtual std::string peer() const = 0;
  // Delta refits (kHostDelta): the credit with the engine's base version
  // (the default: no base), and kLanded for a bucket whose slot holds its
  // encoding of `encoded_bytes` bytes (the default refuses: only a trainer
  // rank's single engine link carries encoded buckets).
  virtual StatusOr<GrantedSlot> wait_credit_base(std::uint64_t version, std::uint64_t bucket, Deadline deadline) {
    ASSIGN_OR_RETURN(const std::uint64_t slot, wait_credit(version, bucket, deadline));
    return GrantedSlot{slot, 0};
  }
  virtual Status send_landed_encoded(std::uint64_t version, std::uint64_t bucket, std::uint64_t slot,
                                     std::uint64_t encoded_bytes, Deadline deadline);
};

// Host weights registered with a device (cudaHostRegister), shared by the
// senders that read them; released with the last.
using SharedRegistrations = std::shared_ptr<const std::vector<HostRegistration>>;

// What every sender reads. What it points to outlives the sender.
struct SenderContext {
  std::string name;  // the trainer rank, in errors and logs: "trainer rank 2"
  const Plan* plan = nullptr;
  const WeightSource* source = nullptr;
  int pack_rank = 0;     // the engine rank whose shards are packed
  int engine_ranks = 1;
  RemoteTarget* target = nullptr;
  BucketProtocol* protocol = nullptr;
  // Direct mode: each tensor's offset in the engine's weight arena
  // (weight_arena_offsets of the plan's specs). Empty when staged.
  std::vector<std::uint64_t> arena_offsets;
  // Direct mode over shadow weights: where this refit's arena begins in the
  // engine's exposed region (Start::arena * shadow_arena_stride), set by the
  // rank before each refit's first bucket. Null: 0.
  const std::uint64_t* landing = nullptr;
  // Sharded trainers (issue 19): the fed engine rank's bucket feed
  // (reshard/bucket_feed.h) and this rank's trainer rank in it; the source
  // then holds local shards, and each bucket carries only this rank's
  // share (its runs). Null: full weights, every bucket whole, cut out of
  // the full tensors for pack_rank.
  const BucketFeed* feed = nullptr;
  int feed_rank = 0;
  // The source's host weights registered with the copying device, shared
  // by every sender of a trainer rank (a sharded rank has one per engine
  // rank it feeds, and a range registers once): host_registrations' result.
  // Null: make_bucket_sender registers them itself where the settings ask.
  SharedRegistrations registrations;
  // --delta (kHostDelta): the rank's bases of its buckets, kept across
  // refits (and senders: a release drops the sender, not the bases). Null
  // otherwise.
  BucketBases* delta_bases = nullptr;
  // --delta with device weights (kDeviceDelta): the same, on the device.
  DeviceBucketBases* device_delta_bases = nullptr;
};

enum class SenderKind {
  kHostPack,
  kHostDelta,
  kHostDirect,
  kPinned,
  kPinnedDirect,
  kDeviceKernel,
  kDeviceDelta,
  kRegisteredHost,
  kDeviceDirect,
  kRemoteWrite,
  kRemoteDelta,
};

// "host pack", "host direct", "pinned", ...
const char* sender_kind_name(SenderKind kind);

class BucketSender {
 public:
  virtual ~BucketSender() = default;
  // Sends bucket `bucket` of refit `version`: waits for its credit (staged),
  // moves its bytes, announces it now or later (never after finish()).
  virtual Status send(std::uint64_t version, std::uint64_t bucket, Deadline deadline) = 0;
  // Ends refit `version`'s sending: every bucket sent is announced, and
  // nothing reads the weights any more (the caller may change them after).
  virtual Status finish(std::uint64_t version, Deadline deadline) = 0;
  // After a failed refit, before the link is replaced: nothing of it may
  // still be writing. Waits for the device, cancels writes in flight and
  // forgets what was half sent.
  virtual void abandon() = 0;
  // The CUDA stream its copies run on (the GPU span and the debug hooks use
  // it), or nullptr for the host paths.
  virtual CudaStream* stream() = 0;
  virtual SenderKind kind() const = 0;
};

// The settings the choice depends on, fixed at setup.
struct SenderSettings {
  bool direct = false;             // --mode direct
  bool weights_on_device = false;  // the source's memory is kCuda
  bool target_on_device = false;   // the engine keeps device memory
  // Host weights into a device engine: register the source's stable host
  // ranges and let the copy engines read them (RankOptions).
  bool register_host_weights = true;
  bool delta = false;  // --delta: only a delta sender (host, device, remote), or the choice is refused
  int gpu = -1;  // the device that copies: the weights' device, or --gpu
  std::string transport;  // its name, in messages only
  TransportCapabilities capabilities;
};

// Which sender the settings call for. `registered`: the host weights are
// registered with the device. Pure: unit-tested on every combination.
SenderKind choose_sender(const SenderSettings& settings, bool registered);

// Registers the source's stable host ranges with settings.gpu when the
// settings ask for it (host weights into a device engine, not over a
// remote-write transport, register_host_weights): the copy engines then read
// them in place. Empty where not asked, or where the driver refuses a range
// (logged once under `name`: the weights then go through pinned buffers).
SharedRegistrations host_registrations(const WeightSource& source, const SenderSettings& settings,
                                       const std::string& name);

// Chooses (registering the host weights first where the settings ask, and
// falling back to the pinned buffers where the driver refuses) and creates
// the sender with its buffers.
StatusOr<std::unique_ptr<BucketSender>> make_bucket_sender(SenderContext context, const SenderSettings& settings);

}  // namespace refit
