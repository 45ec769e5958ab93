#include "transport/shm/shm_transport.h"

#include "net/frames.h"
#include "transport/shm/fd_handoff.h"
#include "transport/host_pool.h"
#include "transport/pool_layout.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <limits>
#include <string_view>

namespace refit {
namespace {

constexpr std::string_view kUsage = "expected shm:@refit-<pid>-<n>:slots=<S>:slot_bytes=<B>";

// How long an initiator waits for the target's process to hand over the segment.
constexpr std::chrono::seconds kHandoffWait{10};

std::atomic<std::uint64_t> g_segment_counter{0};

// A segment's size must fit off_t (ftruncate, mmap offsets).
constexpr std::uint64_t kMaxPoolBytes = static_cast<std::uint64_t>(std::numeric_limits<off_t>::max());

struct ShmDescriptor {
  std::string name;
  int slots = 0;
  std::uint64_t slot_bytes = 0;
};

Status parse_descriptor(const std::string& text, ShmDescriptor* out) {
  auto bad = [&](std::string_view why) {
    return InvalidArgument("bad shm descriptor \"" + text + "\": " + std::string(why) + "; " +
                           std::string(kUsage));
  };
  std::string_view s = text;
  if (!consume_prefix(&s, "shm:@refit-")) return bad("does not start with shm:@refit-");
  auto colon = s.find(':');
  if (colon == std::string_view::npos) return bad("missing :slots=");
  std::string_view id = s.substr(0, colon);  // "<pid>-<n>"
  auto dash = id.find('-');
  std::uint64_t pid = 0, n = 0;
  if (dash == std::string_view::npos || !parse_u64(id.substr(0, dash), &pid) ||
      !parse_u64(id.substr(dash + 1), &n)) {
    return bad("segment name is not @refit-<pid>-<n>");
  }
  s.remove_prefix(colon);
  std::uint64_t slots = 0, slot_bytes = 0;
  if (!consume_prefix(&s, ":slots=")) return bad("missing :slots=");
  auto colon2 = s.find(':');
  if (colon2 == std::string_view::npos || !parse_u64(s.substr(0, colon2), &slots)) return bad("bad slots");
  s.remove_prefix(colon2);
  if (!consume_prefix(&s, ":slot_bytes=") || !parse_u64(s, &slot_bytes)) return bad("bad slot_bytes");
  if (!checked_pool_size(slots, slot_bytes, kMaxPoolBytes)) {
    return bad("slots and slot_bytes must be positive and their product must fit");
  }
  out->name = "refit-" + std::string(id);
  out->slots = static_cast<int>(slots);
  out->slot_bytes = slot_bytes;
  return Status::Ok();
}

// ------------------------------------------------------------ target side

class ShmTarget final : public HostPoolTarget {
 public:
  // `kept`: a descriptor of the segment of its own, for unseal().
  ShmTarget(std::string name, std::string owner, std::byte* base, SlotShape shape, std::unique_ptr<FdServer> server,
            int kept)
      : HostPoolTarget(std::move(owner), base, shape), name_(std::move(name)), server_(std::move(server)),
        kept_(kept) {}
  ~ShmTarget() override {
    server_->stop();
    ::close(kept_);
  }

