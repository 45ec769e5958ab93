// The pieces of the _refit extension module (module.cc assembles them).
// Each bind_* adds one concept's classes and functions to the module.
#pragma once

#include <pybind11/pybind11.h>

namespace refit::python {

void bind_options(pybind11::module_& module);      // RankOptions, EngineOptions
void bind_trainer(pybind11::module_& module);      // Trainer
void bind_engine(pybind11::module_& module);       // Engine
void bind_coordinator(pybind11::module_& module);  // Coordinator
void bind_log(pybind11::module_& module);          // _set_log_handler, _stop_logging (log_binding.cc)

}  // namespace refit::python
