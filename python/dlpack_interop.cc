// DLPack import and export: see dlpack_interop.h.
#include "dlpack_interop.h"

#include <optional>
#include <utility>

#include "dlpack_abi.h"
#include "refit/dtype.h"

namespace py = pybind11;

namespace refit::python {
namespace {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

std::string dtype_text(DLDataType t) {
  const char* kind = "code" ;
  switch (t.code) {
    case kDLInt: kind = "int"; break;
    case kDLUInt: kind = "uint"; break;
    case kDLFloat: kind = "float"; break;
    case kDLBfloat: kind = "bfloat"; break;
    case kDLComplex: kind = "complex"; break;
    case dlpack::kBool: kind = "bool"; break;
    default: break;
  }
  std::string text = std::string(kind) + (t.code > dlpack::kBool ? std::to_string(t.code) + "/" : "") +
                     std::to_string(t.bits);
  if (t.lanes != 1) text += "x" + std::to_string(t.lanes);
  return text;
}

// The refit dtype of a DLPack type, if refit moves it.
std::optional<DType> dtype_of(DLDataType t) {
  if (t.lanes != 1) return std::nullopt;
  switch (t.code) {
    case kDLInt:
      if (t.bits == 8) return DType::kInt8;
      if (t.bits == 16) return DType::kInt16;
      if (t.bits == 32) return DType::kInt32;
      if (t.bits == 64) return DType::kInt64;
      break;
    case kDLUInt:
      if (t.bits == 8) return DType::kUInt8;
      break;
    case kDLFloat:
      if (t.bits == 16) return DType::kFloat16;
      if (t.bits == 32) return DType::kFloat32;
      if (t.bits == 64) return DType::kFloat64;
      break;
    case kDLBfloat:
      if (t.bits == 16) return DType::kBFloat16;
      break;
    case dlpack::kBool:
      if (t.bits == 8) return DType::kBool;
      break;
    case dlpack::kFloat8E4M3FN:
      if (t.bits == 8) return DType::kFloat8E4M3FN;
      break;
    case dlpack::kFloat8E5M2:
      if (t.bits == 8) return DType::kFloat8E5M2;
      break;
    default:
      break;
  }
  return std::nullopt;
}

DLDataType dl_dtype_of(DType d) {
  const auto bits = static_cast<std::uint8_t>(dtype_size(d) * 8);
  switch (d) {
    case DType::kBool: return {dlpack::kBool, 8, 1};
    case DType::kUInt8: return {kDLUInt, 8, 1};
    case DType::kInt8:
    case DType::kInt16:
    case DType::kInt32:
    case DType::kInt64: return {kDLInt, bits, 1};
    case DType::kFloat16:
    case DType::kFloat32:
    case DType::kFloat64: return {kDLFloat, bits, 1};
    case DType::kBFloat16: return {kDLBfloat, 16, 1};
    case DType::kFloat8E4M3FN: return {dlpack::kFloat8E4M3FN, 8, 1};
    case DType::kFloat8E5M2: return {dlpack::kFloat8E5M2, 8, 1};
  }
  return {kDLUInt, 8, 1};
}

// Calls object.__dlpack__, asking for a versioned capsule first; producers
// that predate DLPack 1.0 (numpy < 2) reject max_version with a TypeError and
// are asked again without it.
StatusOr<py::object> call_dlpack(py::handle object, const std::string& where) {
  py::object method = py::getattr(object, "__dlpack__", py::none());
  if (method.is_none()) {
    if (PyCapsule_CheckExact(object.ptr())) return py::reinterpret_borrow<py::object>(object);
    return InvalidArgument(where + ": a " + std::string(py::str(py::type::of(object).attr("__name__"))) +
                           " is not a tensor (it has no __dlpack__; pass a numpy array, a torch or cupy tensor)");
  }
  try {
    return method(py::arg("max_version") = py::make_tuple(dlpack::kVersion.major, dlpack::kVersion.minor));
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) {
      return InvalidArgument(where + ": __dlpack__() failed: " + std::string(py::str(e.value())));
    }
  }
  try {
    return method();
  } catch (py::error_already_set& e) {
    return InvalidArgument(where + ": __dlpack__() failed: " + std::string(py::str(e.value())));
  }
}

}  // namespace

