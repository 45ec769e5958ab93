#include "transport/tcp/tcp_transport.h"

#include "transport/pool_layout.h"

#include <sys/mman.h>

#include <cerrno>
#include <charconv>
#include <limits>
#include <string_view>

namespace refit {
namespace {

constexpr std::string_view kUsage = "expected tcp:slots=<S>:slot_bytes=<B>";
// A pool the address space can hold (mmap of size_t bytes, with room to spare).
constexpr std::uint64_t kMaxPoolBytes = std::numeric_limits<std::size_t>::max() / 2;

bool in_range(std::uint64_t slot, std::uint64_t offset, std::uint64_t bytes, int slots, std::uint64_t slot_bytes) {
  return slot < static_cast<std::uint64_t>(slots) && offset <= slot_bytes && bytes <= slot_bytes - offset;
}

std::string pool_shape(int slots, std::uint64_t slot_bytes) {
  return "(slots=" + std::to_string(slots) + ", slot_bytes=" + std::to_string(slot_bytes) + ")";
}

// ------------------------------------------------------------ target side

class TcpTarget final : public TargetMemory {
 public:
  TcpTarget(std::string owner, int slots, std::uint64_t slot_bytes, std::byte* base)
      : owner_(std::move(owner)), slots_(slots), slot_bytes_(slot_bytes), base_(base) {}
  ~TcpTarget() override { ::munmap(base_, static_cast<std::size_t>(slots_) * slot_bytes_); }

  std::string descriptor() const override {
    return "tcp:slots=" + std::to_string(slots_) + ":slot_bytes=" + std::to_string(slot_bytes_);
  }
  int slots() const override { return slots_; }
  std::uint64_t slot_bytes() const override { return slot_bytes_; }
  MemoryKind memory() const override { return MemoryKind::kHost; }
  int device() const override { return -1; }
  std::byte* slot(int i) override {
    if (i < 0 || i >= slots_) return nullptr;
    return base_ + static_cast<std::uint64_t>(i) * slot_bytes_;
  }

  Status receive_data(Link& link, const FrameHeader& header, Deadline deadline) override {
    if (header.type != FrameType::kData) {
      return Internal("receive_data for " + owner_ + " called with a frame of type " +
                      std::to_string(static_cast<int>(header.type)) + " from " + link.peer() + " (expected kData)");
    }
    const std::uint64_t slot = header.b, offset = header.c, bytes = header.payload_bytes;
    if (!in_range(slot, offset, bytes, slots_, slot_bytes_)) {
      return InvalidArgument("bad kData frame from " + link.peer() + " (version " + std::to_string(header.a) +
                             "): " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
                             " into slot " + std::to_string(slot) + " are outside " + owner_ +
                             "'s receive pool " + pool_shape(slots_, slot_bytes_));
    }
    std::byte* dst = base_ + slot * slot_bytes_ + offset;
    Status s = link.recv_payload(std::span<std::byte>(dst, static_cast<std::size_t>(bytes)), deadline);
    if (!s.ok()) {
      return s.WithContext("receiving " + std::to_string(bytes) + " bytes for slot " + std::to_string(slot) +
                           " of " + owner_);
    }
    return Status::Ok();
  }

  Status seal() override { return Status::Ok(); }  // nothing has a name

 private:
  std::string owner_;
  int slots_;
  std::uint64_t slot_bytes_;
  std::byte* base_;
};

// ------------------------------------------------------------ initiator side

class TcpRemote final : public RemoteTarget {
 public:
  TcpRemote(Link* link, int slots, std::uint64_t slot_bytes) : link_(link), slots_(slots), slot_bytes_(slot_bytes) {}

  std::byte* mapped_slot(int) override { return nullptr; }

