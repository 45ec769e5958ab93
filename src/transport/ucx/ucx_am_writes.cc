#include "transport/ucx/ucx_am_writes.h"

#if REFIT_HAVE_UCX

#include <cstdio>
#include <cstring>

#include "refit/log.h"
#include "transport/ucx/ucx_device_stager.h"

namespace refit {
namespace {

// Completion of an ack send nobody waits for: release its request.
void release_on_completion(void* request, ucs_status_t, void*) { ucp_request_free(request); }

void send_ack(ucp_ep_h reply_ep, const AmWriteHeader& h, ucs_status_t status) {
  if (reply_ep == nullptr) return;
  AmAckHeader ack;
  ack.sink = h.sink;
  ack.seq = h.seq;
  ack.status = static_cast<std::int32_t>(status);
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK;
  param.flags = UCP_AM_SEND_FLAG_EAGER;
  param.cb.send = &release_on_completion;
  // A dead initiator makes this fail (an error pointer): nobody to tell.
  (void)ucp_am_send_nbx(reply_ep, kAmAckId, &ack, sizeof ack, nullptr, 0, &param);
}

// Target side: one chunk of a write.
ucs_status_t on_write(void* arg, const void* header, size_t header_length, void* data, size_t length,
                      const ucp_am_recv_param_t* param) {
  const auto* state = static_cast<const AmState*>(arg);
  if (header_length != sizeof(AmWriteHeader)) return UCS_OK;  // not ours: drop
  AmWriteHeader h;
  std::memcpy(&h, header, sizeof h);
  const ucp_ep_h reply = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : nullptr;
  ucs_status_t status = UCS_OK;
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    status = UCS_ERR_UNSUPPORTED;  // writes are sent eager; dropping the descriptor completes the send
  } else if (const AmState::Range* range = state->find(h.addr, length); range == nullptr) {
    status = UCS_ERR_INVALID_ADDR;  // outside every registered range: never write there
  } else if (range->stager != nullptr) {
    // Device memory: through pinned buffers; the ack waits for the copies.
    auto* dst = reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(h.addr));
    Status st = length > 0 ? range->stager->write(dst, data, length) : Status::Ok();
    if (st.ok() && h.last != 0) st = range->stager->finish();
    if (!st.ok()) {
      log(LogLevel::kError, "refit ucx", "a write into device memory failed: " + st.ToString());
      status = UCS_ERR_IO_ERROR;
    }
  } else if (length > 0) {
    std::memcpy(reinterpret_cast<void*>(static_cast<std::uintptr_t>(h.addr)), data, length);
  }
  if (h.last != 0 || status != UCS_OK) send_ack(reply, h, status);
  return UCS_OK;
}

// Initiator side: the target's answer to a write.
ucs_status_t on_ack(void* arg, const void* header, size_t header_length, void*, size_t, const ucp_am_recv_param_t*) {
  const auto* state = static_cast<const AmState*>(arg);
  if (header_length != sizeof(AmAckHeader)) return UCS_OK;
  AmAckHeader ack;
  std::memcpy(&ack, header, sizeof ack);
  AmAcks* acks = state->sink(ack.sink);
  if (acks == nullptr) return UCS_OK;  // its remote is gone
  auto [it, inserted] = acks->done.emplace(ack.seq, ack.status);
  if (!inserted && it->second == UCS_OK) it->second = ack.status;  // keep the first failure
  return UCS_OK;
}

}  // namespace

const AmState::Range* AmState::find(std::uint64_t addr, std::uint64_t bytes) const {
  auto it = ranges_.upper_bound(addr);  // first range starting after addr
  if (it == ranges_.begin()) return nullptr;
  --it;
  const std::uint64_t offset = addr - it->first;
  if (offset <= it->second.bytes && bytes <= it->second.bytes - offset) return &it->second;
  return nullptr;
}

ucs_status_t install_am_write_handlers(ucp_worker_h worker, AmState* state) {
  ucp_am_handler_param_t p{};
  p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG |
                 UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  p.id = kAmWriteId;
  p.cb = &on_write;
  p.arg = state;
  p.flags = UCP_AM_FLAG_WHOLE_MSG;
  ucs_status_t s = ucp_worker_set_am_recv_handler(worker, &p);
  if (s != UCS_OK) return s;
  p.id = kAmAckId;
  p.cb = &on_ack;
  return ucp_worker_set_am_recv_handler(worker, &p);
}

}  // namespace refit

#endif  // REFIT_HAVE_UCX