StatusOr<ImportedTensor> ImportedTensor::Import(py::handle object, const std::string& name, bool writable) {
  const std::string where = "tensor '" + name + "'";
  if (object.is_none()) return InvalidArgument(where + " is missing (None)");
  ASSIGN_OR_RETURN(py::object capsule, call_dlpack(object, where));

  ImportedTensor t;
  const DLTensor* dl = nullptr;
  std::uint64_t flags = 0;
  if (PyCapsule_IsValid(capsule.ptr(), dlpack::kVersionedCapsule)) {
    auto* m = static_cast<dlpack::ManagedTensorVersioned*>(PyCapsule_GetPointer(capsule.ptr(), dlpack::kVersionedCapsule));
    if (m->version.major != dlpack::kVersion.major) {
      return InvalidArgument(where + ": DLPack version " + std::to_string(m->version.major) + "." +
                             std::to_string(m->version.minor) + " is not supported (refit reads 1.x)");
    }
    t.managed_ = m;
    t.versioned_ = true;
    PyCapsule_SetName(capsule.ptr(), dlpack::kUsedVersionedCapsule);  // ours to delete now
    dl = &m->dl_tensor;
    flags = m->flags;
  } else if (PyCapsule_IsValid(capsule.ptr(), dlpack::kCapsule)) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), dlpack::kCapsule));
    t.managed_ = m;
    PyCapsule_SetName(capsule.ptr(), dlpack::kUsedCapsule);
    dl = &m->dl_tensor;
  } else {
    return InvalidArgument(where + ": __dlpack__() did not return a DLPack capsule (an unused \"dltensor\" or "
                           "\"dltensor_versioned\" capsule)");
  }

  t.spec_.name = name;
  if (dl->ndim < 0) return InvalidArgument(where + ": negative ndim " + std::to_string(dl->ndim));
  t.spec_.shape.assign(dl->shape, dl->shape + dl->ndim);
  for (std::int64_t d : t.spec_.shape) {
    if (d < 0) return InvalidArgument(where + ": negative dimension in shape " + shape_text(t.spec_.shape));
  }
  auto dtype = dtype_of(dl->dtype);
  if (!dtype) {
    return InvalidArgument(where + ": dtype " + dtype_text(dl->dtype) +
                           " is not one refit moves (bool, uint8, int8/16/32/64, float16/32/64, bfloat16, "
                           "float8_e4m3fn, float8_e5m2)");
  }
  t.spec_.dtype = *dtype;
  RETURN_IF_ERROR(validate_spec(t.spec_));

  // C order: stride of dim i = product of the later dims (dims of extent 1
  // may carry any stride); an empty tensor is trivially contiguous.
  if (dl->strides != nullptr && t.spec_.numel() > 1) {
    std::int64_t expected = 1;
    for (int i = dl->ndim - 1; i >= 0; --i) {
      if (dl->shape[i] != 1 && dl->strides[i] != expected) {
        std::vector<std::int64_t> strides(dl->strides, dl->strides + dl->ndim);
        return InvalidArgument(where + " is not contiguous (shape " + shape_text(t.spec_.shape) + ", strides " +
                               shape_text(strides) + " elements): refit reads C-order bytes; pass a "
                               "contiguous tensor (.contiguous() / numpy.ascontiguousarray)");
      }
      expected *= dl->shape[i];
    }
  }

  switch (dl->device.device_type) {
    case kDLCPU:
    case kDLCUDAHost:
      t.memory_ = MemoryKind::kHost;
      t.device_ = -1;
      break;
    case kDLCUDA:
      t.memory_ = MemoryKind::kCuda;
      t.device_ = dl->device.device_id;
      break;
    default:
      return InvalidArgument(where + ": DLPack device type " + std::to_string(static_cast<int>(dl->device.device_type)) +
                             " is not supported (host memory or a CUDA device)");
  }
  if (writable && (flags & dlpack::kFlagReadOnly)) {
    return InvalidArgument(where + " is read-only, but refit writes into it");
  }
  t.data_ = static_cast<std::byte*>(dl->data) + dl->byte_offset;
  if (t.data_ == nullptr && t.spec_.nbytes() != 0) return InvalidArgument(where + " has no data (null pointer)");
  return t;
}

