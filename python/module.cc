// The _refit extension module: refit's trainer and engine roles, the
// coordinator, errors and DLPack views, for the pure-Python package `refit`
// (python/refit/__init__.py), which is the documented API.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "dlpack_interop.h"
#include "errors.h"
#include "refit/checkpoint.h"
#include "refit/device_memory.h"
#include "refit/dtype.h"
#include "refit/fault_hook.h"
#include "refit/quantize.h"
#include "refit/coordinator.h"
#include "refit/roles.h"
#include "refit/transports.h"

namespace py = pybind11;

namespace refit::python {

// The options structs, whose initial values are the defaults of the Python
// package (None in its signatures keeps them), as of the `refit` command.
void bind_options(py::module_& m) {
  py::class_<RankOptions>(m, "RankOptions", "Settings of one trainer or engine rank (src/runtime/roles.h).")
      .def(py::init<>())
      .def_readwrite("coordinator", &RankOptions::coordinator)
      .def_readwrite("secret", &RankOptions::secret)
      .def_readwrite("rank", &RankOptions::rank)
      .def_readwrite("trainer_ranks", &RankOptions::trainer_ranks)
      .def_readwrite("engine_ranks", &RankOptions::engine_ranks)
      .def_readwrite("bucket_size", &RankOptions::bucket_size)
      .def_readwrite("transport", &RankOptions::transport)
      .def_readwrite("device", &RankOptions::device)
      .def_readwrite("mode", &RankOptions::mode)
      .def_readwrite("setup_timeout_s", &RankOptions::setup_timeout_s)
      .def_readwrite("refit_timeout_s", &RankOptions::refit_timeout_s)
      .def_readwrite("bucket_timeout_s", &RankOptions::bucket_timeout_s)
      .def_readwrite("heartbeat_interval_s", &RankOptions::heartbeat_interval_s)
      .def_readwrite("heartbeat_timeout_s", &RankOptions::heartbeat_timeout_s)
      .def_readwrite("gpu", &RankOptions::gpu)
      .def_readwrite("layers", &RankOptions::layers)
      .def_readwrite("engine_experts", &RankOptions::engine_experts)
      .def_readwrite("quantize", &RankOptions::quantize)
      .def_readwrite("model", &RankOptions::model)
      // Fault injection for tests, as the CLI's --debug-fault ("sent:2:kill").
      .def_property(
          "debug_fault",
          [](const RankOptions& o) {
            return o.debug_fault.version == 0 ? std::string() : fault_hook_text(o.debug_fault);
          },
          [](RankOptions& o, const std::string& text) { o.debug_fault = value_or_throw(parse_fault_hook(text)); });
  py::class_<EngineOptions, RankOptions>(m, "EngineOptions", "Settings of one engine rank (src/runtime/roles.h).")
      .def(py::init<>())
      .def_readwrite("pool_slots", &EngineOptions::pool_slots)
      .def_readwrite("memory_limit", &EngineOptions::memory_limit)
      .def_readwrite("listen_host", &EngineOptions::listen_host)
      .def_readwrite("poison_recycled", &EngineOptions::poison_recycled)
      .def_readwrite("supported_dtypes", &EngineOptions::supported_dtypes)
      .def_readwrite("base_gpu_id", &EngineOptions::base_gpu_id)
      .def_readwrite("shadow", &EngineOptions::shadow)
      .def_readwrite("engine", &EngineOptions::engine);
  // The secret is not bound: Coordinator(secret=...) passes it on.
  py::class_<CoordinatorOptions>(m, "CoordinatorOptions", "Settings of a coordinator (src/control/coordinator.h).")
      .def(py::init<>())
      .def_readwrite("listen", &CoordinatorOptions::listen)
      .def_readwrite("trainer_ranks", &CoordinatorOptions::trainer_ranks)
      .def_readwrite("engine_ranks", &CoordinatorOptions::engine_ranks)
      .def_readwrite("engines", &CoordinatorOptions::engines)
      .def_readwrite("relay_fanout", &CoordinatorOptions::relay_fanout)
      .def_readwrite("min_engines", &CoordinatorOptions::min_engines)
      .def_readwrite("max_engines", &CoordinatorOptions::max_engines)
      .def_readwrite("refits", &CoordinatorOptions::refits)
      .def_readwrite("seed", &CoordinatorOptions::seed)
      .def_readwrite("setup_timeout_s", &CoordinatorOptions::setup_timeout_s)
      .def_readwrite("refit_timeout_s", &CoordinatorOptions::refit_timeout_s)
      .def_readwrite("heartbeat_interval_s", &CoordinatorOptions::heartbeat_interval_s)
      .def_readwrite("heartbeat_timeout_s", &CoordinatorOptions::heartbeat_timeout_s)
      .def_readwrite("handshake_timeout_s", &CoordinatorOptions::handshake_timeout_s)
      .def_readwrite("trainer_replace_timeout_s", &CoordinatorOptions::trainer_replace_timeout_s)
      .def_readwrite("release_between_refits", &CoordinatorOptions::release_between_refits)
      .def_readwrite("progress", &CoordinatorOptions::progress)
      .def_readwrite("log_joins", &CoordinatorOptions::log_joins);
}

}  // namespace refit::python

