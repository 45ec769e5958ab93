#include "transport/ucx/ucx_transport.h"

#if REFIT_HAVE_UCX

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <span>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "cuda/device.h"
#include "refit/log.h"
#include "cuda/device.h"
#include "transport/pool_layout.h"
#include "transport/ucx/ucx_descriptor.h"
#include "transport/ucx/ucx_device_stager.h"
#include "transport/ucx/ucx_worker.h"

namespace refit {
namespace {

using Clock = std::chrono::steady_clock;

// A pool the address space can hold (mmap of size_t bytes, with room to spare).
constexpr std::uint64_t kMaxPoolBytes = std::numeric_limits<std::size_t>::max() / 2;
// How long a destructor waits for UCX to finish a flush or an endpoint close.
constexpr std::chrono::seconds kTeardownWait{5};
// How long one poll call naps when the write is still on its way (the
// remote's progress thread moves it; poll only looks).
constexpr std::chrono::microseconds kPollNap{100};

bool supports(std::uint64_t memory_types, ucs_memory_type_t type) {
  return (memory_types & (std::uint64_t{1} << static_cast<unsigned>(type))) != 0;
}

bool in_range(int slot, std::uint64_t offset, std::uint64_t bytes, int slots, std::uint64_t slot_bytes) {
  return slot >= 0 && slot < slots && offset <= slot_bytes && bytes <= slot_bytes - offset;
}

std::string pool_shape(int slots, std::uint64_t slot_bytes) {
  return "(slots=" + std::to_string(slots) + ", slot_bytes=" + std::to_string(slot_bytes) + ")";
}

// Status of a request pointer returned by a UCP *_nbx call, without waiting:
// UCS_OK, UCS_INPROGRESS, or the error. REQUIRES: the worker's mutex is held.
ucs_status_t request_status(void* request) {
  if (request == nullptr) return UCS_OK;
  if (UCS_PTR_IS_ERR(request)) return UCS_PTR_STATUS(request);
  return ucp_request_check_status(request);
}

void release_request(void* request) {
  if (request != nullptr && !UCS_PTR_IS_ERR(request)) ucp_request_free(request);
}

// Progresses `worker` until `request` completed or `wait` passed; returns its
// status (UCS_INPROGRESS when it did not finish) and releases it when done.
// REQUIRES: the worker's mutex is held by the caller (`lock`).
ucs_status_t wait_request(UcxWorker& worker, void* request, std::chrono::milliseconds wait) {
  const auto until = Clock::now() + wait;
  ucs_status_t s = request_status(request);
  while (s == UCS_INPROGRESS && Clock::now() < until) {
    ucp_worker_progress(worker.worker());
    s = request_status(request);
  }
  if (s != UCS_INPROGRESS) release_request(request);
  return s;
}

// ------------------------------------------------------------ target side

// The registered range: ucp_mem_map'ed once, unmapped in the destructor.
struct Registration {
  std::shared_ptr<UcxWorker> worker;
  ucp_mem_h memh = nullptr;
  ~Registration() {
    if (memh == nullptr) return;
    std::lock_guard<std::mutex> lock(worker->mutex());
    ucp_mem_unmap(worker->context(), memh);
  }
};

// True when this UCX build registers and moves CUDA memory itself.
bool native_cuda(const UcxWorker& w) { return supports(w.memory_types(), UCS_MEMORY_TYPE_CUDA); }

// Prints once per process that device memory is staged through host memory.
void note_host_staging(const std::string& settings) {
  static std::once_flag once;
  std::call_once(once, [&] {
    log(LogLevel::kInfo, "refit ucx",
        "this UCX build cannot register CUDA memory (" + settings +
            "): device memory is staged through pinned host buffers (ucx_memory_path host-staged)");
  });
}

// Registers [base, base + bytes) of `memory` and describes it as `slots`
// slots of `slot_bytes` bytes. `what` names the memory in errors. Device
// memory that this UCX cannot register is not registered (mem=staged: only
// active-message writes reach it, through a UcxDeviceStager).
StatusOr<std::unique_ptr<Registration>> register_memory(const std::shared_ptr<UcxWorker>& worker, std::byte* base,
                                                        std::uint64_t bytes, MemoryKind memory,
                                                        const std::string& what, int slots,
                                                        std::uint64_t slot_bytes, std::string* descriptor) {
  auto reg = std::make_unique<Registration>();
  reg->worker = worker;
  UcxDescriptor d;
  d.slots = slots;
  d.slot_bytes = slot_bytes;
  d.addr = reinterpret_cast<std::uintptr_t>(base);
  d.worker = worker->address();
  if (memory == MemoryKind::kCuda && !native_cuda(*worker)) {
    d.memory = UcxMemory::kStaged;
    *descriptor = format_ucx_descriptor(d);
    return reg;
  }
  d.memory = memory == MemoryKind::kCuda ? UcxMemory::kCuda : UcxMemory::kHost;
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
  params.address = base;
  params.length = bytes;
  params.memory_type = memory == MemoryKind::kCuda ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
  std::lock_guard<std::mutex> lock(worker->mutex());
  ucs_status_t s = ucp_mem_map(worker->context(), &params, &reg->memh);
  if (s != UCS_OK) {
    reg->memh = nullptr;
    return ResourceExhausted("registering " + what + " (" + std::to_string(bytes) + " bytes) with UCX (ucp_mem_map, " +
                             worker->settings() + "): " + ucx_status_text(s));
  }
  void* rkey = nullptr;
  std::size_t rkey_bytes = 0;
  s = ucp_rkey_pack(worker->context(), reg->memh, &rkey, &rkey_bytes);
  if (s != UCS_OK) return Internal("packing the remote key of " + what + ": " + ucx_status_text(s));
  const auto* key = static_cast<const unsigned char*>(rkey);
  d.rkey.assign(key, key + rkey_bytes);
  ucp_rkey_buffer_release(rkey);
  *descriptor = format_ucx_descriptor(d);
  return reg;
}

class UcxTarget final : public TargetMemory {
 public:
  // `owned_bytes` > 0: `base` is an mmap of that size this target unmaps;
  // `device_pool`: a device allocation it frees; otherwise the caller owns
  // the memory (expose_memory).
  UcxTarget(std::string owner, int slots, std::uint64_t slot_bytes, std::byte* base, std::uint64_t owned_bytes,
            DeviceBuffer device_pool, MemoryKind memory, int device, std::unique_ptr<Registration> registration,
            std::string descriptor, std::unique_ptr<UcxDeviceStager> stager)
      : owner_(std::move(owner)),
        slots_(slots),
        slot_bytes_(slot_bytes),
        base_(base),
        owned_bytes_(owned_bytes),
        device_pool_(std::move(device_pool)),
        memory_(memory),
        device_(device),
        registration_(std::move(registration)),
        descriptor_(std::move(descriptor)),
        stager_(std::move(stager)),
        progress_(std::make_unique<UcxWorker::ProgressLease>(registration_->worker)) {
    // Active-message writes land on the progress thread: by memcpy into host
    // memory, through the stager into device memory.
    UcxWorker& w = *registration_->worker;
    std::lock_guard<std::mutex> lock(w.mutex());
    w.am().add_range(reinterpret_cast<std::uintptr_t>(base_), static_cast<std::uint64_t>(slots_) * slot_bytes_,
                     stager_.get());
  }

