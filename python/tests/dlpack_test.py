"""DLPack in and out of the binding, checked at the ABI level with ctypes.

torch >= 2.5 and numpy >= 2 exchange *versioned* capsules ("dltensor_versioned",
DLPack 1.x); numpy 1.24 (Debian 12) only the legacy "dltensor" one. Neither
torch nor numpy 2 is on the CI machine, so a ctypes producer stands in for
them on the way in, and the capsules refit hands out are read field by field
on the way out. Each test names the mutation it catches.
"""
import ctypes
import threading
import unittest

try:
    import numpy as np
except ImportError:
    np = None

import refit

c_int64_p = ctypes.POINTER(ctypes.c_int64)


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int), ("dtype", DLDataType),
                ("shape", c_int64_p), ("strides", c_int64_p), ("byte_offset", ctypes.c_uint64)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_GetName.restype = ctypes.c_char_p
_api.PyCapsule_GetName.argtypes = [ctypes.py_object]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
VERSIONED, LEGACY = b"dltensor_versioned", b"dltensor"  # module globals: capsules keep these pointers


class Producer:
    """A DLPack producer over a numpy array with any type code, flags, strides or version."""

    def __init__(self, array, code, bits, versioned=True, major=1, flags=0, strides=None, byte_offset=0):
        self.array, self.deleted = array, 0
        self.shape = (ctypes.c_int64 * array.ndim)(*array.shape)
        self.strides = (ctypes.c_int64 * array.ndim)(*strides) if strides is not None else None
        self.deleter = DELETER(self._delete)
        self.versioned = versioned
        tensor = DLTensor(array.ctypes.data, DLDevice(1, 0), array.ndim, DLDataType(code, bits, 1),
                          ctypes.cast(self.shape, c_int64_p),
                          ctypes.cast(self.strides, c_int64_p) if self.strides is not None else None, byte_offset)
        if versioned:
            self.managed = DLManagedTensorVersioned(DLPackVersion(major, 0), None, self.deleter, flags, tensor)
        else:
            self.managed = DLManagedTensor(tensor, None, self.deleter)

    def _delete(self, _):
        self.deleted += 1

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if self.versioned and max_version is None:
            raise AssertionError("refit did not ask for a versioned capsule")
        return _api.PyCapsule_New(ctypes.addressof(self.managed), VERSIONED if self.versioned else LEGACY, None)

    def __dlpack_device__(self):
        return (1, 0)


@unittest.skipIf(np is None, "numpy is not installed for this python (Debian: python3-numpy)")
class Import(unittest.TestCase):
    # Mutations caught: a type code mapped to the wrong dtype (bfloat16 read as float16, bool as
    # uint8, the float8 codes swapped); float8 codes of DLPack 0.x (6, 7) taken for 1.x's.
    def test_versioned_type_codes(self):
        raw = np.zeros((2, 3), np.uint16)
        for code, bits, name in [(4, 16, "bfloat16"), (2, 16, "float16"), (0, 16, "int16")]:
            self.assertEqual(refit.tensor_spec(Producer(raw, code, bits)), (name, (2, 3), "cpu"))
        raw8 = np.zeros(5, np.uint8)
        for code, name in [(6, "bool"), (10, "float8_e4m3fn"), (12, "float8_e5m2"), (1, "uint8"), (0, "int8")]:
            self.assertEqual(refit.tensor_spec(Producer(raw8, code, 8))[0], name)
        with self.assertRaises(refit.InvalidArgumentError):
            refit.tensor_spec(Producer(raw8, 7, 8))  # float8_e3m4: not a refit dtype

    # Mutation caught: the producer's deleter never called (every registered tensor leaked), or
    # called twice (a double free in real producers).
    def test_imported_tensor_returned_to_its_producer_once(self):
        p = Producer(np.zeros(4, np.float32), 2, 32)
        refit.tensor_spec(p)
        self.assertEqual(p.deleted, 1)
        legacy = Producer(np.zeros(4, np.float32), 2, 32, versioned=False)
        refit.tensor_spec(legacy)
        self.assertEqual(legacy.deleted, 1)

    # Mutation caught: the version field ignored (a 2.x layout read as 1.x).
    def test_unknown_major_version(self):
        with self.assertRaises(refit.InvalidArgumentError) as caught:
            refit.tensor_spec(Producer(np.zeros(4, np.float32), 2, 32, major=2), "w")
        self.assertIn("DLPack version 2.0", str(caught.exception))

    # Mutation caught: the read-only flag ignored for memory refit writes into.
    def test_read_only_flag_refused_for_destinations(self):
        p = Producer(np.zeros(4, np.float32), 2, 32, flags=1)
        self.assertEqual(refit.tensor_spec(p)[0], "float32")  # fine to read
        with self.assertRaises(refit.InvalidArgumentError) as caught:
            refit.Engine("127.0.0.1:1", {"w": p}, setup_timeout=1)
        self.assertIn("read-only", str(caught.exception))

    # Mutations caught: strides of extent-1 dimensions compared (torch gives them any value, so
    # valid tensors would be refused); real strides not compared.
    def test_strides(self):
        a = np.zeros((3, 1, 4), np.float32)
        self.assertEqual(refit.tensor_spec(Producer(a, 2, 32, strides=[4, 99, 1]))[1], (3, 1, 4))
        with self.assertRaises(refit.InvalidArgumentError):
            refit.tensor_spec(Producer(a, 2, 32, strides=[1, 1, 3]))

    # Mutation caught: numpy's legacy export path broken (numpy 1.x has no max_version).
    def test_numpy(self):
        self.assertEqual(refit.tensor_spec(np.zeros((2, 5), np.int64)), ("int64", (2, 5), "cpu"))
        self.assertEqual(refit.tensor_spec(np.array(1.5)), ("float64", (), "cpu"))


