// The bucket senders, one per path (bucket_sender.h has the table). Each
// constructor takes the sender's context and allocates what the sender
// owns; make_bucket_sender (bucket_sender.cc) is the one caller.
#pragma once

#include <memory>
#include <vector>

#include "cuda/device.h"
#include "runtime/bucket_sender.h"

namespace refit {

// host_pack_sender.cc. `one_sided`: the transport maps the slots (shm);
// otherwise the bucket is packed into a local buffer and submitted (tcp).
std::unique_ptr<BucketSender> make_host_pack_sender(SenderContext c, bool one_sided);
// host_delta_sender.cc (--delta): as the host pack sender, each bucket then
// encoded against c.delta_bases where smaller.
std::unique_ptr<BucketSender> make_host_delta_sender(SenderContext c, bool one_sided);
// host_direct_sender.cc
std::unique_ptr<BucketSender> make_host_direct_sender(SenderContext c);
// pinned_sender.cc
StatusOr<std::unique_ptr<BucketSender>> make_pinned_sender(SenderContext c, int gpu);
// pinned_direct_sender.cc
StatusOr<std::unique_ptr<BucketSender>> make_pinned_direct_sender(SenderContext c, int gpu);
// device_kernel_sender.cc
StatusOr<std::unique_ptr<BucketSender>> make_device_kernel_sender(SenderContext c, int gpu);
// device_delta_sender.cc (--delta with device weights): as the device
// kernel sender, each bucket packed on the device and encoded against
// c.device_delta_bases where smaller.
StatusOr<std::unique_ptr<BucketSender>> make_device_delta_sender(SenderContext c, int gpu);
// registered_host_sender.cc: `registrations` hold every byte the source's
// data() points to.
StatusOr<std::unique_ptr<BucketSender>> make_registered_host_sender(SenderContext c, int gpu,
                                                                   SharedRegistrations registrations);
// device_direct_sender.cc: device weights (copy kernel), or registered host
// weights (`registrations` not empty: the copy engines).
StatusOr<std::unique_ptr<BucketSender>> make_device_direct_sender(SenderContext c, int gpu,
                                                                  SharedRegistrations registrations);
// remote_write_sender.cc. `gpu` >= 0: the weights are on that device;
// `host_staged`: the transport cannot register device memory, so device
// bytes are staged through pinned host buffers.
StatusOr<std::unique_ptr<BucketSender>> make_remote_write_sender(SenderContext c, int gpu, bool host_staged);
// remote_delta_sender.cc (--delta over ucx or nccl): as the remote write
// sender, staged, each bucket encoded against c.delta_bases (host weights)
// or c.device_delta_bases (`gpu` >= 0) where smaller.
StatusOr<std::unique_ptr<BucketSender>> make_remote_delta_sender(SenderContext c, int gpu, bool host_staged);

}  // namespace refit
