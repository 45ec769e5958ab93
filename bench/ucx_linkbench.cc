// ucx_linkbench: the raw throughput of one network path, measured the two
// ways bench/ucx_netns_bench.sh compares a refit against: a plain TCP socket
// stream, and writes through refit's ucx transport (the same submit + poll
// the trainer does, without the refit around it).
//
//   ucx_linkbench sink --listen HOST --port-file FILE
//       listens on HOST (any port, written to FILE), serves one source, exits.
//   ucx_linkbench source --connect HOST:PORT --mode socket|ucx --bytes N
//                        [--reps R] [--chunk C]
//       sends N bytes R times (ucx: in submits of C bytes, default 64 MiB,
//       each polled before the next, like the trainer's buckets), prints
//       {"mode", "bytes", "gbps": [per rep], "best_gbps", "median_gbps"}.
//
// Socket mode: each rep is N bytes written to the socket and a 1-byte ack
// once the sink has read them all. Ucx mode: the sink creates a ucx target
// of one slot of C bytes (UCX's own variables apply, e.g. UCX_TLS=tcp) and
// sends its descriptor; a rep ends when the last submit's poll is true
// (the bytes are in the sink's memory).
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "ucx_linkbench: %s\n", what.c_str());
  std::exit(1);
}

void write_all(int fd, const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w <= 0) die("write: " + std::string(std::strerror(errno)));
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}
void read_all(int fd, void* data, std::size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::read(fd, p, n);
    if (r <= 0) die("read: " + std::string(r == 0 ? "peer closed" : std::strerror(errno)));
    p += r;
    n -= static_cast<std::size_t>(r);
  }
}

struct Request {
  char mode[8] = {};  // "socket" or "ucx"
  std::uint64_t bytes = 0, reps = 0, chunk = 0;
};

std::string flag(int argc, char** argv, const std::string& name, const std::string& fallback = "") {
  for (int i = 2; i + 1 < argc; ++i) {
    if (argv[i] == name) return argv[i + 1];
  }
  if (fallback.empty()) die("missing " + name);
  return fallback;
}

int sink(int argc, char** argv) {
  const std::string host = flag(argc, argv, "--listen"), port_file = flag(argc, argv, "--port-file");
  int l = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) die("bad --listen " + host);
  if (::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(l, 1) != 0) die("cannot listen on " + host);
  socklen_t len = sizeof a;
  ::getsockname(l, reinterpret_cast<sockaddr*>(&a), &len);
  { std::ofstream(port_file + ".tmp") << ntohs(a.sin_port) << "\n"; }
  std::rename((port_file + ".tmp").c_str(), port_file.c_str());
  int c = ::accept(l, nullptr, nullptr);
  if (c < 0) die("accept");
  Request req;
  read_all(c, &req, sizeof req);
  if (std::string(req.mode) == "socket") {
    std::vector<char> buf(std::min<std::uint64_t>(req.bytes, 64 << 20));
    for (std::uint64_t r = 0; r < req.reps; ++r) {
      for (std::uint64_t got = 0; got < req.bytes;) {
        ssize_t n = ::read(c, buf.data(), std::min<std::uint64_t>(buf.size(), req.bytes - got));
        if (n <= 0) die("socket stream ended early");
        got += static_cast<std::uint64_t>(n);
      }
      write_all(c, "k", 1);
    }
    return 0;
  }
  auto transport = refit::make_transport("ucx");
  if (!transport.ok()) die(transport.status().ToString());
  refit::PoolOptions o;
  o.slots = 1;
  o.slot_bytes = req.chunk;
  o.owner = "ucx_linkbench sink";
  auto target = (*transport)->create_target(o);
  if (!target.ok()) die(target.status().ToString());
  const std::string d = (*target)->descriptor();
  const std::uint64_t n = d.size();
  write_all(c, &n, sizeof n);
  write_all(c, d.data(), d.size());
  char done = 0;
  read_all(c, &done, 1);  // the target lives (and progresses) until the source is done
  return 0;
}

