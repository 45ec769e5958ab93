// _refit.Trainer: a trainer rank whose weights are the caller's tensors.
//
// The tensors are registered once: their pointers are captured and the
// producers' DLPack handles held, which keeps their memory alive. Each
// refit() sends what the memory holds at that moment, so the caller updates
// the tensors in place (an optimizer step) and never replaces their storage.
// Tensors on a CUDA device: refit() first waits for every stream of that
// device, so the caller's queued updates have landed before a byte is read.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "bindings.h"
#include "refit/device_memory.h"
#include "dlpack_interop.h"
#include "errors.h"
#include "refit/checkpoint.h"
#include "refit/layout.h"
#include "refit/model.h"
#include "refit/weight_source.h"
#include "refit/trainer_rank.h"

namespace py = pybind11;

namespace refit::python {
namespace {

// A rule that splits a dimension the tensor lacks is refused here, naming the
// tensor (the same check as model_from_checkpoint).
Status check_rule(const TensorSpec& spec, ShardRule rule) {
  const std::size_t need = rule == ShardRule::kRow ? 2 : (rule == ShardRule::kReplicated ? 0 : 1);
  if (spec.shape.size() < need) {
    const std::string type = spec.ToString().substr(spec.name.size() + 1);  // "float32[6]"
    return InvalidArgument("tensor '" + spec.name + "' (" + type + ") cannot be split by rule '" +
                           std::string(shard_rule_name(rule)) + "' (it needs at least " + std::to_string(need) +
                           " dimensions)");
  }
  return Status::Ok();
}

// The report as a dict, which the package turns into a refit.RefitReport.
py::dict report_dict(const TrainerRefitReport& r) {
  py::dict d;
  d["version"] = r.version;
  d["bytes"] = r.bytes;
  d["buckets"] = r.buckets;
  d["seconds"] = r.seconds;
  d["gb_per_s"] = r.gb_per_s();
  d["send_s"] = r.send_s;
  d["wait_start_s"] = r.wait_start_s;
  d["wait_go_s"] = r.wait_go_s;
  d["wait_credits_s"] = r.wait_credits_s;
  d["wait_commit_s"] = r.wait_commit_s;
  d["only"] = py::tuple(py::cast(r.only));
  return d;
}

// A sharded entry's split: its full shape, and the chunk (torch.chunk,
// FSDP2, DTensor Shard(dim)) this rank holds, or None for a replicated one.
struct EntrySplit {
  std::vector<std::int64_t> full_shape;
  std::optional<int> dim;  // none: replicated
  int index = 0, count = 1;
};

// The full spec and the layout of a sharded entry whose local tensor is `t`;
// the local shape must be the chunk's box. Errors name the tensor.
StatusOr<Layout> entry_layout(const ImportedTensor& t, const EntrySplit& split, TensorSpec* full) {
  full->name = t.spec().name;
  full->dtype = t.spec().dtype;
  full->shape = split.full_shape;
  const std::string what = "tensor '" + full->name + "'";
  if (split.count < 1 || split.index < 0 || split.index >= split.count) {
    return InvalidArgument(what + ": index " + std::to_string(split.index) + " of " + std::to_string(split.count) +
                           " ranks is out of range");
  }
  const Layout layout = split.dim ? Layout::of(LayoutLevel::chunk(*split.dim, split.count))
                                  : Layout::of(LayoutLevel::replicate(split.count));
  ASSIGN_OR_RETURN(const TensorSpec local, local_spec(*full, layout, split.index));
  if (local.shape != t.spec().shape) {
    return InvalidArgument(what + ": rank " + std::to_string(split.index) + " of " + std::to_string(split.count) +
                           " holds " + t.spec().ToString() + ", but " + layout.ToString() + " of " +
                           full->ToString() + " gives it " + local.ToString());
  }
  return layout;
}

class PyTrainer {
 public:
  // entries: (name, tensor, rule name) in stream order, each with, for a
  // sharded trainer, (full_shape, dim or None, index, count) after the rule.
  PyTrainer(RankOptions options, const py::list& entries) : name_("trainer rank " + std::to_string(options.rank)) {
    if (entries.empty()) throw_status(InvalidArgument(name_ + ": no tensors to register"));
    Model model;
    model.preset = "python";
    std::vector<const std::byte*> data;
    std::vector<Layout> layouts;
    std::set<std::string> names;
    for (py::handle entry : entries) {
      auto item = entry.cast<py::tuple>();
      if (item.size() != 3 && item.size() != 7) {
        throw_status(InvalidArgument(name_ + ": each tensor entry is (name, tensor, rule) or (name, tensor, rule, "
                                             "full_shape, dim, index, count)"));
      }
      const auto name = item[0].cast<std::string>();
      if (!names.insert(name).second) throw_status(InvalidArgument(name_ + ": tensor '" + name + "' registered twice"));
      ImportedTensor t = value_or_throw(ImportedTensor::Import(item[1], name, /*writable=*/false));
      auto rule = parse_shard_rule(item[2].cast<std::string>());
      if (!rule.ok()) throw_status(rule.status().WithContext(name_ + ": tensor '" + name + "'"));
      if (*rule == ShardRule::kExpert) {
        // As a --rule row: an expert's owner comes from the engines' layout
        // (--engine-experts ep), never from one tensor's rule.
        throw_status(InvalidArgument(name_ + ": tensor '" + name + "': rule 'expert' is not a per-tensor rule; "
                                             "expert-parallel engines give every expert tensor its owner"));
      }
      TensorSpec full = t.spec();
      if (item.size() == 7) {
        EntrySplit split{item[3].cast<std::vector<std::int64_t>>(),
                         item[4].is_none() ? std::nullopt : std::optional<int>(item[4].cast<int>()),
                         item[5].cast<int>(), item[6].cast<int>()};
        StatusOr<Layout> layout = entry_layout(t, split, &full);
        if (!layout.ok()) throw_status(layout.status().WithContext(name_));
        layouts.push_back(*layout);
        if (split.index != options.rank || split.count != options.trainer_ranks) {
          throw_status(InvalidArgument(name_ + " of " + std::to_string(options.trainer_ranks) + ": tensor '" + name +
                                       "' is rank " + std::to_string(split.index) + "'s shard of " +
                                       std::to_string(split.count) + " ranks"));
        }
      }
      check(check_rule(full, *rule).WithContext(name_));
      if (!tensors_.empty() && (t.memory() != memory_ || t.device() != device_)) {
        throw_status(InvalidArgument(name_ + ": tensor '" + name + "' is on " + t.device_name() + " but tensor '" +
                                     tensors_.front().spec().name + "' is on " + tensors_.front().device_name() +
                                     " (a trainer rank's tensors live on one device)"));
      }
      memory_ = t.memory();
      device_ = t.device();
      model.weights.push_back(Weight{full, *rule});
      data.push_back(t.data());
      tensors_.push_back(std::move(t));
    }
    if (!layouts.empty() && layouts.size() != model.weights.size()) {
      throw_status(InvalidArgument(name_ + ": some tensor entries are shards and some are not (give every entry "
                                           "its split: dim None for a replicated one)"));
    }
    if (memory_ == MemoryKind::kCuda) {
      options.device = "cuda";
      options.gpu = device_;
    }
    auto source = value_or_throw(
        make_external_source(std::move(model), std::move(data), memory_, device_, std::move(layouts), options.rank));
    StatusOr<std::unique_ptr<TrainerRank>> rank = Internal("not joined");
    {
      py::gil_scoped_release release;
      rank = TrainerRank::Join(options, std::move(source));
    }
    rank_ = value_or_throw(std::move(rank));
  }

