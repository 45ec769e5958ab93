// The ucx transport's remote side (ucx_remote.h): the trainer's endpoint to
// one engine's registered memory, and the writes it submits there (puts
// with a flush each, or active-message writes acknowledged by the target).
#include "transport/ucx/ucx_remote.h"

#if REFIT_HAVE_UCX

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <span>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "refit/log.h"
#include "transport/ucx/ucx_am_writes.h"
#include "transport/ucx/ucx_requests.h"

namespace refit {
namespace {

// How long one poll call naps when the write is still on its way (the
// remote's progress thread moves it; poll only looks).
constexpr std::chrono::microseconds kPollNap{100};

bool in_range(int slot, std::uint64_t offset, std::uint64_t bytes, int slots, std::uint64_t slot_bytes) {
  return slot >= 0 && slot < slots && offset <= slot_bytes && bytes <= slot_bytes - offset;
}

std::string pool_shape(int slots, std::uint64_t slot_bytes) {
  return "(slots=" + std::to_string(slots) + ", slot_bytes=" + std::to_string(slot_bytes) + ")";
}

// What the endpoint's error handler learned. Its address is the handler's
// argument, so it outlives the endpoint.
struct EndpointHealth {
  std::atomic<int> status{UCS_OK};
};

void on_endpoint_error(void* arg, ucp_ep_h, ucs_status_t status) {
  static_cast<EndpointHealth*>(arg)->status.store(static_cast<int>(status));
}

// Prints once per process that peer failure goes undetected by UCX.
void note_no_peer_error_handling(const std::string& settings, const std::string& peer) {
  static std::once_flag once;
  std::call_once(once, [&] {
    log(LogLevel::kWarning, "refit ucx",
        "the UCX transports reaching " + peer + " (" + settings +
            ") cannot detect peer failure (shared memory); a dead peer is detected through the data link only");
  });
}

// True when UCX reaches the peer of `ep` with native remote memory access:
// its endpoint configuration lists put lanes ("put[0]: ..."), which tcp's
// software emulation ("rma_am") does not. UCX 1.13 has no query for this;
// the printed configuration is the only source, and anything unrecognized
// answers false (active-message writes work everywhere).
// REQUIRES: the worker's mutex is held.
bool has_native_rma(ucp_ep_h ep) {
  char* text = nullptr;
  std::size_t size = 0;
  FILE* out = ::open_memstream(&text, &size);
  if (out == nullptr) return false;
  ucp_ep_print_info(ep, out);
  std::fclose(out);
  const bool native = std::string_view(text, size).find("put[") != std::string_view::npos;
  std::free(text);
  return native;
}

class UcxRemote final : public RemoteTarget {
 public:
  UcxRemote(std::shared_ptr<UcxWorker> worker, std::string peer, const UcxDescriptor& d, ucp_ep_h ep,
            ucp_rkey_h rkey, std::unique_ptr<EndpointHealth> health, bool by_put)
      : worker_(std::move(worker)),
        peer_(std::move(peer)),
        slots_(d.slots),
        slot_bytes_(d.slot_bytes),
        addr_(d.addr),
        ep_(ep),
        rkey_(rkey),
        health_(std::move(health)),
        by_put_(by_put) {
    {
      std::lock_guard<std::mutex> lock(worker_->mutex());
      sink_ = worker_->am().add_sink(&acks_);
    }
    // The initiator's writes move while its thread does something else
    // (packs the next bucket): UCX's tcp sends what the socket takes at once
    // and the rest only when the worker progresses.
    progress_ = std::make_unique<UcxWorker::ProgressLease>(worker_);
  }

  ~UcxRemote() override {
    progress_.reset();  // stops the thread unless a target of this worker still runs it
    std::lock_guard<std::mutex> lock(worker_->mutex());
    worker_->am().remove_sink(sink_);  // late acks are dropped
    const bool pending = !ops_.empty();
    for (auto& [ticket, op] : ops_) {
      ucx_release_request(op.put);  // released by UCX when they complete
      ucx_release_request(op.flush);
      for (void* send : op.sends) ucx_release_request(send);
    }
    ucp_request_param_t param{};
    // The rkey may go only once the operations that use it are flushed: a
    // bounded flush, skipped on a failed endpoint (its operations are done).
    if (by_put_ && pending && health_->status.load() == UCS_OK) {
      (void)ucx_wait_request(*worker_, ucp_ep_flush_nbx(ep_, &param), kUcxTeardownWait);
    }
    if (rkey_ != nullptr) ucp_rkey_destroy(rkey_);
    // Force: no goodbye to a peer that may be gone; afterwards UCX reads no
    // source buffer of a cancelled write.
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    (void)ucx_wait_request(*worker_, ucp_ep_close_nbx(ep_, &param), kUcxTeardownWait);
  }