PYBIND11_MODULE(_refit, m) {
  using namespace refit;
  using namespace refit::python;
  m.doc() = "refit's C++ core; use the `refit` package.";
  register_errors(m);
  register_tensor_view(m);
  bind_options(m);
  bind_trainer(m);
  bind_engine(m);
  bind_coordinator(m);
  bind_log(m);

  m.def("cuda_built", &cuda_built, "True when refit was compiled with CUDA.");
  m.def(
      "transport_availability",
      [] {
        std::vector<std::tuple<std::string, bool, std::string>> out;
        for (const TransportAvailability& t : transport_availability()) out.emplace_back(t.name, t.available, t.reason);
        return out;
      },
      "Every transport refit knows: (name, available here, why not), for refit.transports().");
  m.def(
      "dtypes",
      [] {
        std::vector<std::string> names;
        for (int d = 0; d < kDTypeCount; ++d) names.emplace_back(dtype_name(static_cast<DType>(d)));
        return names;
      },
      "The dtypes refit moves (torch names).");
  m.def(
      "tensor_spec",
      [](py::handle tensor, const std::string& name) {
        ImportedTensor t = value_or_throw(ImportedTensor::Import(tensor, name, /*writable=*/false));
        return py::make_tuple(std::string(dtype_name(t.spec().dtype)), py::tuple(py::cast(t.spec().shape)),
                              t.device_name());
      },
      py::arg("tensor"), py::arg("name") = "tensor",
      "How refit reads a tensor: (dtype, shape, device); raises what registering it would.");
  m.def(
      "shard_rule",
      [](const std::string& name) {
        const auto& rules = default_shard_rules();
        return std::string(shard_rule_name(match_shard_rule(std::span(rules), name).rule));
      },
      py::arg("name"),
      "The TP shard rule of a tensor name under refit's default table (column, row, vocab or replicated).");
  m.def(
      "quantized_specs",
      [](const std::vector<std::tuple<std::string, std::string, std::vector<std::int64_t>>>& specs,
         const std::string& quantize) {
        Model model;
        for (const auto& [name, dtype, shape] : specs) {
          model.weights.push_back(Weight{TensorSpec{name, value_or_throw(parse_dtype(dtype)), shape}});
        }
        // One rank: the specs are the engine rank's own shards, whose codes and scales are the
        // shards' (a trainer refuses splits that would make them differ).
        const QuantizedModel q = value_or_throw(quantize_model(model, value_or_throw(parse_quantize(quantize)), 1));
        std::vector<std::tuple<std::string, std::string, std::vector<std::int64_t>>> out;
        for (const Weight& w : q.engine.weights) out.emplace_back(w.spec.name, dtype_name(w.spec.dtype), w.spec.shape);
        return out;
      },
      py::arg("specs"), py::arg("quantize"),
      "An engine rank's (name, dtype, shape) specs as its trainers' bf16/fp32 weights, as the FP8 engine holds "
      "them under `quantize` (refit/quantize.h): codes and scales in place of each selected weight.");
}
