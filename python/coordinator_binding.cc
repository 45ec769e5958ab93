// _refit.Coordinator: run_coordinator (refit/coordinator.h) on a
// background thread of the calling process.
//
// The constructor returns once the socket listens (port known) or raises the
// setup error. wait() blocks, without the GIL, until the job ends and returns
// its JSON report as a dict (with "error" when it failed). The thread never
// touches Python. Destroying the object waits for the job to end (it ends
// when every rank left, or at the setup deadline when ranks never came).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "bindings.h"
#include "refit/secret.h"
#include "refit/coordinator.h"
#include "errors.h"

namespace py = pybind11;

namespace refit::python {
namespace {

class PyCoordinator {
 public:
  PyCoordinator(const std::string& listen, int trainer_ranks, int engine_ranks, int refits, std::uint64_t seed,
                double setup_timeout_s, double refit_timeout_s, const std::string& secret, bool progress,
                bool log_joins)
      : state_(std::make_shared<State>()) {
    CoordinatorOptions options;
    options.listen = listen;
    options.trainer_ranks = trainer_ranks;
    options.engine_ranks = engine_ranks;
    options.refits = refits;
    options.seed = seed;
    options.setup_timeout_s = setup_timeout_s;
    options.refit_timeout_s = refit_timeout_s;
    options.progress = progress;
    options.log_joins = log_joins;
    if (!secret.empty()) options.secret = value_or_throw(Secret::FromBytes(secret, "Coordinator(secret=...)"));
    host_ = listen.substr(0, listen.rfind(':'));

    thread_ = std::thread([state = state_, options] {
      JobReport report = run_coordinator(options, [&state](int port) {
        std::lock_guard<std::mutex> lock(state->mu);
        state->port = port;
        state->cv.notify_all();
      });
      std::lock_guard<std::mutex> lock(state->mu);
      state->report = std::move(report);
      state->done = true;
      state->cv.notify_all();
    });
    {
      py::gil_scoped_release release;
      std::unique_lock<std::mutex> lock(state_->mu);
      state_->cv.wait(lock, [&] { return state_->port >= 0 || state_->done; });
    }
    if (state_->port < 0) {  // ended before listening: a setup error
      join();
      Status why = state_->report.status;
      check(why.ok() ? Aborted("the coordinator ended before listening") : why);
    }
  }

  ~PyCoordinator() { join(); }

  int port() const { return state_->port; }
  std::string address() const { return host_ + ":" + std::to_string(state_->port); }

  bool done() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->done;
  }

  // The report once the job ended; DeadlineExceededError after `timeout_s`
  // (< 0: no limit).
  py::object wait(double timeout_s) {
    bool ended = false;
    {
      py::gil_scoped_release release;
      std::unique_lock<std::mutex> lock(state_->mu);
      auto done = [&] { return state_->done; };
      if (timeout_s < 0) {
        state_->cv.wait(lock, done);
        ended = true;
      } else {
        ended = state_->cv.wait_for(lock, std::chrono::duration<double>(timeout_s), done);
      }
    }
    if (!ended) {
      throw_status(DeadlineExceeded("the coordinator at " + address() + " is still running after " +
                                    std::to_string(timeout_s) + " s"));
    }
    join();
    return py::module_::import("json").attr("loads")(state_->report.json);
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    int port = -1;
    bool done = false;
    JobReport report;
  };

  void join() {
    if (!thread_.joinable()) return;
    py::gil_scoped_release release;
    thread_.join();
  }

  std::shared_ptr<State> state_;
  std::string host_;
  std::thread thread_;
};

}  // namespace

void bind_coordinator(py::module_& m) {
  py::class_<PyCoordinator>(m, "Coordinator")
      .def(py::init<const std::string&, int, int, int, std::uint64_t, double, double, const std::string&, bool, bool>(),
           py::arg("listen"), py::arg("trainer_ranks"), py::arg("engine_ranks"), py::arg("refits"), py::arg("seed"),
           py::arg("setup_timeout_s"), py::arg("refit_timeout_s"), py::arg("secret"), py::arg("progress"),
           py::arg("log_joins"))
      .def_property_readonly("port", &PyCoordinator::port)
      .def_property_readonly("address", &PyCoordinator::address)
      .def_property_readonly("done", &PyCoordinator::done)
      .def("wait", &PyCoordinator::wait, py::arg("timeout_s") = -1.0);
}

}  // namespace refit::python