  std::byte* mapped_slot(int) override { return nullptr; }

  StatusOr<Ticket> submit(int slot, std::uint64_t offset, std::span<const std::byte> bytes, std::uint64_t version,
                          Deadline deadline) override {
    if (!in_range(slot, offset, bytes.size(), slots_, slot_bytes_)) {
      return InvalidArgument("write of " + std::to_string(bytes.size()) + " bytes at offset " +
                             std::to_string(offset) + " into slot " + std::to_string(slot) + " of ucx target " +
                             peer_ + " is out of range " + pool_shape(slots_, slot_bytes_));
    }
    RETURN_IF_ERROR(health());
    RETURN_IF_ERROR(finish_cancelled(deadline));
    const Ticket ticket = next_ticket_++;
    if (bytes.empty()) return ticket;  // nothing to move: complete at once
    const std::uint64_t remote = addr_ + static_cast<std::uint64_t>(slot) * slot_bytes_ + offset;
    Op op;
    ucs_status_t failed = UCS_OK;
    {
      std::lock_guard<std::mutex> lock(worker_->mutex());
      if (by_put_) {
        ucp_request_param_t param{};
        op.put = ucp_put_nbx(ep_, bytes.data(), bytes.size(), remote, rkey_, &param);
        // Remote completion: the flush completes once every put before it
        // is in the target's memory. Issued now, so it travels right behind.
        if (!UCS_PTR_IS_ERR(op.put)) op.flush = ucp_ep_flush_nbx(ep_, &param);
        if (UCS_PTR_IS_ERR(op.put) || UCS_PTR_IS_ERR(op.flush)) {
          failed = UCS_PTR_IS_ERR(op.put) ? UCS_PTR_STATUS(op.put) : UCS_PTR_STATUS(op.flush);
          ucx_release_request(op.put);
        }
      } else {
        const std::uint64_t chunks = (bytes.size() + kAmChunkBytes - 1) / kAmChunkBytes;
        op.headers = std::make_unique<std::vector<AmWriteHeader>>(chunks);
        for (std::uint64_t c = 0; c < chunks && failed == UCS_OK; ++c) {
          const std::uint64_t at = c * kAmChunkBytes;
          AmWriteHeader& h = (*op.headers)[c];
          h.addr = remote + at;
          h.sink = sink_;
          h.seq = ticket;
          h.last = c + 1 == chunks ? 1 : 0;
          ucp_request_param_t param{};
          param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
          param.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
          void* send = ucp_am_send_nbx(ep_, kAmWriteId, &h, sizeof h, bytes.data() + at,
                                       std::min<std::uint64_t>(kAmChunkBytes, bytes.size() - at), &param);
          if (UCS_PTR_IS_ERR(send)) {
            failed = UCS_PTR_STATUS(send);
          } else if (send != nullptr) {
            op.sends.push_back(send);
          }
        }
        if (failed != UCS_OK) {
          for (void* send : op.sends) ucx_release_request(send);  // released when the failed endpoint cancels them
          retired_headers_.push_back(std::move(op.headers));
        }
      }
      // Wake the progress thread if it sleeps on the event fd: what the
      // socket did not take at once moves only when the worker progresses.
      if (failed == UCS_OK) (void)ucp_worker_signal(worker_->worker());
    }
    if (failed != UCS_OK) {
      return failure(failed).WithContext("writing " + std::to_string(bytes.size()) + " bytes into slot " +
                                         std::to_string(slot) + " (version " + std::to_string(version) + ")");
    }
    ops_.emplace(ticket, std::move(op));
    return ticket;
  }

