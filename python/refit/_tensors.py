"""How refit reads your tensors and specs (part of the refit package; see refit/__init__.py):
DLPack exporters, DTensor splits, dtype names, and an FP8 engine's specs."""

from . import _refit
from ._refit import InvalidArgumentError


def _exportable(tensor):
    # torch refuses to export a tensor that requires grad; detach() shares its storage.
    if getattr(tensor, "requires_grad", False) and hasattr(tensor, "detach"):
        return tensor.detach()
    return tensor


def _shape(tensor):
    return tuple(int(d) for d in tensor.shape)


def _is_dtensor(tensor):
    return hasattr(tensor, "to_local") and hasattr(tensor, "placements") and hasattr(tensor, "device_mesh")


def _dtensor_split(name, tensor):
    """(full_shape, dim or None, index, count) of a DTensor on a 1-D mesh."""
    mesh = tensor.device_mesh
    if mesh.ndim != 1 or len(tensor.placements) != 1:
        raise InvalidArgumentError(f"tensor {name!r}: a DTensor on a {mesh.ndim}-D mesh; refit reads 1-D meshes "
                                   "(or give (name, local_tensor, full_shape, dim, index, count) entries)")
    placement = tensor.placements[0]
    if placement.is_replicate():
        dim = None
    elif placement.is_shard():
        dim = placement.dim
    else:
        raise InvalidArgumentError(f"tensor {name!r}: placement {placement} is neither Shard(d) nor Replicate()")
    return (_shape(tensor), dim, int(mesh.get_coordinate()[0]), int(mesh.size()))


def _dtype_name(dtype):
    """A torch name for a dtype given as a string, a torch dtype or a numpy dtype/type."""
    if isinstance(dtype, str):
        return dtype
    text = str(dtype)
    if text.startswith("torch."):
        return text
    try:
        import numpy
        return numpy.dtype(dtype).name
    except (ImportError, TypeError):
        return text


def _is_cuda(tensor):
    device = getattr(tensor, "__dlpack_device__", None)
    return device is not None and device()[0] == 2


def quantized_specs(specs, quantize):
    """An engine rank's [(name, dtype, shape)] as its trainers hold them (bf16 or fp32), as the
    FP8 engine holds them under quantize ("fp8-block128[:GLOB,...]"): each selected weight becomes
    its codes (name, "float8_e4m3fn", shape) followed by its scales (prefix + ".weight_scale_inv",
    "float32", [ceil(R/128), ceil(C/128)]); the rest as given."""
    entries = [(n, _dtype_name(d), tuple(int(x) for x in s)) for n, d, s in specs]
    return [(n, d, tuple(s)) for n, d, s in _refit.quantized_specs(entries, quantize)]
