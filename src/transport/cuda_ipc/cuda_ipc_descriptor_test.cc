// The cuda_ipc descriptor parser and the direct-mode surface of the host
// transports: no GPU needed, runs in every build (the GPU half is
// cuda_ipc_gpu_test.cc, label gpu).
#include "transport/cuda_ipc/cuda_ipc_descriptor.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "cuda/device.h"
#include "transport/transport.h"

namespace refit {
namespace {

#define EXPECT_HAS(haystack, needle)                               \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) \
      << "expected \"" << (needle) << "\" in: " << (haystack)

CudaIpcDescriptor Sample() {
  CudaIpcDescriptor d;
  d.pci_bus_id = "0000:3B:00.0";
  d.slots = 3;
  d.slot_bytes = 200003;
  d.offset = 4099;
  for (std::size_t i = 0; i < d.handle.size(); ++i) d.handle[i] = static_cast<unsigned char>(i * 37 + 5);
  return d;
}

// Catches: a format that drifts from what the parser (in another process,
// maybe another build) expects, or a handle written with the wrong nibble order.
TEST(CudaIpcDescriptor, FormatIsExactAndRoundTrips) {
  CudaIpcDescriptor d = Sample();
  d.handle.fill(0);
  d.handle[0] = 0xab;
  d.handle[63] = 0x0f;
  const std::string text = format_cuda_ipc_descriptor(d);
  EXPECT_EQ(text, "cuda_ipc:dev=0000:3B:00.0:slots=3:slot_bytes=200003:offset=4099:handle=ab" +
                      std::string(124, '0') + "0f");
  const CudaIpcDescriptor s = Sample();
  auto back = parse_cuda_ipc_descriptor(format_cuda_ipc_descriptor(s));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->pci_bus_id, s.pci_bus_id);
  EXPECT_EQ(back->slots, s.slots);
  EXPECT_EQ(back->slot_bytes, s.slot_bytes);
  EXPECT_EQ(back->offset, s.offset);
  EXPECT_EQ(back->handle, s.handle);
}

// A receive pool's descriptor carries one event handle per slot. Catches:
// events lost or reordered in a round trip, a count that does not match the
// slots, events that are not lowercase hex, an empty events field.
TEST(CudaIpcDescriptor, EventsRoundTripOnePerSlotAndAreStrict) {
  CudaIpcDescriptor d = Sample();
  for (int i = 0; i < d.slots; ++i) {
    std::array<unsigned char, kCudaIpcHandleBytes> e{};
    for (std::size_t k = 0; k < e.size(); ++k) e[k] = static_cast<unsigned char>(i * 101 + k * 3);
    d.events.push_back(e);
  }
  const std::string text = format_cuda_ipc_descriptor(d);
  EXPECT_EQ(text.substr(text.find(":events=") + 8), cuda_ipc_handle_hex(d.events[0]) +
                                                          cuda_ipc_handle_hex(d.events[1]) +
                                                          cuda_ipc_handle_hex(d.events[2]));
  auto back = parse_cuda_ipc_descriptor(text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->handle, d.handle);
  EXPECT_EQ(back->events, d.events);
  EXPECT_TRUE(parse_cuda_ipc_descriptor(format_cuda_ipc_descriptor(Sample()))->events.empty());

  const std::string one = cuda_ipc_handle_hex(d.events[0]);
  const std::string base = format_cuda_ipc_descriptor(Sample());
  std::string upper = one;
  upper[0] = 'A';
  for (const std::string& bad : {base + ":events=", base + ":events=" + one + one, base + ":events=" + one + one + one + one,
                                 base + ":events=" + one + one + one.substr(1), base + ":events=" + one + one + upper,
                                 base + ":events=" + one + one + one + ":"}) {
    auto r = parse_cuda_ipc_descriptor(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_HAS(r.status().message(), bad);
    }
  }
}

TEST(CudaIpcDescriptor, PciBusIds) {
  for (const char* ok : {"0000:3B:00.0", "0000:3b:00.0", "00000000:3B:00.0", "0001:C1:1f.7"}) {
    EXPECT_TRUE(is_pci_bus_id(ok)) << ok;
  }
  for (const char* bad : {"", "0", "000:3B:00.0", "000000000:3B:00.0", "0000:3B:00", "0000:3B:00.00", "0000:3B.00.0",
                          "0000:3G:00.0", "0000::00.0", "0000:3B:00.0 ", "GPU-0000"}) {
    EXPECT_FALSE(is_pci_bus_id(bad)) << bad;
  }
}

// Catches: a lax parser (trailing junk, zero or signed sizes, hex numbers,
// a short or uppercase handle, fields out of order, another transport's
// descriptor), overflow of offset + slots * slot_bytes, or an error that
// does not quote the descriptor.
TEST(CudaIpcDescriptor, ParserIsStrict) {
  const std::string good = format_cuda_ipc_descriptor(Sample());
  ASSERT_TRUE(parse_cuda_ipc_descriptor(good).ok());
  const std::string handle = good.substr(good.find(":handle=") + 8);
  std::vector<std::string> bad = {
      "", "garbage", "cuda_ipc:", "cuda_ipc:dev=", good + "x", good + ":", " " + good, good + " ",
      good.substr(0, good.size() - 1), "shm:/refit-1-2:slots=3:slot_bytes=200003", "tcp:slots=3:slot_bytes=200003",
      "CUDA_IPC" + good.substr(8),
  };
  auto replace = [&](const std::string& field, const std::string& value) {
    const auto at = good.find(field);
    ASSERT_NE(at, std::string::npos) << field;
    auto end = good.find(':', at + field.size());
    if (field == ":dev=") end = good.find(":slots=");
    if (end == std::string::npos) end = good.size();
    bad.push_back(good.substr(0, at) + field + value + good.substr(end));
  };
  for (const char* v : {"", "0", "-1", "+2", "0x3", " 3", "3 ", "2147483648", "99999999999999999999999"}) {
    replace(":slots=", v);
  }
  for (const char* v : {"", "0", "-1", "+2", "0x100", "1e3", "99999999999999999999999"}) replace(":slot_bytes=", v);
  for (const char* v : {"", "-1", "+0", "0x0", "99999999999999999999999"}) replace(":offset=", v);
  for (const char* v : {"", "0", "3B:00.0", "0000:3B:00.0:", "GPU-1234", "0000:3B:00.0x"}) replace(":dev=", v);
  std::string upper = handle;
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](char c) { return static_cast<char>(c >= 'a' && c <= 'f' ? c - 32 : c); });
  for (const std::string& v : {std::string(), handle.substr(2), handle + "00", upper, std::string(128, 'g'),
                               handle.substr(0, 126) + "-1"}) {
    replace(":handle=", v);
  }
  // Fields out of order, or one missing.
  bad.push_back("cuda_ipc:dev=0000:3B:00.0:slot_bytes=200003:slots=3:offset=4099:handle=" + handle);
  bad.push_back("cuda_ipc:dev=0000:3B:00.0:slots=3:slot_bytes=200003:handle=" + handle);
  bad.push_back("cuda_ipc:slots=3:slot_bytes=200003:offset=0:handle=" + handle);
  // offset + slots * slot_bytes overflows 64 bits (each part alone fits).
  bad.push_back("cuda_ipc:dev=0000:3B:00.0:slots=2:slot_bytes=9223372036854775807:offset=2:handle=" + handle);
  bad.push_back("cuda_ipc:dev=0000:3B:00.0:slots=4:slot_bytes=4611686018427387904:offset=0:handle=" + handle);
  for (const std::string& d : bad) {
    auto r = parse_cuda_ipc_descriptor(d);
    ASSERT_FALSE(r.ok()) << "accepted \"" << d << "\"";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
    EXPECT_HAS(r.status().message(), "\"" + d + "\"");
    EXPECT_HAS(r.status().message(), "expected cuda_ipc:dev=");
  }
  // The largest shape that fits is accepted.
  auto edge = parse_cuda_ipc_descriptor(
      "cuda_ipc:dev=0000:3B:00.0:slots=1:slot_bytes=18446744073709551614:offset=1:handle=" + handle);
  EXPECT_TRUE(edge.ok()) << edge.status().ToString();
}