  StatusOr<bool> poll(Ticket ticket) override {
    if (ticket >= next_ticket_) {
      return InvalidArgument("poll of unknown ticket " + std::to_string(ticket) + " on ucx target " + peer_);
    }
    auto it = ops_.find(ticket);
    if (it == ops_.end()) return true;  // completed (or empty) before
    // Look (the progress thread moves the write); when it is still on its
    // way, nap (kPollNap) and look once more, so a caller that polls in a
    // loop neither spins a core the engine may need nor fights the progress
    // thread for the worker.
    ucs_status_t s = UCS_OK;  // first error seen
    int refused = UCS_OK;     // the target's answer (active-message writes)
    bool pending = check(it->second, ticket, &s, &refused);
    if (pending) {
      std::this_thread::sleep_for(kPollNap);
      pending = check(it->second, ticket, &s, &refused);
    }
    if (pending) {
      // The error handler may have fired while requests still wait for UCX
      // to cancel them.
      RETURN_IF_ERROR(health());
      return false;
    }
    ops_.erase(it);
    if (s != UCS_OK) return failure(s).WithContext("completing write ticket " + std::to_string(ticket));
    if (refused != UCS_OK) {
      return Internal(peer_ + " refused write ticket " + std::to_string(ticket) + " (" + worker_->settings() +
                      "): " + ucx_status_text(static_cast<ucs_status_t>(refused)) +
                      " (outside the memory it registered, or its target is gone)");
    }
    return true;
  }

  // A write cannot be withdrawn: a cancelled one may still land. The next
  // submit waits until it has (or failed), so a cancelled write (of a failed
  // refit) never lands after, and over, a later one.
  void cancel(Ticket ticket) override {
    if (auto it = ops_.find(ticket); it != ops_.end()) it->second.cancelled = true;
  }

 private:
  struct Op;

  // Waits until every cancelled write completed or failed.
  Status finish_cancelled(Deadline deadline) {
    for (auto it = ops_.begin(); it != ops_.end();) {
      if (!it->second.cancelled) {
        ++it;
        continue;
      }
      ucs_status_t s = UCS_OK;
      int refused = UCS_OK;
      while (check(it->second, it->first, &s, &refused)) {
        RETURN_IF_ERROR(health());
        if (deadline.expired()) {
          return DeadlineExceeded("a cancelled write (ticket " + std::to_string(it->first) + ") to " + peer_ +
                                  " did not finish before the next write's deadline");
        }
        std::this_thread::sleep_for(kPollNap);
      }
      it = ops_.erase(it);  // done or failed: either way it writes no more
    }
    return Status::Ok();
  }

  // Looks at `op` (the progress thread progresses the worker): true while
  // it is still on its way; otherwise its requests are released and *s /
  // *refused say how it ended (a failed endpoint ends it at once: UCX
  // releases what is left).
  bool check(Op& op, Ticket ticket, ucs_status_t* s, int* refused) {
    std::lock_guard<std::mutex> lock(worker_->mutex());
    bool pending = false;
    auto look = [&](void*& request) {
      const ucs_status_t r = ucx_request_status(request);
      if (r == UCS_INPROGRESS) {
        pending = true;
        return;
      }
      if (r != UCS_OK && *s == UCS_OK) *s = r;
      ucx_release_request(request);
      request = nullptr;
    };
    look(op.put);
    look(op.flush);
    for (void*& send : op.sends) look(send);
    if (!by_put_ && *s == UCS_OK) {
      auto ack = acks_.done.find(ticket);
      if (ack == acks_.done.end()) {
        pending = true;
      } else {
        *refused = ack->second;
        acks_.done.erase(ack);
      }
    }
    if (*s != UCS_OK && pending) {
      ucx_release_request(op.put);
      ucx_release_request(op.flush);
      for (void* send : op.sends) ucx_release_request(send);
      // Unsent messages may still point at their headers until the
      // endpoint is closed (the destructor): keep them until then.
      if (op.headers) retired_headers_.push_back(std::move(op.headers));
      op = Op();
      pending = false;
    }
    return pending;
  }

  struct Op {
    void* put = nullptr;    // request or status pointer of ucp_put_nbx
    void* flush = nullptr;  // ... of ucp_ep_flush_nbx
    std::vector<void*> sends;                             // active-message writes: one per chunk
    std::unique_ptr<std::vector<AmWriteHeader>> headers;  // ... and their headers, stable until sent
    bool cancelled = false;
  };

