// Deterministic weight content on the GPU: the exact byte function of
// refit/content.h (byte b of a tensor is byte b % 8, little-endian, of
// splitmix64's output for key + (b / 8 + 1) * golden), generated and checked
// in device memory at memory speed, so that tens of GB can be filled and
// verified without a host round-trip per byte.
//
// Pointers are device memory the stream's device can address (its own, or a
// peer's mapped through CUDA IPC / peer access). `stream` is a cudaStream_t
// (nullptr: the legacy default stream of the pointer's device).
#pragma once

#include <cstddef>
#include <cstdint>

#include "refit/content.h"
#include "refit/dtype.h"
#include "refit/status.h"

namespace refit {

// Writes the content bytes [offset, offset + bytes) of the tensor with `key`
// to dst (any alignment). ASYNCHRONOUS: enqueued on `stream`; synchronize the
// stream (or record and wait for an event) before another stream or process
// reads dst. Equals fill_content(key, offset, {dst, bytes}) byte for byte.
Status fill_content_device(std::uint64_t key, std::uint64_t offset, std::byte* dst, std::uint64_t bytes,
                           void* stream);

// The offset (relative to src) of the first byte of [src, src + bytes) that
// differs from the content at [offset, offset + bytes), or -1 when all match.
// SYNCHRONOUS: runs on `stream` after the work already queued there and waits
// for the answer. Equals first_content_mismatch(key, offset, {src, bytes}).
StatusOr<std::int64_t> first_content_mismatch_device(std::uint64_t key, std::uint64_t offset, const std::byte* src,
                                                     std::uint64_t bytes, void* stream);

// A shard as rows of the full tensor: row r (0 <= r < count) holds the
// content bytes [offset + r * stride, offset + r * stride + run), and rows lie
// back to back in the shard (row r at r * run).
struct ContentRows {
  std::uint64_t offset = 0;
  std::uint64_t stride = 0;
  std::uint64_t run = 0;
  std::uint64_t count = 0;
};

// The offset (relative to src) of the first byte of the count * run bytes at
// src that differs from `rows`' content, or -1 when all match: one launch for
// every row (a row-sharded tensor has thousands). SYNCHRONOUS, as above.
StatusOr<std::int64_t> first_content_mismatch_device(std::uint64_t key, const ContentRows& rows, const std::byte* src,
                                                     void* stream);

// The same for content that changes like an optimizer step (refit/content.h
// ContentKey): equal to fill_content(key, ...) and first_content_mismatch(key,
// ...) on the host. With key.change == kEveryElement, the calls above on
// key.key; otherwise one thread per byte.
Status fill_content_device(const ContentKey& key, std::uint64_t offset, std::byte* dst, std::uint64_t bytes,
                           void* stream);
StatusOr<std::int64_t> first_content_mismatch_device(const ContentKey& key, const ContentRows& rows,
                                                     const std::byte* src, void* stream);

// make_finite_content (refit/content.h) on `bytes` bytes at dst, which
// start at an element. ASYNCHRONOUS, as fill_content_device.
Status make_finite_content_device(DType dtype, std::byte* dst, std::uint64_t bytes, void* stream);

}  // namespace refit
