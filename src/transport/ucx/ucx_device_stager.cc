#include "transport/ucx/ucx_device_stager.h"

#if REFIT_HAVE_UCX

#include <cstring>

namespace refit {

StatusOr<std::unique_ptr<UcxDeviceStager>> UcxDeviceStager::Create(int device, std::uint64_t chunk_bytes) {
  std::unique_ptr<UcxDeviceStager> s(new UcxDeviceStager());
  s->device_ = device;
  s->chunk_bytes_ = chunk_bytes;
  const std::string where = "staging ucx writes into device " + std::to_string(device) + " through pinned memory";
  auto stream = CudaStream::Create(device);
  if (!stream.ok()) return stream.status().WithContext(where);
  s->stream_ = std::move(*stream);
  for (int i = 0; i < kRing; ++i) {
    auto buffer = PinnedBuffer::Allocate(chunk_bytes);
    if (!buffer.ok()) return buffer.status().WithContext(where);
    s->buffers_[i] = std::move(*buffer);
    auto event = CudaEvent::Create(device);
    if (!event.ok()) return event.status().WithContext(where);
    s->done_[i] = std::move(*event);
  }
  return s;
}

Status UcxDeviceStager::write(std::byte* dst, const void* data, std::uint64_t bytes) {
  if (bytes > chunk_bytes_) {
    return Internal("ucx device staging: a chunk of " + std::to_string(bytes) + " bytes exceeds the " +
                    std::to_string(chunk_bytes_) + "-byte pinned buffers");
  }
  const int i = next_;
  next_ = (next_ + 1) % kRing;
  if (used_[i]) RETURN_IF_ERROR(done_[i].synchronize());  // its previous copy must have read it
  std::memcpy(buffers_[i].data(), data, bytes);
  RETURN_IF_ERROR(copy_async(dst, buffers_[i].data(), bytes, stream_.handle()));
  RETURN_IF_ERROR(done_[i].record(stream_.handle()));
  used_[i] = true;
  staged_bytes_ += bytes;
  return Status::Ok();
}

Status UcxDeviceStager::finish() { return stream_.synchronize(); }

}  // namespace refit

#endif  // REFIT_HAVE_UCX