  std::string descriptor() const override {
    return "shm:@" + name_ + ":slots=" + std::to_string(slots()) + ":slot_bytes=" + std::to_string(slot_bytes());
  }
  Status receive_data(Link& link, const FrameHeader& header, Deadline) override {
    ASSIGN_OR_RETURN(const DataFrame data, decode_data(header, link.peer()));
    return FailedPrecondition("protocol error: kData frame (slot " + std::to_string(data.slot) + ", " +
                              std::to_string(data.payload_bytes) + " bytes) from " + link.peer() +
                              " for " + owner() + "'s shm pool @" + name_ +
                              ": shm is one-sided and never receives data frames");
  }
  // Every initiator holds the segment: stop handing it out.
  Status seal() override {
    server_->stop();
    return Status::Ok();
  }
  // A replacement trainer rank may open the segment again: serve it under
  // its name until the next seal().
  StatusOr<bool> unseal() override {
    const int fd = ::fcntl(kept_, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return ErrnoStatus("duplicating " + owner() + "'s receive pool descriptor", errno);
    server_->stop();
    ASSIGN_OR_RETURN(std::unique_ptr<FdServer> server, FdServer::Start(name_, fd));
    if (!server) {
      ::close(fd);
      return Unavailable("the name @" + name_ + " of " + owner() + "'s receive pool is taken; cannot serve it again");
    }
    server_ = std::move(server);
    return true;
  }

 private:
  std::string name_;
  std::unique_ptr<FdServer> server_;
  int kept_;
};

// ------------------------------------------------------------ initiator side

class ShmRemote final : public RemoteTarget {
 public:
  ShmRemote(std::string descriptor, std::byte* base, SlotShape shape)
      : descriptor_(std::move(descriptor)), pool_(base, shape) {}

  std::byte* mapped_slot(int slot) override { return pool_.slot(slot); }
  StatusOr<Ticket> submit(int slot, std::uint64_t offset, std::span<const std::byte> bytes, std::uint64_t,
                          Deadline) override {
    if (!pool_.shape().contains(slot, offset, bytes.size())) {
      return pool_.shape().range_error("shm target " + descriptor_, slot, offset, bytes.size());
    }
    std::byte* dst = mapped_slot(slot) + offset;
    // Packing in place (bytes already at dst) needs no copy.
    if (!bytes.empty() && bytes.data() != dst) std::memmove(dst, bytes.data(), bytes.size());
    return tickets_.next();
  }
  StatusOr<bool> poll(Ticket ticket) override { return tickets_.poll(ticket, "shm target " + descriptor_); }
  void cancel(Ticket) override {}

 private:
  std::string descriptor_;
  HostPool pool_;
  ImmediateTickets tickets_;
};

// The pool's memory: an unnamed tmpfs file, so that nothing is ever named in
// /dev/shm (a kill at any moment leaves nothing). In /dev/shm (O_TMPFILE),
// so /dev/shm's size limit applies as it did to named segments; a memfd
// where /dev/shm cannot make unnamed files.
StatusOr<int> create_unnamed_segment(const std::string& owner) {
  int fd = ::open("/dev/shm", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
  int err = errno;
  if (err == EOPNOTSUPP || err == EISDIR || err == ENOENT) {
    fd = ::memfd_create("refit-pool", MFD_CLOEXEC);
    if (fd >= 0) return fd;
    err = errno;
  }
  if (err == ENOSPC) return ResourceExhausted("no space in /dev/shm for " + owner + "'s receive pool");
  return ErrnoStatus("creating the shm segment of " + owner + "'s receive pool", err);
}

// Sizes the segment, allocates every page and maps it.
StatusOr<std::byte*> size_and_map(int fd, std::uint64_t size, const std::string& owner) {
  auto no_space = [&] {
    return ResourceExhausted("no space in /dev/shm for " + owner + "'s receive pool (" + std::to_string(size) +
                             " bytes)");
  };
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    int err = errno;
    if (err == ENOSPC || err == EFBIG || err == ENOMEM) return no_space();
    return ErrnoStatus("sizing the shm segment of " + owner + "'s receive pool", err);
  }
  // tmpfs grows lazily: without this a full /dev/shm shows up as SIGBUS at
  // the first write into a page. Allocate every page now.
  int rc;
  do {
    rc = ::posix_fallocate(fd, 0, static_cast<off_t>(size));
  } while (rc == EINTR);
  if (rc != 0) {
    if (rc == ENOSPC || rc == EFBIG || rc == ENOMEM) return no_space();
    return ErrnoStatus("allocating the shm segment of " + owner + "'s receive pool", rc);
  }
  // No MAP_POPULATE: the pages already exist; populating is what would
  // fill /dev/shm if the allocation above were ever skipped.
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    int err = errno;
    if (err == ENOMEM) return no_space();
    return ErrnoStatus("mapping the shm segment of " + owner + "'s receive pool", err);
  }
  return static_cast<std::byte*>(base);
}

class ShmTransport final : public Transport {
 public:
  std::string name() const override { return "shm"; }
  TransportCapabilities capabilities() const override {
    TransportCapabilities c;
    c.one_sided = true;
    c.cross_host = false;
    c.host_memory = true;
    c.device_memory = false;
    return c;
  }

