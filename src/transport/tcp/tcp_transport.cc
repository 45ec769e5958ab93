#include "transport/tcp/tcp_transport.h"

#include "net/frames.h"
#include "transport/host_pool.h"
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

// ------------------------------------------------------------ target side

class TcpTarget final : public HostPoolTarget {
 public:
  using HostPoolTarget::HostPoolTarget;

  std::string descriptor() const override {
    return "tcp:slots=" + std::to_string(slots()) + ":slot_bytes=" + std::to_string(slot_bytes());
  }

  Status receive_data(Link& link, const FrameHeader& header, Deadline deadline) override {
    if (header.type != FrameType::kData) {
      return Internal("receive_data for " + owner() + " called with a frame of type " +
                      std::to_string(static_cast<int>(header.type)) + " from " + link.peer() + " (expected kData)");
    }
    ASSIGN_OR_RETURN(const DataFrame data, decode_data(header, link.peer()));
    const std::uint64_t slot = data.slot, offset = data.offset, bytes = data.payload_bytes;
    if (!pool().shape().contains(static_cast<std::int64_t>(slot), offset, bytes)) {
      return InvalidArgument("bad kData frame from " + link.peer() + " (version " + std::to_string(data.version) +
                             "): " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
                             " into slot " + std::to_string(slot) + " are outside " + owner() +
                             "'s receive pool " + pool().shape().text());
    }
    std::byte* dst = pool().slot(static_cast<std::int64_t>(slot)) + offset;
    Status s = link.recv_payload(std::span<std::byte>(dst, static_cast<std::size_t>(bytes)), deadline);
    if (!s.ok()) {
      return s.WithContext("receiving " + std::to_string(bytes) + " bytes for slot " + std::to_string(slot) +
                           " of " + owner());
    }
    return Status::Ok();
  }

  Status seal() override { return Status::Ok(); }  // nothing has a name
};

// ------------------------------------------------------------ initiator side

class TcpRemote final : public RemoteTarget {
 public:
  TcpRemote(Link* link, SlotShape shape) : link_(link), shape_(shape) {}

  std::byte* mapped_slot(int) override { return nullptr; }

  StatusOr<Ticket> submit(int slot, std::uint64_t offset, std::span<const std::byte> bytes, std::uint64_t version,
                          Deadline deadline) override {
    if (!shape_.contains(slot, offset, bytes.size())) {
      return shape_.range_error("tcp target " + link_->peer(), slot, offset, bytes.size());
    }
    DataFrame frame;
    frame.version = version;
    frame.slot = static_cast<std::uint64_t>(slot);
    frame.offset = offset;
    frame.payload_bytes = bytes.size();
    Status s = link_->send(encode(frame), bytes, deadline);
    if (!s.ok()) {
      return s.WithContext("writing " + std::to_string(bytes.size()) + " bytes into slot " + std::to_string(slot));
    }
    return tickets_.next();
  }
  StatusOr<bool> poll(Ticket ticket) override { return tickets_.poll(ticket, "tcp target " + link_->peer()); }
  void cancel(Ticket) override {}

 private:
  Link* link_;
  SlotShape shape_;
  ImmediateTickets tickets_;
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
    RETURN_IF_ERROR(require_host_memory("tcp", options));
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
        new TcpTarget(owner, static_cast<std::byte*>(base), SlotShape{options.slots, options.slot_bytes}));
  }

  StatusOr<std::unique_ptr<TargetMemory>> expose_memory(std::byte*, std::uint64_t, MemoryKind, int) override {
    return cannot_expose_memory("tcp");
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
    return std::unique_ptr<RemoteTarget>(new TcpRemote(link, SlotShape{static_cast<int>(slots), slot_bytes}));
  }
};

}  // namespace

std::unique_ptr<Transport> make_tcp_transport() { return std::make_unique<TcpTransport>(); }

}  // namespace refit