int source(int argc, char** argv) {
  const std::string to = flag(argc, argv, "--connect"), mode = flag(argc, argv, "--mode");
  Request req;
  std::snprintf(req.mode, sizeof req.mode, "%s", mode.c_str());
  req.bytes = std::strtoull(flag(argc, argv, "--bytes").c_str(), nullptr, 0);
  req.reps = std::strtoull(flag(argc, argv, "--reps", "5").c_str(), nullptr, 0);
  req.chunk = std::min<std::uint64_t>(req.bytes, std::strtoull(flag(argc, argv, "--chunk", "67108864").c_str(), nullptr, 0));
  if (req.bytes == 0 || req.reps == 0 || (mode != "socket" && mode != "ucx")) die("bad --bytes, --reps or --mode");
  const auto colon = to.rfind(':');
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (colon == std::string::npos || ::getaddrinfo(to.substr(0, colon).c_str(), to.substr(colon + 1).c_str(), &hints, &res) != 0) {
    die("bad --connect " + to);
  }
  int c = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(c, res->ai_addr, res->ai_addrlen) != 0) die("cannot connect to " + to);
  ::freeaddrinfo(res);
  write_all(c, &req, sizeof req);
  std::vector<std::byte> src(mode == "socket" ? std::min<std::uint64_t>(req.bytes, 64 << 20) : req.chunk);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 131);
  std::vector<double> gbps;
  if (mode == "socket") {
    for (std::uint64_t r = 0; r < req.reps; ++r) {
      const auto t0 = Clock::now();
      for (std::uint64_t sent = 0; sent < req.bytes;) {
        const std::uint64_t n = std::min<std::uint64_t>(src.size(), req.bytes - sent);
        write_all(c, src.data(), n);
        sent += n;
      }
      char ack;
      read_all(c, &ack, 1);
      gbps.push_back(static_cast<double>(req.bytes) / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9);
    }
  } else {
    std::uint64_t n = 0;
    read_all(c, &n, sizeof n);
    std::string d(n, '\0');
    read_all(c, d.data(), n);
    auto transport = refit::make_transport("ucx");
    if (!transport.ok()) die(transport.status().ToString());
    auto remote = (*transport)->open_target(d, nullptr);
    if (!remote.ok()) die(remote.status().ToString());
    for (std::uint64_t r = 0; r < req.reps; ++r) {
      const auto t0 = Clock::now();
      for (std::uint64_t sent = 0; sent < req.bytes;) {
        const std::uint64_t len = std::min<std::uint64_t>(req.chunk, req.bytes - sent);
        auto ticket = (*remote)->submit(0, 0, std::span<const std::byte>(src.data(), len), r + 1,
                                        refit::Deadline::AfterSeconds(600));
        if (!ticket.ok()) die(ticket.status().ToString());
        for (;;) {
          auto done = (*remote)->poll(*ticket);
          if (!done.ok()) die(done.status().ToString());
          if (*done) break;
        }
        sent += len;
      }
      gbps.push_back(static_cast<double>(req.bytes) / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9);
    }
    remote->reset();
    write_all(c, "d", 1);
  }
  std::vector<double> sorted = gbps;
  std::sort(sorted.begin(), sorted.end());
  std::printf("{\"mode\": \"%s\", \"bytes\": %llu, \"gbps\": [", mode.c_str(),
              static_cast<unsigned long long>(req.bytes));
  for (std::size_t i = 0; i < gbps.size(); ++i) std::printf("%s%.4f", i ? ", " : "", gbps[i]);
  std::printf("], \"best_gbps\": %.4f, \"median_gbps\": %.4f}\n", sorted.back(), sorted[sorted.size() / 2]);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string role = argc > 1 ? argv[1] : "";
  if (role == "sink") return sink(argc, argv);
  if (role == "source") return source(argc, argv);
  std::fprintf(stderr, "usage: ucx_linkbench sink --listen HOST --port-file FILE\n"
                       "       ucx_linkbench source --connect HOST:PORT --mode socket|ucx --bytes N [--reps R] [--chunk C]\n");
  return 2;
}
