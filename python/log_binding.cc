// refit's messages in Python (include/refit/log.h): _set_log_handler installs
// a Python callable as refit's log sink; refit/__init__.py installs one that
// routes every message into logging.getLogger("refit") at import.
//
// refit logs from any thread, often one Python never saw (the engine's I/O
// thread, the coordinator's), and sometimes while holding its own locks. A
// sink that took the GIL right there could deadlock against a Python thread
// that holds the GIL and waits for one of those locks. So the sink only
// queues the message; one delivery thread of this module takes the GIL and
// calls the handler, holding no refit lock. Messages keep their order.
//
// Shutdown: an atexit hook (registered by refit/__init__.py) calls
// _stop_logging, which restores refit's own stderr sink, lets the delivery
// thread hand over what is queued, and joins it, before the interpreter
// finalizes. After a fork the child starts its own delivery thread at its
// first message (the parent's does not exist there).
#include <pybind11/pybind11.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "bindings.h"
#include "refit/log.h"

namespace py = pybind11;

namespace refit::python {
namespace {

struct Message {
  LogLevel level;
  std::string source;
  std::string message;
};

// The queue and the thread that hands its messages to the Python handler.
class Delivery {
 public:
  // `handler` is shared with the sink, which needs no GIL to hand it to a
  // new delivery after a fork; its last owner drops it with the GIL held.
  explicit Delivery(std::shared_ptr<py::object> handler) : handler_(std::move(handler)), pid_(::getpid()) {
    thread_ = std::thread([this] { run(); });
  }
  Delivery(const Delivery&) = delete;
  Delivery& operator=(const Delivery&) = delete;

  // REQUIRES: the GIL is held; releases it while the thread finishes.
  ~Delivery() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    {
      py::gil_scoped_release release;
      thread_.join();
    }
    handler_.reset();  // dropped with the GIL held
  }

  pid_t pid() const { return pid_; }

  void push(LogLevel level, std::string_view source, std::string_view message) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(Message{level, std::string(source), std::string(message)});
    }
    cv_.notify_one();
  }

 private:
  // Delivers until stopped, then delivers what is left.
  void run() {
    for (;;) {
      std::deque<Message> batch;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, nothing left
        batch.swap(queue_);
      }
      py::gil_scoped_acquire gil;
      for (const Message& m : batch) call(m);
    }
  }

  // REQUIRES: the GIL is held. A handler that raises is reported as
  // unraisable (sys.unraisablehook) and the next message still goes to it.
  void call(const Message& m) {
    try {
      (*handler_)(std::string(log_level_name(m.level)), m.source, m.message);
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("refit log handler");
    }
  }

  std::shared_ptr<py::object> handler_;
  const pid_t pid_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Message> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

// The installed delivery; guarded by the GIL. In a forked child it belongs
// to the parent: it is left alone (its thread does not exist here).
Delivery* g_delivery = nullptr;
std::mutex g_delivery_mu;  // guards g_delivery for the sink (no GIL there)

void stop_logging() {
  set_log_sink(nullptr);  // no new message reaches the old delivery
  Delivery* old = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_delivery_mu);
    old = std::exchange(g_delivery, nullptr);
  }
  if (old != nullptr && old->pid() == ::getpid()) delete old;  // a parent's: leaked on purpose
}

void set_log_handler(py::object handler) {
  stop_logging();
  if (handler.is_none()) return;  // refit's own sink: stderr
  if (!PyCallable_Check(handler.ptr())) throw py::type_error("the log handler must be callable or None");
  auto shared = std::make_shared<py::object>(std::move(handler));
  auto* delivery = new Delivery(shared);
  {
    std::lock_guard<std::mutex> lock(g_delivery_mu);
    g_delivery = delivery;
  }
  // The sink never takes the GIL: it queues. It holds no Python reference of
  // its own (a weak one), so dropping it needs no GIL either.
  set_log_sink([weak = std::weak_ptr<py::object>(shared)](LogLevel level, std::string_view source,
                                                         std::string_view message) {
    std::lock_guard<std::mutex> lock(g_delivery_mu);
    if (g_delivery == nullptr) return;
    if (g_delivery->pid() != ::getpid()) {
      // A forked child: its own delivery thread (the parent's is leaked).
      std::shared_ptr<py::object> handler = weak.lock();
      if (handler == nullptr) return;
      g_delivery = new Delivery(std::move(handler));
    }
    g_delivery->push(level, source, message);
  });
}

LogLevel level_from_name(const std::string& name) {
  for (LogLevel l : {LogLevel::kInfo, LogLevel::kWarning, LogLevel::kError, LogLevel::kProgress}) {
    if (log_level_name(l) == name) return l;
  }
  throw py::value_error("unknown log level \"" + name + "\" (info, warning, error or progress)");
}

}  // namespace

void bind_log(py::module_& m) {
  m.def("_set_log_handler", &set_log_handler, py::arg("handler"),
        "Sends refit's messages to handler(level, source, message), called on a thread of refit's; "
        "None: refit writes them to stderr.");
  m.def("_stop_logging", &stop_logging, "Restores refit's stderr sink and stops the delivery thread (atexit).");
  m.def(
      "_log",
      [](const std::string& level, const std::string& source, const std::string& message, bool from_thread) {
        const LogLevel l = level_from_name(level);
        if (!from_thread) return log(l, source, message);
        py::gil_scoped_release release;  // as refit's own threads log: without the GIL
        std::thread([&] { log(l, source, message); }).join();
      },
      py::arg("level"), py::arg("source"), py::arg("message"), py::arg("from_thread") = false,
      "Logs one message through refit's sink (for tests).");
}

}  // namespace refit::python