  StatusOr<std::unique_ptr<TargetMemory>> create_target(const PoolOptions& options) override {
    const std::string owner = pool_owner(options);
    RETURN_IF_ERROR(require_host_memory("shm", options));
    ASSIGN_OR_RETURN(const std::uint64_t size, validated_pool_bytes(options, kMaxPoolBytes));
    ASSIGN_OR_RETURN(const int fd, create_unnamed_segment(owner));
    auto mapped = size_and_map(fd, size, owner);
    if (!mapped.ok()) {
      ::close(fd);
      return mapped.status();
    }
    // Find an unused socket name; an existing one belongs to someone else.
    std::string name;
    std::unique_ptr<FdServer> server;
    for (int attempt = 0; attempt < 1000 && !server; ++attempt) {
      name = "refit-" + std::to_string(::getpid()) + "-" + std::to_string(g_segment_counter.fetch_add(1));
      auto started = FdServer::Start(name, fd);
      if (!started.ok()) {  // fd closed by Start
        ::munmap(*mapped, size);
        return Status(started.status().code(), started.status().message() + " for " + owner + "'s receive pool");
      }
      server = std::move(*started);
    }
    if (!server) {
      ::munmap(*mapped, size);
      ::close(fd);
      return ResourceExhausted("no free socket name for " + owner + "'s receive pool (last tried @" + name + ")");
    }
    const int kept = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);  // fd is the server's now, open until it stops
    if (kept < 0) {
      const int error = errno;
      server->stop();
      ::munmap(*mapped, size);
      return ErrnoStatus("duplicating " + owner + "'s receive pool descriptor", error);
    }
    return std::unique_ptr<TargetMemory>(new ShmTarget(name, owner, *mapped,
                                                       SlotShape{options.slots, options.slot_bytes},
                                                       std::move(server), kept));
  }

  StatusOr<std::unique_ptr<TargetMemory>> expose_memory(std::byte*, std::uint64_t, MemoryKind, int) override {
    return cannot_expose_memory("shm");
  }

  StatusOr<std::unique_ptr<RemoteTarget>> open_target(const std::string& descriptor, Link* link) override {
    ShmDescriptor d;
    RETURN_IF_ERROR(parse_descriptor(descriptor, &d));
    const std::string whose = link != nullptr ? " of " + link->peer() : std::string();
    auto received = receive_fd(d.name, Deadline::After(kHandoffWait));
    if (!received.ok()) {
      Status s = received.status().WithContext("opening shm segment @" + d.name + whose + " (descriptor \"" +
                                              descriptor + "\")");
      if (s.code() == StatusCode::kNotFound) {
        return NotFound(s.message() + ": the target was sealed before this initiator opened it, or its process exited");
      }
      return s;
    }
    const int fd = *received;
    const std::uint64_t size = static_cast<std::uint64_t>(d.slots) * d.slot_bytes;
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      int err = errno;
      ::close(fd);
      return ErrnoStatus("stat of shm segment " + d.name + whose, err);
    }
    if (static_cast<std::uint64_t>(st.st_size) != size) {
      ::close(fd);
      return FailedPrecondition("shm segment " + d.name + whose + " is " + std::to_string(st.st_size) +
                                " bytes, but descriptor \"" + descriptor + "\" says " + std::to_string(size));
    }
    void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    ::close(fd);
    if (base == MAP_FAILED) return ErrnoStatus("mapping shm segment " + d.name + whose, err);
    return std::unique_ptr<RemoteTarget>(
        new ShmRemote(descriptor, static_cast<std::byte*>(base), SlotShape{d.slots, d.slot_bytes}));
  }
};

}  // namespace

std::unique_ptr<Transport> make_shm_transport() { return std::make_unique<ShmTransport>(); }

}  // namespace refit