@unittest.skipIf(np is None, "numpy is not installed for this python (Debian: python3-numpy)")
class Export(unittest.TestCase):
    """Views handed to a load_fn, read as a consumer would."""

    @classmethod
    def setUpClass(cls):
        cls.checks = []
        coordinator = refit.Coordinator(1, 1, setup_timeout=20)
        tensors = {"m": np.arange(12, dtype=np.float32).reshape(3, 4), "s": np.array(7, dtype=np.int32)}

        def trainer():
            with refit.Trainer(coordinator, tensors, bucket_size=4096) as t:
                t.refit(1)

        def load(items):
            for name, view in items:
                cls.checks.append((name, view, cls.read(view), cls.read(view, versioned=False), cls.refusals(view)))

        thread = threading.Thread(target=trainer)
        thread.start()
        with refit.Engine(coordinator, [(n, a.dtype, a.shape) for n, a in tensors.items()],
                          bucket_size=4096) as engine:
            while engine.next(load) is not None:
                pass
        thread.join(30)
        coordinator.wait(30)

    @staticmethod
    def read(view, versioned=True):
        capsule = view.__dlpack__(max_version=(1, 0)) if versioned else view.__dlpack__()
        name = _api.PyCapsule_GetName(capsule)
        pointer = _api.PyCapsule_GetPointer(capsule, name)
        if versioned:
            m = DLManagedTensorVersioned.from_address(pointer)
            version = (m.version.major, m.version.minor)
        else:
            m, version = DLManagedTensor.from_address(pointer), None
        t = m.dl_tensor
        fields = {"name": name, "version": version, "data": t.data, "device": (t.device.device_type, t.device.device_id),
                  "dtype": (t.dtype.code, t.dtype.bits, t.dtype.lanes), "shape": tuple(t.shape[i] for i in range(t.ndim)),
                  "strides": tuple(t.strides[i] for i in range(t.ndim)), "values": np.from_dlpack(view).tolist()}
        # Consume it as a consumer does: rename, then call the deleter ourselves.
        _api.PyCapsule_SetName(capsule, b"used_" + name)
        m.deleter(pointer)
        return fields

    @staticmethod
    def refusals(view):
        out = []
        for kwargs in ({"copy": True}, {"dl_device": (2, 0)}):
            try:
                view.__dlpack__(**kwargs)
                out.append(None)
            except BufferError as e:
                out.append(str(e))
        return out

    # Mutations caught: a versioned capsule under the legacy name or layout (torch would misread
    # it), the version not set, wrong dtype codes, shape or strides, a data pointer other than the
    # view's, the wrong device.
    def test_capsules_describe_the_view(self):
        by_name = {c[0]: c for c in self.checks}
        self.assertEqual(sorted(by_name), ["m", "s"])
        _, view, versioned, legacy, _ = by_name["m"]
        self.assertEqual(versioned["name"], b"dltensor_versioned")
        self.assertEqual(versioned["version"], (1, 1))
        self.assertEqual(legacy["name"], b"dltensor")
        for fields in (versioned, legacy):
            self.assertEqual(fields["dtype"], (2, 32, 1))
            self.assertEqual(fields["shape"], (3, 4))
            self.assertEqual(fields["strides"], (4, 1))
            self.assertEqual(fields["device"], (1, 0))
            self.assertEqual(fields["data"], view.data_ptr)
            self.assertEqual(fields["values"], np.arange(12, dtype=np.float32).reshape(3, 4).tolist())
        _, _, scalar, _, _ = by_name["s"]
        self.assertEqual((scalar["dtype"], scalar["shape"], scalar["values"]), ((0, 32, 1), (), 7))

    # Mutation caught: copy=True or a foreign dl_device accepted (the consumer would get a view
    # where it asked for a copy, or device memory it cannot read).
    def test_refused_requests(self):
        for _, _, _, _, refusals in self.checks:
            self.assertIn("copy=True", refusals[0])
            self.assertIn("dl_device", refusals[1])


if __name__ == "__main__":
    unittest.main()