ImportedTensor::~ImportedTensor() { release(); }

ImportedTensor::ImportedTensor(ImportedTensor&& other) noexcept { *this = std::move(other); }

ImportedTensor& ImportedTensor::operator=(ImportedTensor&& other) noexcept {
  if (this != &other) {
    release();
    spec_ = std::move(other.spec_);
    data_ = other.data_;
    memory_ = other.memory_;
    device_ = other.device_;
    managed_ = std::exchange(other.managed_, nullptr);
    versioned_ = other.versioned_;
  }
  return *this;
}

void ImportedTensor::release() {
  if (managed_ == nullptr) return;
  if (versioned_) {
    auto* m = static_cast<dlpack::ManagedTensorVersioned*>(managed_);
    if (m->deleter) m->deleter(m);
  } else {
    auto* m = static_cast<DLManagedTensor*>(managed_);
    if (m->deleter) m->deleter(m);
  }
  managed_ = nullptr;
}

std::string ImportedTensor::device_name() const {
  return memory_ == MemoryKind::kCuda ? "cuda:" + std::to_string(device_) : "cpu";
}

// ---- Export -----------------------------------------------------------------

namespace {

// Everything one capsule owns; freed by the DLPack deleter.
struct ExportContext {
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  std::shared_ptr<void> owner;
  DLManagedTensor legacy{};
  dlpack::ManagedTensorVersioned versioned{};
};

void fill(DLTensor* dl, ExportContext* ctx, const ViewSource& s) {
  dl->data = s.data;
  dl->device = s.memory == MemoryKind::kCuda ? DLDevice{kDLCUDA, s.device} : DLDevice{kDLCPU, 0};
  dl->ndim = static_cast<int>(s.spec.shape.size());
  dl->dtype = dl_dtype_of(s.spec.dtype);
  dl->shape = ctx->shape.data();
  dl->strides = ctx->strides.data();
  dl->byte_offset = 0;
}

void delete_legacy(DLManagedTensor* self) { delete static_cast<ExportContext*>(self->manager_ctx); }
void delete_versioned(dlpack::ManagedTensorVersioned* self) { delete static_cast<ExportContext*>(self->manager_ctx); }

// A capsule nobody consumed still owns its tensor.
void legacy_capsule_destructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, dlpack::kCapsule)) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, dlpack::kCapsule));
    m->deleter(m);
  }
}

void versioned_capsule_destructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, dlpack::kVersionedCapsule)) {
    auto* m = static_cast<dlpack::ManagedTensorVersioned*>(PyCapsule_GetPointer(capsule, dlpack::kVersionedCapsule));
    m->deleter(m);
  }
}

[[noreturn]] void buffer_error(const std::string& message) {
  PyErr_SetString(PyExc_BufferError, message.c_str());
  throw py::error_already_set();
}

}  // namespace

