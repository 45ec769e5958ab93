// WeightSource: what a trainer rank sends and where its bytes are.
//
// A source lists the full (unsharded) weights of a model, each with the TP
// shard rule the engine splits it by (model.h), and for every refit makes the
// bytes of that version available at data(i), in C order. The trainer rank
// cuts each engine rank's shard out of those bytes itself.
//
// Three kinds exist:
//   synthetic   a model preset whose content is regenerated for every version
//               from (seed, version, name), like an optimizer step; engines
//               verify every byte against the same function (content.h)
//   external    tensors the caller owns and updates (a training loop, the
//               Python binding); prepare() does nothing
//   checkpoint  a safetensors file or directory, mapped read-only
//               (checkpoint.h: make_checkpoint_source)
//
// Ownership and lifetime: data(i) stays valid until the next prepare() or the
// source's destruction. External sources do not own their memory: the caller
// keeps it alive (and unchanged during a refit) for the source's lifetime.
// Thread safety: one thread (the trainer rank's) uses a source.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "refit/layout.h"
#include "refit/model.h"
#include "refit/quantize.h"
#include "refit/content.h"
#include "refit/status.h"
#include "refit/tensor.h"

namespace refit {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // The full weights in stream order; fixed for the source's lifetime.
  virtual const Model& model() const = 0;
  // Where the bytes live: kHost, or kCuda on device() (a local CUDA index).
  virtual MemoryKind memory() const = 0;
  virtual int device() const = 0;
  // Makes the bytes of `version` available at data(i). `seed` is the job's
  // seed (the coordinator's), used by synthetic sources only.
  virtual Status prepare(std::uint64_t version, std::uint64_t seed) = 0;
  // Weight i's full bytes (model().weights[i].spec.nbytes() of them).
  virtual const std::byte* data(std::size_t i) const = 0;
  // Host ranges that hold every data(i) and never move for the source's
  // lifetime (a mapped checkpoint's files), or none. A trainer feeding device
  // engines registers them with its device (HostRegistration) once, and its
  // kernels then read the weights straight from them; a source without such
  // ranges is packed through pinned memory instead.
  virtual std::vector<std::pair<const std::byte*, std::uint64_t>> stable_host_ranges() const { return {}; }
  // Called after the coordinator's "go" for `version`, before the first
  // bucket is sent: a view whose bytes are computed from the source's (the
  // codes and scales of `--quantize`, runtime/quantized_source.h) computes
  // them here, so that a refit's time includes the conversion. An error
  // fails the refit (a NaN refused, naming the tensor). Default: nothing.
  virtual Status derive(std::uint64_t version) {
    (void)version;
    return Status::Ok();
  }
  // Called after a refit read every data(i) it sends, before the trainer
  // says "sent": OK when what was read is what the source held. A
  // checkpoint's file truncated, rewritten or replaced meanwhile fails it,
  // naming the file (checkpoint.h); sources whose bytes cannot change under
  // them answer OK.
  virtual Status check_unchanged() const { return Status::Ok(); }
  // Sharded trainers (issue 19): how the trainer ranks split each weight,
  // one layout per weight in model order (layout.h, trainer_layout.h), when
  // this source holds one trainer rank's local shards: data(i) is then that
  // rank's local shard of weight i (the C-order bytes of its layout_box),
  // model().weights[i].spec stays the full spec. Empty (the default): every
  // data(i) is the full tensor.
  virtual std::vector<Layout> trainer_layouts() const { return {}; }
};

// A preset (model.h make_model) whose weights live in one arena of host
// memory, or of device memory on local CUDA index `device` when
// memory == kCuda, allocated once here. The weights `quantize` selects
// (quantize.h `quantizes`; none by default) hold finite content
// (content.h make_finite_content), as an FP8 engine verifies them.
// `change`: the parts of 2^32 of each tensor's elements that change per
// version (content.h ContentKey, --change-fraction); every element by
// default.
StatusOr<std::unique_ptr<WeightSource>> make_synthetic_source(const std::string& preset, int layers,
                                                              MemoryKind memory, int device,
                                                              const QuantizeSpec& quantize = {},
                                                              std::uint64_t change = kEveryElement);

// The preset's weights as trainer rank `rank` of `layouts` holds them (one
// layout per weight, model order; trainer_layouts() returns them): data(i)
// is its local shard of weight i, holding exactly the bytes the full
// synthetic tensor holds in its box, so that engines verify what they
// receive against the same content (finite where `quantize` selects, as
// make_synthetic_source's). Errors name the tensor: a layout count
// other than the weights', a layout the tensor does not fit, a rank outside
// the layouts' ranks.
StatusOr<std::unique_ptr<WeightSource>> make_synthetic_shard_source(const std::string& preset, int layers,
                                                                    std::vector<Layout> layouts, int rank,
                                                                    MemoryKind memory, int device,
                                                                    const QuantizeSpec& quantize = {},
                                                                    std::uint64_t change = kEveryElement);
// The caller's tensors: data[i] holds model.weights[i]'s full bytes, in
// `memory` (on `device` for kCuda). Checks that the counts match and that no
// pointer is null (unless the tensor is empty).
// With `layouts` (one per weight: the caller is trainer rank `rank` of a
// sharded trainer, issue 19), data[i] holds that rank's local shard of
// weight i instead (the C-order bytes of its layout_box) and the source's
// trainer_layouts() are `layouts`; every layout must be valid for its
// weight and span the same number of ranks, with `rank` among them. Errors
// (kInvalidArgument) name the tensor.
StatusOr<std::unique_ptr<WeightSource>> make_external_source(Model model, std::vector<const std::byte*> data,
                                                             MemoryKind memory, int device,
                                                             std::vector<Layout> layouts = {}, int rank = 0);

}  // namespace refit