  Status failure(ucs_status_t s) const {
    return Unavailable("lost the UCX connection to " + peer_ + " (" + worker_->settings() + "): " + ucx_status_text(s));
  }
  Status health() const {
    const auto s = static_cast<ucs_status_t>(health_->status.load());
    return s == UCS_OK ? Status::Ok() : failure(s);
  }

  std::shared_ptr<UcxWorker> worker_;
  std::string peer_;
  int slots_;
  std::uint64_t slot_bytes_;
  std::uint64_t addr_;
  ucp_ep_h ep_;
  ucp_rkey_h rkey_;
  std::unique_ptr<EndpointHealth> health_;
  const bool by_put_;    // false: active-message writes
  AmAcks acks_;          // guarded by the worker's mutex (the ack handler writes it)
  std::uint64_t sink_ = 0;
  std::map<Ticket, Op> ops_;  // submitted, not yet seen complete by poll
  std::vector<std::unique_ptr<std::vector<AmWriteHeader>>> retired_headers_;  // of failed writes
  Ticket next_ticket_ = 0;
  std::unique_ptr<UcxWorker::ProgressLease> progress_;
};

}  // namespace

StatusOr<std::unique_ptr<RemoteTarget>> open_ucx_remote(std::shared_ptr<UcxWorker> w, const UcxDescriptor& d,
                                                        const std::string& peer, const UcxOptions& options) {
  auto health = std::make_unique<EndpointHealth>();
  std::unique_lock<std::mutex> lock(w->mutex());
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(d.worker.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &on_endpoint_error;
  params.err_handler.arg = health.get();
  ucp_ep_h ep = nullptr;
  ucs_status_t s;
  {
    UcxQuietLogs quiet;  // "no peer failure handler" is handled below
    s = ucp_ep_create(w->worker(), &params, &ep);
  }
  if (s == UCS_ERR_UNREACHABLE) {
    // Shared-memory transports cannot detect a dead peer: without peer
    // error handling they can reach it.
    params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    s = ucp_ep_create(w->worker(), &params, &ep);
    if (s == UCS_OK) note_no_peer_error_handling(w->settings(), peer);
  }
  if (s != UCS_OK) {
    return Unavailable("cannot reach the UCX worker of " + peer + " (" + w->settings() +
                       "; check UCX_TLS and UCX_NET_DEVICES on both sides): " + ucx_status_text(s));
  }
  // A staged target (device memory UCX cannot register) has no remote key:
  // it is written by message only.
  ucp_rkey_h rkey = nullptr;
  s = d.memory == UcxMemory::kStaged ? UCS_OK : ucp_ep_rkey_unpack(ep, d.rkey.data(), &rkey);
  auto close_ep = [&] {
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    (void)ucx_wait_request(*w, ucp_ep_close_nbx(ep, &param), kUcxTeardownWait);
  };
  if (s != UCS_OK) {
    close_ep();
    return InvalidArgument("the remote key in ucx descriptor of " + peer + " cannot be used (" + w->settings() +
                           "): " + ucx_status_text(s));
  }
  // Wire the endpoint up now (a flush waits for it), so an engine that
  // cannot be reached fails setup rather than the first refit.
  ucp_request_param_t param{};
  s = ucx_wait_request(*w, ucp_ep_flush_nbx(ep, &param), options.connect_timeout);
  if (s == UCS_OK && health->status.load() != UCS_OK) s = static_cast<ucs_status_t>(health->status.load());
  if (s != UCS_OK) {
    if (rkey != nullptr) ucp_rkey_destroy(rkey);
    close_ep();
    if (s == UCS_INPROGRESS) {
      return Unavailable("could not connect to the UCX worker of " + peer + " within " +
                         std::to_string(options.connect_timeout.count()) + " ms (" + w->settings() + ")");
    }
    return Unavailable("connecting to the UCX worker of " + peer + " (" + w->settings() + "): " + ucx_status_text(s));
  }
  bool by_put = options.writes == UcxOptions::Writes::kPut;
  if (options.writes == UcxOptions::Writes::kAuto) by_put = has_native_rma(ep);
  if (d.memory == UcxMemory::kStaged) by_put = false;  // unregistered device memory: only writes by message reach it
  lock.unlock();  // the remote registers its ack sink under it
  return std::unique_ptr<RemoteTarget>(new UcxRemote(w, peer, d, ep, rkey, std::move(health), by_put));
}

}  // namespace refit

#endif  // REFIT_HAVE_UCX
