// _refit.Engine: one engine rank hosted by a Python process (TargetEngine).
//
// params: this rank's shards, in the model's order, either as
//   (name, dtype, shape) specs   loader mode: next(load_fn) hands each dtype
//                                group of every aligned batch to load_fn
//   (name, tensor) pairs         staged: next() copies each tensor into the
//                                caller's tensor (or next(load_fn) as above);
//                                direct: their values seed the weight arena
// Direct mode (mode="direct"): the weights live in a refit-owned WeightArena
// that the trainers write into; weights() hands out views of it (the arena
// lives as long as any tensor made from a view).
// Shadow weights (options.shadow, staged, specs only): a ShadowEngine holds
// two arenas; each refit lands in the one not served, and after the commit
// on_flip(version) runs with weights() already the new arena's views and
// weight_version already the new version (the flip as the server sees it).
//
// Staging views passed to load_fn are valid only during the call (they point
// into a receive slot that is recycled afterwards; after the call they are
// marked expired). On a CUDA device the binding waits for the device after
// load_fn returns, so copies load_fn queued have finished before the slot is
// reused, and before each refit, so kernels still reading the weights finish
// before trainers overwrite them.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "refit/target_engine.h"
#include "bindings.h"
#include "refit/device_memory.h"
#include "dlpack_interop.h"
#include "errors.h"
#include "refit/device_memory.h"
#include "refit/dtype.h"
#include "refit/engine_rank.h"
#include "refit/shadow_engine.h"

namespace py = pybind11;

namespace refit::python {
namespace {

class PyEngine {
 public:
  PyEngine(EngineOptions options, const py::list& params, py::object on_commit, py::object on_flip)
      : name_("engine rank " + std::to_string(options.rank)),
        direct_(options.mode == "direct"),
        on_commit_(std::move(on_commit)),
        on_flip_(std::move(on_flip)) {
    read_params(params);
    check_shadow(options);
    place(options);
    engine_ = std::make_unique<TargetEngine>(options.rank, stream_, memory_, device_);
    EngineBinding binding;
    binding.stream = stream_;
    binding.engine = engine_.get();
    binding.memory = memory_;
    binding.device = device_;
    if (options.shadow) {
      // Direct mode exposes both arenas as one region; staged mode keeps two, so that a job that releases
      // memory between refits frees the one not served (ShadowEngine::release_idle).
      shadow_ = value_or_throw(ShadowEngine::Create(options.rank, stream_, memory_, device_,
                                                    direct_ ? ShadowArenas::kOneRegion : ShadowArenas::kSeparate));
      binding.engine = shadow_.get();
      binding.shadow = true;
      binding.weight_memory_bytes = shadow_->weight_memory_bytes();
      if (direct_) {  // the trainers write the arena not served (each start names it)
        binding.arena = shadow_->region();
        binding.arena_bytes = shadow_->region_bytes();
      }
    } else if (direct_) {
      arena_ = value_or_throw(WeightArena::Allocate(stream_, memory_, device_));
      seed_arena();
      binding.arena = arena_->data();
      binding.arena_bytes = arena_->bytes();
    } else if (!tensors_.empty()) {
      std::vector<std::byte*> targets;
      for (const ImportedTensor& t : tensors_) targets.push_back(t.data());
      check(engine_->set_targets(std::move(targets)).WithContext(name_));
      // Host tensors can be read back: sent to an engine joining the job below this one.
      if (memory_ == MemoryKind::kHost) binding.read_committed = read_tensors();
    }
    StatusOr<std::unique_ptr<EngineRank>> rank = Internal("not joined");
    {
      py::gil_scoped_release release;
      rank = EngineRank::Join(options, std::move(binding));
    }
    rank_ = value_or_throw(std::move(rank));
  }

  ~PyEngine() { close(); }

