// Tensors across the Python boundary through DLPack (dlpack_abi.h), so that
// numpy, torch and cupy tensors all work and refit never depends on any of
// them at build time.
//
// In: ImportedTensor::Import takes any object with __dlpack__ (or a
// "dltensor" capsule), keeps the producer's DLManagedTensor, and with it the
// producer's memory, alive until the ImportedTensor is destroyed. Only dense
// C-order tensors of a refit dtype on the host or on a CUDA device are
// accepted; every error names the tensor.
//
// Out: ExportedView (Python: refit.TensorView) is the object refit hands
// out for bytes it owns or borrows (a staging slot during load_fn, the
// direct-mode weight arena). It implements __dlpack__ / __dlpack_device__, so torch.from_dlpack(view),
// numpy.from_dlpack(view) and cupy.from_dlpack(view) map the same memory
// without a copy. Each capsule holds `owner` (the memory's keeper), so the
// memory outlives every tensor made from the view. A view may expire (`valid`
// set to false): __dlpack__ then raises BufferError instead of handing out a
// pointer into recycled memory; tensors already made from it are not
// tracked (the caller must not keep them; see Engine.next's contract).
//
// Thread safety: everything here needs the GIL, except the capsules'
// deleters, which run on any thread.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "refit/status.h"
#include "refit/tensor.h"

namespace refit::python {

class ImportedTensor {
 public:
  // Imports `object` as tensor `name`. `writable`: refit will write into it
  // (a read-only export is refused). Errors are kInvalidArgument naming the
  // tensor: no __dlpack__, __dlpack__ failed (e.g. a torch tensor that
  // requires grad: pass tensor.detach()), not C-contiguous, an unsupported
  // dtype, lanes or device, a null pointer.
  // REQUIRES: the GIL.
  static StatusOr<ImportedTensor> Import(pybind11::handle object, const std::string& name, bool writable);

  ImportedTensor() = default;
  ~ImportedTensor();  // returns the tensor to its producer; REQUIRES: the GIL
  ImportedTensor(ImportedTensor&& other) noexcept;
  ImportedTensor& operator=(ImportedTensor&& other) noexcept;
  ImportedTensor(const ImportedTensor&) = delete;
  ImportedTensor& operator=(const ImportedTensor&) = delete;

  const TensorSpec& spec() const { return spec_; }
  std::byte* data() const { return data_; }
  MemoryKind memory() const { return memory_; }
  int device() const { return device_; }  // local CUDA index for kCuda, -1 on the host
  // "cpu" or "cuda:N".
  std::string device_name() const;

 private:
  void release();

  TensorSpec spec_;
  std::byte* data_ = nullptr;
  MemoryKind memory_ = MemoryKind::kHost;
  int device_ = -1;
  void* managed_ = nullptr;  // DLManagedTensor* or ManagedTensorVersioned*
  bool versioned_ = false;
};

// Where a view's bytes are, and what keeps them alive.
struct ViewSource {
  TensorSpec spec;
  std::byte* data = nullptr;
  MemoryKind memory = MemoryKind::kHost;
  int device = -1;
  std::shared_ptr<void> owner;               // kept by every capsule; may be null (borrowed memory)
  std::shared_ptr<std::atomic<bool>> valid;  // null: always valid
};

class ExportedView {
 public:
  explicit ExportedView(ViewSource source) : source_(std::move(source)) {}

  const ViewSource& source() const { return source_; }
  bool valid() const { return !source_.valid || source_.valid->load(); }

  // The DLPack protocol (Python array API): a "dltensor_versioned" capsule
  // when max_version's major is >= 1, else a "dltensor" capsule. The bytes
  // are ready for any stream (refit finished writing them before handing the
  // view out), so `stream` needs no synchronization. copy=True, or a
  // dl_device other than the view's, raises BufferError (refit does not copy
  // on export). REQUIRES: the GIL.
  pybind11::object dlpack(pybind11::object stream, pybind11::object max_version, pybind11::object dl_device,
                          pybind11::object copy) const;
  // (device type, device id) as DLPack numbers: (1, 0) host, (2, N) CUDA.
  pybind11::tuple dlpack_device() const;

 private:
  ViewSource source_;
};

// Registers ExportedView in `module`.
void register_tensor_view(pybind11::module_& module);

}  // namespace refit::python