  ~UcxTarget() override {
    {
      UcxWorker& w = *registration_->worker;
      std::lock_guard<std::mutex> lock(w.mutex());
      w.am().remove_range(reinterpret_cast<std::uintptr_t>(base_));  // later writes are refused
    }
    progress_.reset();      // the last target of the worker stops its thread
    registration_.reset();  // ucp_mem_unmap before the memory goes
    if (owned_bytes_ > 0) ::munmap(base_, owned_bytes_);
  }

  std::string descriptor() const override { return descriptor_; }
  int slots() const override { return slots_; }
  std::uint64_t slot_bytes() const override { return slot_bytes_; }
  MemoryKind memory() const override { return memory_; }
  int device() const override { return device_; }
  std::byte* slot(int i) override {
    if (i < 0 || i >= slots_) return nullptr;
    return base_ + static_cast<std::uint64_t>(i) * slot_bytes_;
  }
  Status receive_data(Link& link, const FrameHeader& header, Deadline) override {
    return FailedPrecondition("protocol error: kData frame (slot " + std::to_string(header.b) + ", " +
                              std::to_string(header.payload_bytes) + " bytes) from " + link.peer() + " for " +
                              owner_ + "'s ucx pool: ucx writes by remote memory access and never receives data frames");
  }
  Status seal() override { return Status::Ok(); }  // nothing has a name

