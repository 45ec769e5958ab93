// The DLPack C ABI the binding speaks (https://dmlc.github.io/dlpack/latest/).
//
// DLPack is a stable C ABI, so the structs are the format itself. Debian 12's
// libdlpack-dev (dlpack/dlpack.h, version 0.6) provides the unversioned part
// (DLDevice, DLDataType, DLTensor, DLManagedTensor); where it is missing (the
// GPU machine has no dlpack headers) the same structs are declared here.
// DLPack 1.x added, and 0.6 lacks, what torch >= 2.5 and numpy >= 2 exchange:
// the versioned capsule ("dltensor_versioned": DLPackVersion,
// DLManagedTensorVersioned, the flag bits) and the type codes kDLBool and
// float8. Those are declared below from the DLPack 1.1 specification,
// whatever header was found.
#pragma once

#include <stddef.h>
#include <stdint.h>

#if __has_include(<dlpack/dlpack.h>)
#include <dlpack/dlpack.h>
#else
extern "C" {
typedef enum {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
  kDLCUDAManaged = 13,
} DLDeviceType;

typedef struct {
  DLDeviceType device_type;
  int device_id;
} DLDevice;

typedef enum {
  kDLInt = 0U,
  kDLUInt = 1U,
  kDLFloat = 2U,
  kDLOpaqueHandle = 3U,
  kDLBfloat = 4U,
  kDLComplex = 5U,
} DLDataTypeCode;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void* data;
  DLDevice device;
  int ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; NULL: compact C order
  uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensor* self);
} DLManagedTensor;
}  // extern "C"
#endif

namespace refit::dlpack {

// Type codes added after 0.6 (DLPack 1.1 DLDataTypeCode values).
inline constexpr uint8_t kBool = 6;
inline constexpr uint8_t kFloat8E4M3FN = 10;
inline constexpr uint8_t kFloat8E5M2 = 12;

// Capsule names: a producer's capsule, and the name a consumer gives it once
// it took ownership (it then calls the deleter itself).
inline constexpr const char* kCapsule = "dltensor";
inline constexpr const char* kUsedCapsule = "used_dltensor";
inline constexpr const char* kVersionedCapsule = "dltensor_versioned";
inline constexpr const char* kUsedVersionedCapsule = "used_dltensor_versioned";

// DLPack 1.x (the layout is part of the ABI: version first, so a consumer can
// check it before reading the rest).
struct Version {
  uint32_t major;
  uint32_t minor;
};
inline constexpr Version kVersion{1, 1};
inline constexpr uint64_t kFlagReadOnly = 1ull << 0;
inline constexpr uint64_t kFlagIsCopied = 1ull << 1;

extern "C" {
struct ManagedTensorVersioned {
  Version version;
  void* manager_ctx;
  void (*deleter)(ManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
};
}  // extern "C"

}  // namespace refit::dlpack