  // The caller's host tensors as they hold the committed version
  // (EngineBinding::read_committed), by stream index.
  ReadCommitted read_tensors() {
    return [this](std::span<const CommittedRead> reads) -> Status {
      for (const CommittedRead& r : reads) {
        if (r.tensor >= tensors_.size() || r.offset + r.out.size() > stream_[r.tensor].nbytes()) {
          return Internal(name_ + ": no committed bytes [" + std::to_string(r.offset) + ", +" +
                          std::to_string(r.out.size()) + ") of tensor " + std::to_string(r.tensor));
        }
        std::memcpy(r.out.data(), tensors_[r.tensor].data() + r.offset, r.out.size());
      }
      return Status::Ok();
    };
  }

  std::optional<std::uint64_t> next(py::object load_fn) {
    EngineRank& rank = joined();
    if (shut_down_) return std::nullopt;  // the job ended: nothing more will come
    if (direct_ && !load_fn.is_none()) {
      throw_status(InvalidArgument(name_ + ": direct mode takes no load_fn (the trainers write the weights in place)"));
    }
    if (shadow_ && !load_fn.is_none()) {
      throw_status(InvalidArgument(name_ + ": shadow weights take no load_fn (refit copies into the arena not "
                                           "served; adopt weights() in on_flip)"));
    }
    if (!direct_ && !shadow_ && load_fn.is_none() && tensors_.empty()) {
      throw_status(InvalidArgument(name_ + ": next() needs a load_fn: this engine registered (name, dtype, shape) "
                                           "specs, no tensors to copy into"));
    }
    std::optional<py::error_already_set> raised;  // load_fn's exception
    if (!load_fn.is_none()) {
      engine_->set_loader([&](DType dtype, const std::vector<refit::TensorView>& views) -> Status {
        py::gil_scoped_acquire gil;
        auto valid = std::make_shared<std::atomic<bool>>(true);
        py::list items;
        for (const refit::TensorView& v : views) {
          ViewSource source{*v.spec, v.data, v.memory, v.device, nullptr, valid};
          items.append(py::make_tuple(v.spec->name, py::cast(ExportedView(std::move(source)))));
        }
        Status status;
        try {
          load_fn(items);
        } catch (py::error_already_set& e) {
          status = status_from_python(e, StatusCode::kAborted, "load_fn raised")
                       .WithContext("applying a " + std::string(dtype_name(dtype)) + " group");
          raised.emplace(std::move(e));
        }
        valid->store(false);
        if (memory_ == MemoryKind::kCuda) {  // copies load_fn queued finish before the slot is reused
          py::gil_scoped_release release;
          Status synced = synchronize_device(device_).WithContext("after load_fn");
          if (status.ok()) status = synced;
        }
        return status;
      });
    } else {
      engine_->set_loader(nullptr);
    }
    StatusOr<std::optional<std::uint64_t>> version = Internal("not run");
    {
      py::gil_scoped_release release;
      Status ready;
      if (memory_ == MemoryKind::kCuda) ready = synchronize_device(device_).WithContext(name_ + ", before a refit");
      version = ready.ok() ? rank.next() : StatusOr<std::optional<std::uint64_t>>(ready);
    }
    engine_->set_loader(nullptr);
    if (!version.ok()) {
      if (raised && !raised->matches(PyExc_Exception)) {  // KeyboardInterrupt, SystemExit: as they were
        raised->restore();
        throw py::error_already_set();
      }
      throw_status(version.status(), raised ? raised->value() : py::none());
    }
    if (!version->has_value()) {
      shut_down_ = true;
      return std::nullopt;
    }
    if (shadow_) {  // the flip, as the server sees it: weights() and weight_version change here
      served_version_ = **version;
      if (!on_flip_.is_none()) on_flip_(**version);
    }
    if (!on_commit_.is_none()) {
      // DESIGN.md rule 9: the caller's cache flush, once per committed refit,
      // after its last batch (a failed refit commits nothing and calls none).
      ++cache_flushes_;
      on_commit_(**version);
    }
    return *version;
  }