// Catches: the registry listing cuda_ipc in a build that cannot run it, or
// leaving it out of a CUDA build.
TEST(CudaIpcRegistry, RegisteredExactlyInCudaBuilds) {
  const std::vector<std::string> names = transport_names();
  const bool listed = std::find(names.begin(), names.end(), "cuda_ipc") != names.end();
  EXPECT_EQ(listed, cuda_built());
  auto t = make_transport("cuda_ipc");
  EXPECT_EQ(t.ok(), cuda_built()) << t.status().ToString();
  if (t.ok()) {
    EXPECT_TRUE((*t)->capabilities().direct);
    EXPECT_FALSE((*t)->capabilities().host_memory);
  }
}

// Catches: a host transport that claims direct mode, accepts expose_memory,
// or calls its host pool device memory.
TEST(DirectMode, HostTransportsRefuseToExposeMemory) {
  for (const char* name : {"shm", "tcp"}) {
    auto t = make_transport(name);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_FALSE((*t)->capabilities().direct) << name;
    std::vector<std::byte> memory(64);
    auto exposed = (*t)->expose_memory(memory.data(), memory.size(), MemoryKind::kHost, -1);
    ASSERT_FALSE(exposed.ok()) << name;
    EXPECT_EQ(exposed.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(exposed.status().message(),
              std::string("transport ") + name + " cannot expose existing memory (direct mode needs cuda_ipc)");
    PoolOptions o;
    o.slots = 2;
    o.slot_bytes = 4096;
    o.owner = "engine rank 0";
    auto target = (*t)->create_target(o);
    ASSERT_TRUE(target.ok()) << target.status().ToString();
    EXPECT_EQ((*target)->memory(), MemoryKind::kHost) << name;
    EXPECT_EQ((*target)->device(), -1) << name;
  }
}

}  // namespace
}  // namespace refit