  StatusOr<Ticket> submit(int slot, std::uint64_t offset, std::span<const std::byte> bytes, std::uint64_t version,
                          Deadline deadline) override {
    if (slot < 0 || !in_range(static_cast<std::uint64_t>(slot), offset, bytes.size(), slots_, slot_bytes_)) {
      return InvalidArgument("write of " + std::to_string(bytes.size()) + " bytes at offset " +
                             std::to_string(offset) + " into slot " + std::to_string(slot) + " of tcp target " +
                             link_->peer() + " is out of range " + pool_shape(slots_, slot_bytes_));
    }
    FrameHeader h;
    h.type = FrameType::kData;
    h.a = version;
    h.b = static_cast<std::uint64_t>(slot);
    h.c = offset;
    h.payload_bytes = bytes.size();
    Status s = link_->send(h, bytes, deadline);
    if (!s.ok()) {
      return s.WithContext("writing " + std::to_string(bytes.size()) + " bytes into slot " + std::to_string(slot));
    }
    return next_ticket_++;
  }
  StatusOr<bool> poll(Ticket ticket) override {
    if (ticket >= next_ticket_) {
      return InvalidArgument("poll of unknown ticket " + std::to_string(ticket) + " on tcp target " + link_->peer());
    }
    return true;
  }
  void cancel(Ticket) override {}

 private:
  Link* link_;
  int slots_;
  std::uint64_t slot_bytes_;
  Ticket next_ticket_ = 0;
};

class TcpTransport final : public Transport {
 public:
  std::string name() const override { return "tcp"; }
  TransportCapabilities capabilities() const override {
    TransportCapabilities c;
    c.one_sided = false;
    c.cross_host = true;
    c.host_memory = true;
    c.device_memory = false;
    return c;
  }

  StatusOr<std::unique_ptr<TargetMemory>> create_target(const PoolOptions& options) override {
    const std::string owner = pool_owner(options);
    if (options.memory != MemoryKind::kHost) {
      return FailedPrecondition("tcp transport cannot hold " + owner +
                                "'s receive pool in CUDA memory (memory=cuda); use host memory or a "
                                "transport with device_memory");
    }
    ASSIGN_OR_RETURN(const std::uint64_t size, validated_pool_bytes(options, kMaxPoolBytes));
    // Page-aligned; MAP_POPULATE touches every page now (setup), not mid-refit.
    void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (base == MAP_FAILED) {
      int err = errno;
      if (err == ENOMEM) {
        return ResourceExhausted("no memory for " + owner + "'s receive pool (" + std::to_string(size) + " bytes)");
      }
      return ErrnoStatus("allocating " + owner + "'s receive pool (" + std::to_string(size) + " bytes)", err);
    }
    return std::unique_ptr<TargetMemory>(
        new TcpTarget(owner, options.slots, options.slot_bytes, static_cast<std::byte*>(base)));
  }

  StatusOr<std::unique_ptr<TargetMemory>> expose_memory(std::byte*, std::uint64_t, MemoryKind, int) override {
    return FailedPrecondition("transport tcp cannot expose existing memory (direct mode needs cuda_ipc)");
  }

  StatusOr<std::unique_ptr<RemoteTarget>> open_target(const std::string& descriptor, Link* link) override {
    auto bad = [&](std::string_view why) {
      return InvalidArgument("bad tcp descriptor \"" + descriptor + "\": " + std::string(why) + "; " +
                             std::string(kUsage));
    };
    std::string_view s = descriptor;
    std::uint64_t slots = 0, slot_bytes = 0;
    if (!consume_prefix(&s, "tcp:slots=")) return bad("does not start with tcp:slots=");
    auto colon = s.find(':');
    if (colon == std::string_view::npos || !parse_u64(s.substr(0, colon), &slots)) return bad("bad slots");
    s.remove_prefix(colon);
    if (!consume_prefix(&s, ":slot_bytes=") || !parse_u64(s, &slot_bytes)) return bad("bad slot_bytes");
    if (!checked_pool_size(slots, slot_bytes, kMaxPoolBytes)) {
      return bad("slots and slot_bytes must be positive and their product must fit");
    }
    if (link == nullptr) {
      return InvalidArgument("tcp target \"" + descriptor + "\" needs the data-plane link (got none)");
    }
    return std::unique_ptr<RemoteTarget>(new TcpRemote(link, static_cast<int>(slots), slot_bytes));
  }
};

}  // namespace

std::unique_ptr<Transport> make_tcp_transport() { return std::make_unique<TcpTransport>(); }

}  // namespace refit