  // Staged mode: copy mode from now on, into `pairs` [(name, tensor)] that
  // cover every stream tensor once (same dtype and bytes, on this device);
  // replaces the tensors registered so far (refit.adapters' LoaderCapture).
  void set_targets(const py::list& pairs) {
    joined();
    if (direct_ || shadow_) {
      throw_status(FailedPrecondition(name_ + ": set_targets() is for staged mode without shadow weights (refit "
                                              "owns the arenas of direct mode and of shadow weights)"));
    }
    std::map<std::string, std::size_t> index;
    for (std::size_t i = 0; i < stream_.size(); ++i) index.emplace(stream_[i].name, i);
    std::vector<std::optional<ImportedTensor>> placed(stream_.size());
    for (py::handle entry : pairs) {
      auto item = entry.cast<py::tuple>();
      if (item.size() != 2) throw_status(InvalidArgument(name_ + ": set_targets takes (name, tensor) pairs"));
      const auto name = item[0].cast<std::string>();
      const auto at = index.find(name);
      if (at == index.end()) throw_status(InvalidArgument(name_ + ": set_targets: '" + name + "' is not a tensor "
                                                                   "of this rank's stream"));
      if (placed[at->second]) throw_status(InvalidArgument(name_ + ": set_targets: '" + name + "' given twice"));
      ImportedTensor t = value_or_throw(ImportedTensor::Import(item[1], name, /*writable=*/true));
      const TensorSpec& want = stream_[at->second];
      if (t.spec().dtype != want.dtype || t.spec().nbytes() != want.nbytes()) {
        throw_status(InvalidArgument(name_ + ": set_targets: '" + name + "' is " +
                                     std::string(dtype_name(t.spec().dtype)) + " of " +
                                     std::to_string(t.spec().nbytes()) + " bytes, the stream's is " +
                                     std::string(dtype_name(want.dtype)) + " of " + std::to_string(want.nbytes())));
      }
      if (t.memory() != memory_ || (memory_ == MemoryKind::kCuda && t.device() != device_)) {
        throw_status(InvalidArgument(name_ + ": set_targets: '" + name + "' is on " + t.device_name() +
                                     ", this engine rank's weights on " + device()));
      }
      placed[at->second].emplace(std::move(t));
    }
    std::vector<ImportedTensor> tensors;
    std::vector<std::byte*> targets;
    for (std::size_t i = 0; i < placed.size(); ++i) {
      if (!placed[i]) throw_status(InvalidArgument(name_ + ": set_targets: no target for '" + stream_[i].name + "'"));
      targets.push_back(placed[i]->data());
      tensors.push_back(std::move(*placed[i]));
    }
    check(engine_->set_targets(std::move(targets)).WithContext(name_));
    tensors_ = std::move(tensors);
  }

  // Direct mode: {name: view of the weight in the arena}.
  py::dict weights() {
    joined();
    if (!direct_ && !shadow_) {
      throw_status(FailedPrecondition(name_ + ": weights() exists in direct mode and with shadow weights only "
                                              "(staged mode loads into the caller's own tensors)"));
    }
    const std::shared_ptr<WeightArena>& arena = shadow_ ? shadow_->served() : arena_;
    py::dict out;
    for (std::size_t i = 0; i < stream_.size(); ++i) {
      ViewSource source{stream_[i], arena->tensor(i), memory_, device_, arena, nullptr};
      out[py::str(stream_[i].name)] = py::cast(ExportedView(std::move(source)));
    }
    return out;
  }

  void close() {
    if (rank_) {
      py::gil_scoped_release release;
      rank_.reset();
    }
    tensors_.clear();
  }