  ~PyTrainer() { close(); }

  // The report of the refit (a dict; see report_dict).
  py::dict refit(std::uint64_t version, const std::vector<std::string>& only) {
    TrainerRank& rank = joined();
    Status status;
    {
      py::gil_scoped_release release;
      if (memory_ == MemoryKind::kCuda) {
        status = synchronize_device(device_).WithContext(name_ + ", before refit " + std::to_string(version));
      }
      if (status.ok()) status = rank.refit(version, only);
    }
    check(status);
    return last_refit().cast<py::dict>();
  }

  void serve() {
    TrainerRank& rank = joined();
    Status status;
    {
      py::gil_scoped_release release;
      status = rank.serve();
    }
    check(status);
  }

  void finish() {
    TrainerRank& rank = joined();
    Status status;
    {
      py::gil_scoped_release release;
      status = rank.finish();
    }
    check(status);
  }

  std::uint64_t committed_version() { return joined().committed_version(); }

  // The last committed refit's report (a dict), or None before the first.
  py::object last_refit() {
    const std::optional<TrainerRefitReport> report = joined().last_refit();
    return report ? py::object(report_dict(*report)) : py::object(py::none());
  }

  // Leaves the job (connections closed) and returns the tensors to their owners.
  void close() {
    if (rank_) {
      py::gil_scoped_release release;
      rank_.reset();
    }
    tensors_.clear();
  }

  py::list specs() const {
    py::list out;
    for (const ImportedTensor& t : tensors_) {
      out.append(py::make_tuple(t.spec().name, std::string(dtype_name(t.spec().dtype)), py::tuple(py::cast(t.spec().shape))));
    }
    return out;
  }

  std::string device() const { return memory_ == MemoryKind::kCuda ? "cuda:" + std::to_string(device_) : "cpu"; }

 private:
  TrainerRank& joined() {
    if (!rank_) throw_status(FailedPrecondition(name_ + " is closed"));
    return *rank_;
  }

  std::string name_;
  std::vector<ImportedTensor> tensors_;  // declared before rank_: outlives it
  MemoryKind memory_ = MemoryKind::kHost;
  int device_ = -1;
  std::unique_ptr<TrainerRank> rank_;
};

}  // namespace

void bind_trainer(py::module_& m) {
  py::class_<PyTrainer>(m, "Trainer")
      .def(py::init<RankOptions, const py::list&>(), py::arg("options"), py::arg("entries"))
      .def("refit", &PyTrainer::refit, py::arg("version"), py::arg("only") = std::vector<std::string>())
      .def("serve", &PyTrainer::serve)
      .def("finish", &PyTrainer::finish)
      .def("close", &PyTrainer::close)
      .def_property_readonly("committed_version", &PyTrainer::committed_version)
      .def_property_readonly("last_refit", &PyTrainer::last_refit)
      .def_property_readonly("specs", &PyTrainer::specs)
      .def_property_readonly("device", &PyTrainer::device);
}

}  // namespace refit::python