py::object ExportedView::dlpack(py::object stream, py::object max_version, py::object dl_device, py::object copy) const {
  (void)stream;  // the bytes are complete before the view is handed out
  const std::string where = "refit view of '" + source_.spec.name + "'";
  if (!valid()) {
    buffer_error(where + " has expired: a staging view is valid only during the load_fn call that received it");
  }
  if (!copy.is_none() && copy.cast<bool>()) buffer_error(where + ": copy=True is not supported; copy after import");
  if (!dl_device.is_none()) {
    py::tuple want = dl_device.cast<py::tuple>();
    py::tuple have = dlpack_device();
    if (want.size() != 2 || want[0].cast<int>() != have[0].cast<int>() || want[1].cast<int>() != have[1].cast<int>()) {
      buffer_error(where + ": dl_device " + std::string(py::str(dl_device)) + " differs from the view's " +
                   std::string(py::str(have)) + " and refit does not copy on export");
    }
  }
  bool versioned = false;
  if (!max_version.is_none()) {
    py::tuple v = max_version.cast<py::tuple>();
    versioned = v.size() >= 1 && v[0].cast<int>() >= 1;
  }

  auto ctx = std::make_unique<ExportContext>();
  ctx->shape = source_.spec.shape;
  ctx->strides.assign(ctx->shape.size(), 1);
  for (int i = static_cast<int>(ctx->shape.size()) - 2; i >= 0; --i) {
    ctx->strides[static_cast<std::size_t>(i)] = ctx->strides[static_cast<std::size_t>(i) + 1] *
                                                std::max<std::int64_t>(ctx->shape[static_cast<std::size_t>(i) + 1], 1);
  }
  ctx->owner = source_.owner;
  PyObject* capsule = nullptr;
  if (versioned) {
    dlpack::ManagedTensorVersioned* m = &ctx->versioned;
    m->version = dlpack::kVersion;
    m->manager_ctx = ctx.get();
    m->deleter = delete_versioned;
    m->flags = 0;
    fill(&m->dl_tensor, ctx.get(), source_);
    capsule = PyCapsule_New(m, dlpack::kVersionedCapsule, versioned_capsule_destructor);
  } else {
    DLManagedTensor* m = &ctx->legacy;
    m->manager_ctx = ctx.get();
    m->deleter = delete_legacy;
    fill(&m->dl_tensor, ctx.get(), source_);
    capsule = PyCapsule_New(m, dlpack::kCapsule, legacy_capsule_destructor);
  }
  if (capsule == nullptr) throw py::error_already_set();
  ctx.release();  // the capsule (or its consumer) owns it now
  return py::reinterpret_steal<py::object>(capsule);
}

py::tuple ExportedView::dlpack_device() const {
  if (source_.memory == MemoryKind::kCuda) return py::make_tuple(static_cast<int>(kDLCUDA), source_.device);
  return py::make_tuple(static_cast<int>(kDLCPU), 0);
}

void register_tensor_view(py::module_& module) {
  py::class_<ExportedView>(module, "TensorView",
                         "A tensor in refit's memory: pass it to torch.from_dlpack, numpy.from_dlpack or "
                         "cupy.from_dlpack (no copy). Staging views (load_fn) are valid only during the call.")
      .def("__dlpack__", &ExportedView::dlpack, py::kw_only(), py::arg("stream") = py::none(),
           py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(), py::arg("copy") = py::none())
      .def("__dlpack_device__", &ExportedView::dlpack_device)
      .def_property_readonly("name", [](const ExportedView& v) { return v.source().spec.name; })
      .def_property_readonly("dtype", [](const ExportedView& v) { return std::string(dtype_name(v.source().spec.dtype)); })
      .def_property_readonly("shape", [](const ExportedView& v) {
        py::tuple shape(v.source().spec.shape.size());
        for (std::size_t i = 0; i < v.source().spec.shape.size(); ++i) shape[i] = v.source().spec.shape[i];
        return shape;
      })
      .def_property_readonly("nbytes", [](const ExportedView& v) { return v.source().spec.nbytes(); })
      .def_property_readonly("data_ptr", [](const ExportedView& v) { return reinterpret_cast<std::uintptr_t>(v.source().data); })
      .def_property_readonly("device", [](const ExportedView& v) {
        return v.source().memory == MemoryKind::kCuda ? "cuda:" + std::to_string(v.source().device) : std::string("cpu");
      })
      .def_property_readonly("valid", &ExportedView::valid)
      .def("__repr__", [](const ExportedView& v) {
        return "<refit.TensorView " + v.source().spec.ToString() + " on " +
               (v.source().memory == MemoryKind::kCuda ? "cuda:" + std::to_string(v.source().device) : "cpu") +
               (v.valid() ? "" : ", expired") + ">";
      });
}

}  // namespace refit::python
