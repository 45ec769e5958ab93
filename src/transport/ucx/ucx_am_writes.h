// Writes by active message: how the ucx transport moves a submit to a peer
// that UCX cannot reach with native remote memory access (tcp). Private to
// src/transport/ucx; built only with UCX (REFIT_HAVE_UCX).
//
// Why not ucp_put_nbx there: without native RMA, UCX 1.13 emulates a put
// with active messages anyway (the "rma_am" lanes), and the target answers
// each fragment with an internal completion message; when the initiator dies
// mid-put, sending that completion fails and UCX aborts the TARGET process
// ("ucp_request.inl:346 Fatal: unexpected error: Endpoint timeout"): a
// killed trainer would take its engine down. Doing the same emulation here,
// on ucp_am_send_nbx, moves the same bytes and leaves a dead initiator a
// failed endpoint, nothing more.
//
// Protocol. The initiator sends each submit as eager active messages
// kAmWriteId of at most kAmChunkBytes, each with an AmWriteHeader {target
// address, sink, seq, last}, flagged REPLY. The target's handler checks that
// the range lies inside memory a live target of this worker registered
// (never writes elsewhere), copies the bytes, and answers the last chunk (or
// a rejected one) with kAmAckId {sink, seq, status} on the reply endpoint.
// The initiator's ack handler records the status under (sink, seq); poll is
// true once every chunk left and the ack came back OK: the bytes are in the
// target's memory. Messages of one endpoint arrive in order.
//
// Device memory (a "staged" range, see ucx_device_stager.h): the handler
// hands each chunk to the range's stager (pinned buffer, then an asynchronous
// host-to-device copy) instead of memcpy, and acknowledges the last chunk only
// once every copy finished.
//
// Thread safety: every function here REQUIRES the worker's mutex (the
// handlers run inside ucp_worker_progress, which is called with it held).
#pragma once

#if REFIT_HAVE_UCX

#include <ucp/api/ucp.h>

#include <cstdint>
#include <map>

namespace refit {

class UcxDeviceStager;

inline constexpr unsigned kAmWriteId = 0x5257;  // "RW"
inline constexpr unsigned kAmAckId = 0x5241;    // "RA"
// Chunk of one write message: one eager fragment with the tcp segment size
// the transport configures (kUcxTcpSegmentBytes in ucx_worker.cc).
inline constexpr std::uint64_t kAmChunkBytes = 256 << 10;

struct AmWriteHeader {
  std::uint64_t addr = 0;  // where the chunk goes, in the target process
  std::uint64_t sink = 0;  // the initiator's AmAcks id, echoed in the ack
  std::uint64_t seq = 0;   // the submit (ticket) the chunk belongs to
  std::uint32_t last = 0;  // 1: the last chunk of the submit: acknowledge it
  std::uint32_t pad = 0;
};

struct AmAckHeader {
  std::uint64_t sink = 0;
  std::uint64_t seq = 0;
  std::int32_t status = UCS_OK;  // ucs_status_t of the write
  std::uint32_t pad = 0;
};

// The acknowledgements of one initiator (RemoteTarget): seq -> status. A
// failed chunk's status is kept even if a later ack of the same seq says OK.
struct AmAcks {
  std::map<std::uint64_t, int> done;
};

class AmState {
 public:
  struct Range {
    std::uint64_t bytes = 0;
    UcxDeviceStager* stager = nullptr;  // device memory: copies go through it; nullptr: host memory (memcpy)
  };
  // Target side: ranges writes may land in. `stager` (device memory) must
  // stay alive until the range is removed.
  void add_range(std::uint64_t base, std::uint64_t bytes, UcxDeviceStager* stager = nullptr) {
    ranges_[base] = Range{bytes, stager};
  }
  void remove_range(std::uint64_t base) { ranges_.erase(base); }
  // The range holding all of [addr, addr + bytes), or nullptr.
  const Range* find(std::uint64_t addr, std::uint64_t bytes) const;
  bool contains(std::uint64_t addr, std::uint64_t bytes) const { return find(addr, bytes) != nullptr; }

  // Initiator side: where acks go. Returns the sink's id.
  std::uint64_t add_sink(AmAcks* acks) {
    sinks_[next_sink_] = acks;
    return next_sink_++;
  }
  void remove_sink(std::uint64_t id) { sinks_.erase(id); }
  AmAcks* sink(std::uint64_t id) const {
    auto it = sinks_.find(id);
    return it == sinks_.end() ? nullptr : it->second;
  }

 private:
  std::map<std::uint64_t, Range> ranges_;  // by base
  std::map<std::uint64_t, AmAcks*> sinks_;
  std::uint64_t next_sink_ = 1;
};

// Registers the two handlers on `worker` with `state` as their argument
// (which must outlive the worker).
ucs_status_t install_am_write_handlers(ucp_worker_h worker, AmState* state);

}  // namespace refit

#endif  // REFIT_HAVE_UCX
