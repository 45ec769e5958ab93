// The choice of a bucket sender, made once at setup: see bucket_sender.h.
#include "runtime/bucket_sender.h"

#include <chrono>
#include <cstdio>
#include <mutex>

#include "refit/log.h"
#include "runtime/senders/senders.h"

namespace refit {
namespace {

// Registers `source`'s stable host ranges (a checkpoint's file mappings)
// with the device, once, and logs how long it took. Where the driver
// refuses a range, says why and returns none: the weights then go through
// the pinned buffers (slower, never wrong).
std::vector<HostRegistration> register_host_weights(const WeightSource& source, const std::string& name, int gpu) {
  const auto started = std::chrono::steady_clock::now();
  std::vector<HostRegistration> registrations;
  std::uint64_t total = 0;
  for (const auto& [data, bytes] : source.stable_host_ranges()) {
    StatusOr<HostRegistration> r = HostRegistration::Register(data, bytes);
    if (!r.ok()) {
      log(LogLevel::kWarning, name,
          "cannot register its host weights (" + std::to_string(bytes) + " bytes) for device " + std::to_string(gpu) +
              ": " + r.status().ToString() + "; packing through pinned buffers instead");
      return {};
    }
    registrations.push_back(std::move(*r));
    total += bytes;
  }
  if (registrations.empty()) return registrations;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  char text[160];
  std::snprintf(text, sizeof text, "registered %.2f GB of host weights (%zu ranges) for device %d in %.2f s",
                static_cast<double>(total) / 1e9, registrations.size(), gpu, s);
  log(LogLevel::kInfo, name, text);
  return registrations;
}

}  // namespace

Status BucketProtocol::send_landed_encoded(std::uint64_t, std::uint64_t bucket, std::uint64_t, std::uint64_t,
                                           Deadline) {
  return Internal("bucket " + std::to_string(bucket) + " to " + peer() +
                       ": this link carries no delta-encoded buckets");
}

const char* sender_kind_name(SenderKind kind) {
  switch (kind) {
    case SenderKind::kHostPack: return "host pack";
    case SenderKind::kHostDelta: return "host delta";
    case SenderKind::kHostDirect: return "host direct";
    case SenderKind::kPinned: return "pinned";
    case SenderKind::kPinnedDirect: return "pinned direct";
    case SenderKind::kDeviceKernel: return "device kernel";
    case SenderKind::kDeviceDelta: return "device delta";
    case SenderKind::kRegisteredHost: return "registered host";
    case SenderKind::kDeviceDirect: return "device direct";
    case SenderKind::kRemoteWrite: return "remote write";
    case SenderKind::kRemoteDelta: return "remote delta";
  }
  return "unknown sender";
}

SenderKind choose_sender(const SenderSettings& s, bool registered) {
  if (s.capabilities.remote_write) return s.delta && !s.direct ? SenderKind::kRemoteDelta : SenderKind::kRemoteWrite;
  if (!s.weights_on_device && !s.target_on_device) {
    if (s.direct) return SenderKind::kHostDirect;
    return s.delta ? SenderKind::kHostDelta : SenderKind::kHostPack;
  }
  // A device is involved: it copies the weights itself when they are on it
  // or registered with it; otherwise they go through pinned buffers.
  const bool device_reads = s.weights_on_device || registered;
  if (!device_reads) return s.direct ? SenderKind::kPinnedDirect : SenderKind::kPinned;
  if (s.direct) return SenderKind::kDeviceDirect;
  if (!s.weights_on_device) return SenderKind::kRegisteredHost;
  return s.delta ? SenderKind::kDeviceDelta : SenderKind::kDeviceKernel;
}

SharedRegistrations host_registrations(const WeightSource& source, const SenderSettings& s, const std::string& name) {
  // Host weights that never move (a mapped checkpoint) into a device engine:
  // registered once, then the copy engines read them directly.
  if (s.capabilities.remote_write || s.weights_on_device || !s.target_on_device || !s.register_host_weights) {
    return std::make_shared<const std::vector<HostRegistration>>();
  }
  return std::make_shared<const std::vector<HostRegistration>>(register_host_weights(source, name, s.gpu));
}

StatusOr<std::unique_ptr<BucketSender>> make_bucket_sender(SenderContext c, const SenderSettings& s) {
  SharedRegistrations registrations = c.registrations ? c.registrations : host_registrations(*c.source, s, c.name);
  const std::string name = c.name;
  const SenderKind kind = choose_sender(s, !registrations->empty());
  const bool delta_kind =
      kind == SenderKind::kHostDelta || kind == SenderKind::kDeviceDelta || kind == SenderKind::kRemoteDelta;
  if (s.delta && !delta_kind) {
    return FailedPrecondition(name + ": --delta sends host weights into a host pool, device weights into a device "
                              "pool, or either over a remote-write transport, staged; these settings call for the " +
                              sender_kind_name(kind) + " sender");
  }
  switch (kind) {
    case SenderKind::kHostPack: return make_host_pack_sender(std::move(c), s.capabilities.one_sided);
    case SenderKind::kHostDelta: return make_host_delta_sender(std::move(c), s.capabilities.one_sided);
    case SenderKind::kHostDirect: return make_host_direct_sender(std::move(c));
    case SenderKind::kPinned: return make_pinned_sender(std::move(c), s.gpu);
    case SenderKind::kPinnedDirect: return make_pinned_direct_sender(std::move(c), s.gpu);
    case SenderKind::kDeviceKernel: return make_device_kernel_sender(std::move(c), s.gpu);
    case SenderKind::kDeviceDelta: return make_device_delta_sender(std::move(c), s.gpu);
    case SenderKind::kRegisteredHost: return make_registered_host_sender(std::move(c), s.gpu, registrations);
    case SenderKind::kDeviceDirect: return make_device_direct_sender(std::move(c), s.gpu, registrations);
    case SenderKind::kRemoteWrite:
    case SenderKind::kRemoteDelta: {
      const bool host_staged = s.weights_on_device && s.capabilities.device_memory_staged;
      if (host_staged) {
        static std::once_flag once;
        std::call_once(once, [&] {
          log(LogLevel::kWarning, name,
              "--transport " + s.transport +
                  " cannot register CUDA memory: device weights are staged through pinned host buffers (memory path "
                  "host-staged)");
        });
      }
      const int gpu = s.weights_on_device ? s.gpu : -1;
      if (kind == SenderKind::kRemoteDelta) return make_remote_delta_sender(std::move(c), gpu, host_staged);
      return make_remote_write_sender(std::move(c), gpu, host_staged);
    }
  }
  return Internal(name + ": no bucket sender for these settings");
}

}  // namespace refit