  std::uint64_t weight_version() const {
    if (shadow_) return served_version_;
    return engine_ ? engine_->weight_version() : 0;
  }
  bool weights_complete() const {
    return shadow_ ? shadow_->weights_complete() : engine_ && engine_->weights_complete();
  }
  std::uint64_t posts() const { return shadow_ ? shadow_->posts() : engine_ ? engine_->posts() : 0; }
  bool shadow() const { return shadow_ != nullptr; }
  py::tuple last_only() const { return py::tuple(py::cast(rank_ ? rank_->last_only() : std::vector<std::string>())); }
  std::uint64_t weight_memory_bytes() const { return shadow_ ? shadow_->weight_memory_bytes() : 0; }
  std::uint64_t cache_flushes() const { return cache_flushes_; }
  std::string device() const { return memory_ == MemoryKind::kCuda ? "cuda:" + std::to_string(device_) : "cpu"; }
  py::list specs() const {
    py::list out;
    for (const TensorSpec& s : stream_) {
      out.append(py::make_tuple(s.name, std::string(dtype_name(s.dtype)), py::tuple(py::cast(s.shape))));
    }
    return out;
  }

 private:
  EngineRank& joined() {
    if (!rank_) throw_status(FailedPrecondition(name_ + " is closed"));
    return *rank_;
  }

  // Shadow weights: (name, dtype, shape) specs (refit holds both arenas, in
  // direct mode exposed as one region); on_flip only with them.
  void check_shadow(const EngineOptions& options) const {
    if (!options.shadow) {
      if (!on_flip_.is_none()) {
        throw_status(InvalidArgument(name_ + ": on_flip needs shadow=True (without shadow weights the weights "
                                             "change during the refit; on_commit runs after it)"));
      }
      return;
    }
    if (!tensors_.empty()) {
      throw_status(InvalidArgument(name_ + ": shadow=True takes (name, dtype, shape) specs, not tensors: refit "
                                           "holds both arenas (weights() after each flip)"));
    }
  }

  // (name, dtype, shape) specs or (name, tensor) pairs, never a mix.
  void read_params(const py::list& params) {
    if (params.empty()) throw_status(InvalidArgument(name_ + ": no params (this rank's tensors) to register"));
    std::set<std::string> names;
    std::optional<bool> tensors;
    for (py::handle entry : params) {
      auto item = entry.cast<py::tuple>();
      if (item.size() != 2 && item.size() != 3) {
        throw_status(InvalidArgument(name_ + ": each param is (name, dtype, shape) or (name, tensor)"));
      }
      const auto name = item[0].cast<std::string>();
      if (!names.insert(name).second) throw_status(InvalidArgument(name_ + ": param '" + name + "' registered twice"));
      const bool is_tensor = item.size() == 2;
      if (tensors && *tensors != is_tensor) {
        throw_status(InvalidArgument(name_ + ": params mix tensors and (name, dtype, shape) specs (param '" + name +
                                     "'): give all of one kind"));
      }
      tensors = is_tensor;
      if (is_tensor) {
        ImportedTensor t = value_or_throw(ImportedTensor::Import(item[1], name, /*writable=*/!direct_));
        if (!tensors_.empty() && (t.memory() != tensors_.front().memory() || t.device() != tensors_.front().device())) {
          throw_status(InvalidArgument(name_ + ": param '" + name + "' is on " + t.device_name() + " but param '" +
                                       tensors_.front().spec().name + "' is on " + tensors_.front().device_name() +
                                       " (an engine rank's weights live on one device)"));
        }
        stream_.push_back(t.spec());
        tensors_.push_back(std::move(t));
      } else {
        TensorSpec spec;
        spec.name = name;
        auto dtype = parse_dtype(item[1].cast<std::string>());
        if (!dtype.ok()) throw_status(dtype.status().WithContext(name_ + ": param '" + name + "'"));
        spec.dtype = *dtype;
        for (py::handle d : item[2]) spec.shape.push_back(d.cast<std::int64_t>());
        check(validate_spec(spec).WithContext(name_));
        stream_.push_back(std::move(spec));
      }
    }
  }