 private:
  std::string owner_;
  int slots_;
  std::uint64_t slot_bytes_;
  std::byte* base_;
  std::uint64_t owned_bytes_;
  DeviceBuffer device_pool_;
  MemoryKind memory_;
  int device_;
  std::unique_ptr<Registration> registration_;
  std::string descriptor_;
  std::unique_ptr<UcxDeviceStager> stager_;  // device memory: how active-message writes reach it
  std::unique_ptr<UcxWorker::ProgressLease> progress_;
};

// ------------------------------------------------------------ initiator side

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
      release_request(op.put);  // released by UCX when they complete
      release_request(op.flush);
      for (void* send : op.sends) release_request(send);
    }
    ucp_request_param_t param{};
    // The rkey may go only once the operations that use it are flushed: a
    // bounded flush, skipped on a failed endpoint (its operations are done).
    if (by_put_ && pending && health_->status.load() == UCS_OK) {
      (void)wait_request(*worker_, ucp_ep_flush_nbx(ep_, &param), kTeardownWait);
    }
    if (rkey_ != nullptr) ucp_rkey_destroy(rkey_);
    // Force: no goodbye to a peer that may be gone; afterwards UCX reads no
    // source buffer of a cancelled write.
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    (void)wait_request(*worker_, ucp_ep_close_nbx(ep_, &param), kTeardownWait);
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
          release_request(op.put);
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
          for (void* send : op.sends) release_request(send);  // released when the failed endpoint cancels them
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
      const ucs_status_t r = request_status(request);
      if (r == UCS_INPROGRESS) {
        pending = true;
        return;
      }
      if (r != UCS_OK && *s == UCS_OK) *s = r;
      release_request(request);
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
      release_request(op.put);
      release_request(op.flush);
      for (void* send : op.sends) release_request(send);
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

// ------------------------------------------------------------ the transport

class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(UcxOptions options) : options_(std::move(options)) {}

  std::string name() const override { return "ucx"; }

  TransportCapabilities capabilities() const override {
    TransportCapabilities c;
    c.one_sided = false;  // no mapped_slot: the trainer packs into its own buffer
    c.remote_write = true;
    c.cross_host = true;
    c.host_memory = true;
    auto w = worker();
    const bool native = w.ok() && native_cuda(**w);
    // Device memory: registered where this UCX supports CUDA; otherwise
    // staged through pinned host buffers (needs refit built with CUDA).
    c.device_memory = native || REFIT_HAVE_CUDA;
    c.device_memory_staged = c.device_memory && !native;
    // Direct mode: expose_memory registers the engine's weights (one slot);
    // the trainer submits each packed run at its arena offset.
    c.direct = true;
    return c;
  }

  StatusOr<std::unique_ptr<TargetMemory>> create_target(const PoolOptions& options) override {
    const std::string owner = pool_owner(options);
    ASSIGN_OR_RETURN(auto w, worker());
    ASSIGN_OR_RETURN(const std::uint64_t size, validated_pool_bytes(options, kMaxPoolBytes));
    std::unique_ptr<UcxDeviceStager> stager;
    if (options.memory == MemoryKind::kCuda) {
      ASSIGN_OR_RETURN(stager, make_stager(*w, options.device, owner + "'s receive pool"));
    }
    std::byte* base = nullptr;
    std::uint64_t owned = 0;
    DeviceBuffer device_pool;
    if (options.memory == MemoryKind::kCuda) {
      ASSIGN_OR_RETURN(device_pool, DeviceBuffer::Allocate(options.device, size));
      base = device_pool.data();
    } else {
      // Page-aligned; MAP_POPULATE touches every page now (setup), not mid-refit.
      void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        if (err == ENOMEM) {
          return ResourceExhausted("no memory for " + owner + "'s receive pool (" + std::to_string(size) + " bytes)");
        }
        return ErrnoStatus("allocating " + owner + "'s receive pool (" + std::to_string(size) + " bytes)", err);
      }
      base = static_cast<std::byte*>(p);
      owned = size;
    }
    std::string descriptor;
    auto reg = register_memory(w, base, size, options.memory, owner + "'s receive pool", options.slots,
                               options.slot_bytes, &descriptor);
    if (!reg.ok()) {
      if (owned > 0) ::munmap(base, owned);
      return reg.status();
    }
    return std::unique_ptr<TargetMemory>(new UcxTarget(owner, options.slots, options.slot_bytes, base, owned,
                                                       std::move(device_pool), options.memory,
                                                       options.memory == MemoryKind::kCuda ? options.device : -1,
                                                       std::move(*reg), std::move(descriptor), std::move(stager)));
  }

  StatusOr<std::unique_ptr<TargetMemory>> expose_memory(std::byte* base, std::uint64_t bytes, MemoryKind memory,
                                                        int device) override {
    const std::string what = "exposed memory at " + std::to_string(reinterpret_cast<std::uintptr_t>(base)) + " (" +
                             std::to_string(bytes) + " bytes)";
    if (base == nullptr || bytes == 0 || bytes > static_cast<std::uint64_t>(std::numeric_limits<std::uintptr_t>::max() -
                                                                            reinterpret_cast<std::uintptr_t>(base))) {
      return InvalidArgument("ucx cannot expose " + what + ": empty or wrapping range");
    }
    ASSIGN_OR_RETURN(auto w, worker());
    std::unique_ptr<UcxDeviceStager> stager;
    if (memory == MemoryKind::kCuda) {
      ASSIGN_OR_RETURN(stager, make_stager(*w, device, what));
    }
    std::string descriptor;
    ASSIGN_OR_RETURN(auto reg, register_memory(w, base, bytes, memory, what, 1, bytes, &descriptor));
    return std::unique_ptr<TargetMemory>(new UcxTarget("exposed memory", 1, bytes, base, 0, DeviceBuffer(), memory,
                                                       memory == MemoryKind::kCuda ? device : -1, std::move(reg),
                                                       std::move(descriptor), std::move(stager)));
  }

  StatusOr<std::unique_ptr<RemoteTarget>> open_target(const std::string& descriptor, Link* link) override {
    ASSIGN_OR_RETURN(UcxDescriptor d, parse_ucx_descriptor(descriptor));
    const std::string peer = link != nullptr ? link->peer() : std::string("the ucx target");
    ASSIGN_OR_RETURN(auto w, worker());
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
      (void)wait_request(*w, ucp_ep_close_nbx(ep, &param), kTeardownWait);
    };
    if (s != UCS_OK) {
      close_ep();
      return InvalidArgument("the remote key in ucx descriptor of " + peer + " cannot be used (" + w->settings() +
                             "): " + ucx_status_text(s));
    }
    // Wire the endpoint up now (a flush waits for it), so an engine that
    // cannot be reached fails setup rather than the first refit.
    ucp_request_param_t param{};
    s = wait_request(*w, ucp_ep_flush_nbx(ep, &param), options_.connect_timeout);
    if (s == UCS_OK && health->status.load() != UCS_OK) s = static_cast<ucs_status_t>(health->status.load());
    if (s != UCS_OK) {
      if (rkey != nullptr) ucp_rkey_destroy(rkey);
      close_ep();
      if (s == UCS_INPROGRESS) {
        return Unavailable("could not connect to the UCX worker of " + peer + " within " +
                           std::to_string(options_.connect_timeout.count()) + " ms (" + w->settings() + ")");
      }
      return Unavailable("connecting to the UCX worker of " + peer + " (" + w->settings() + "): " + ucx_status_text(s));
    }
    bool by_put = options_.writes == UcxOptions::Writes::kPut;
    if (options_.writes == UcxOptions::Writes::kAuto) by_put = has_native_rma(ep);
    if (d.memory == UcxMemory::kStaged) by_put = false;  // unregistered device memory: only writes by message reach it
    lock.unlock();  // the remote registers its ack sink under it
    return std::unique_ptr<RemoteTarget>(new UcxRemote(w, peer, d, ep, rkey, std::move(health), by_put));
  }

 private:
  // The transport's one context and worker, created on first use.
  StatusOr<std::shared_ptr<UcxWorker>> worker() const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!worker_) {
      auto w = UcxWorker::Create(options_);
      if (!w.ok()) return w.status();
      worker_ = std::move(*w);
    }
    return worker_;
  }

  // The stager of device memory on local CUDA index `device`: active-message
  // writes (tcp) reach device memory only through it, whether or not this UCX
  // registers CUDA memory for puts. Says once when nothing else can.
  static StatusOr<std::unique_ptr<UcxDeviceStager>> make_stager(const UcxWorker& w, int device,
                                                                const std::string& what) {
    auto stager = UcxDeviceStager::Create(device, kAmChunkBytes);
    if (!stager.ok()) {
      return stager.status().WithContext("ucx cannot reach " + what + " in CUDA memory on device " +
                                         std::to_string(device) + " (" + w.settings() + ")");
    }
    if (!native_cuda(w)) note_host_staging(w.settings());
    return stager;
  }

  UcxOptions options_;
  mutable std::mutex mutex_;
  mutable std::shared_ptr<UcxWorker> worker_;
};

}  // namespace

std::unique_ptr<Transport> make_ucx_transport_with(const UcxOptions& options) {
  return std::make_unique<UcxTransport>(options);
}
std::unique_ptr<Transport> make_ucx_transport() { return make_ucx_transport_with(UcxOptions{}); }

}  // namespace refit

#endif  // REFIT_HAVE_UCX