  // Where the weights and the staging live: the tensors' device, or
  // options.device ("cuda": local device options.gpu, or base_gpu_id + rank
  // inside CUDA_VISIBLE_DEVICES when gpu < 0, DESIGN.md rule 7).
  void place(EngineOptions& options) {
    if (!tensors_.empty()) {
      memory_ = tensors_.front().memory();
      device_ = tensors_.front().device();
      const std::string want = memory_ == MemoryKind::kCuda ? "cuda" : "cpu";
      if (options.device != want) {
        throw_status(InvalidArgument(name_ + ": device='" + options.device + "' but its tensors are on " +
                                     tensors_.front().device_name()));
      }
      return;
    }
    if (options.device != "cuda") return;  // validate_rank_settings names a bad value at Join
    memory_ = MemoryKind::kCuda;
    if (options.gpu >= 0) {
      device_ = options.gpu;
    } else {
      const int visible = value_or_throw(cuda_device_count());
      device_ = value_or_throw(engine_local_device(options.base_gpu_id, options.rank, visible));
    }
  }

  // Direct mode with tensors: their current values become the arena's.
  void seed_arena() {
    if (tensors_.empty()) return;
    Status status;
    {
      py::gil_scoped_release release;
      status = copy_initial_values();
    }
    check(status.WithContext(name_));
  }

  Status copy_initial_values() {
    if (tensors_.front().memory() == MemoryKind::kCuda) {
      RETURN_IF_ERROR(synchronize_device(tensors_.front().device()));  // the caller's writes have landed
    }
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      const std::uint64_t bytes = stream_[i].nbytes();
      if (bytes == 0) continue;
      if (memory_ == MemoryKind::kCuda) {
        RETURN_IF_ERROR(copy_device_to_device(arena_->tensor(i), tensors_[i].data(), bytes)
                            .WithContext("copying the initial value of '" + stream_[i].name + "'"));
      } else {
        std::memcpy(arena_->tensor(i), tensors_[i].data(), bytes);
      }
    }
    return Status::Ok();
  }

  std::string name_;
  bool direct_;
  bool shut_down_ = false;  // next() returned None once
  py::object on_commit_;    // on_commit(version), or None
  py::object on_flip_;      // on_flip(version) with shadow weights, or None
  std::uint64_t served_version_ = 0;  // with shadow weights: the version weights() serves
  std::uint64_t cache_flushes_ = 0;  // on_commit calls made
  std::vector<TensorSpec> stream_;
  std::vector<ImportedTensor> tensors_;
  MemoryKind memory_ = MemoryKind::kHost;
  int device_ = -1;
  std::shared_ptr<WeightArena> arena_;
  std::unique_ptr<TargetEngine> engine_;  // declared before rank_: outlives it
  std::unique_ptr<ShadowEngine> shadow_;  // with shadow weights, the engine rank_ drives
  std::unique_ptr<EngineRank> rank_;
};

}  // namespace

void bind_engine(py::module_& m) {
  py::class_<PyEngine>(m, "Engine")
      .def(py::init<EngineOptions, const py::list&, py::object, py::object>(), py::arg("options"),
           py::arg("params"), py::arg("on_commit") = py::none(), py::arg("on_flip") = py::none())
      .def("next", &PyEngine::next, py::arg("load_fn") = py::none())
      .def("set_targets", &PyEngine::set_targets, py::arg("pairs"))
      .def("weights", &PyEngine::weights)
      .def("close", &PyEngine::close)
      .def_property_readonly("weight_version", &PyEngine::weight_version)
      .def_property_readonly("weights_complete", &PyEngine::weights_complete)
      .def_property_readonly("posts", &PyEngine::posts)
      .def_property_readonly("cache_flushes", &PyEngine::cache_flushes)
      .def_property_readonly("shadow", &PyEngine::shadow)
      .def_property_readonly("last_only", &PyEngine::last_only)
      .def_property_readonly("weight_memory_bytes", &PyEngine::weight_memory_bytes)
      .def_property_readonly("device", &PyEngine::device)
      .def_property_readonly("specs", &PyEngine::specs);
}

}  // namespace refit::python
