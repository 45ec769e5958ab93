"""Options shared by refit's Python roles: byte sizes, and the C++ options
structs filled from keyword arguments (None keeps the C++ default)."""

from ._refit import InvalidArgumentError

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_bytes(size):
    """An int, or a string like "4MiB", "1GiB", "64MB", "4096", as bytes."""
    if isinstance(size, int):
        return size
    text = str(size).strip()
    digits = text.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    unit = text[len(digits):].strip().lower()
    if not digits.strip().isdigit() or unit not in _UNITS:
        raise InvalidArgumentError(f"size {size!r} is not a byte count like 4096, '4MiB', '1GiB' or '64MB'")
    return int(digits) * _UNITS[unit]


def _bucket_bytes(size):
    """A bucket size: "auto" (0: 1 GiB over cuda_ipc and nccl, 64 MiB over shm,
    tcp and ucx, resolved by each rank), else parse_bytes(size)."""
    return 0 if size == "auto" else parse_bytes(size)


def _slot_count(slots):
    """A pool slot count: "auto" (0: 3, or 2 where memory_limit holds fewer),
    else the int."""
    return 0 if slots == "auto" else slots


def _address(coordinator):
    """A Coordinator's address, or the "host:port" given."""
    return coordinator.address if hasattr(coordinator, "address") else str(coordinator)


def _set(options, field, value, convert=None):
    """Sets options.<field> to value, unless value is None: None keeps the
    field's default, which the C++ options struct (RankOptions, EngineOptions,
    CoordinatorOptions) defines, the same one the `refit` command uses."""
    if value is not None:
        setattr(options, field, convert(value) if convert else value)


def _rank_options(options, coordinator, rank, trainer_ranks, engine_ranks, bucket_size, transport, mode, device,
                  gpu, setup_timeout, refit_timeout, bucket_timeout, secret, *, heartbeat_interval=None,
                  heartbeat_timeout=None):
    options.coordinator = _address(coordinator)
    _set(options, "rank", rank)
    _set(options, "trainer_ranks", trainer_ranks)
    _set(options, "engine_ranks", engine_ranks)
    _set(options, "bucket_size", bucket_size, _bucket_bytes)
    _set(options, "transport", transport)
    _set(options, "mode", mode)
    _set(options, "device", device)
    options.gpu = -1 if gpu is None else gpu
    _set(options, "setup_timeout_s", setup_timeout, float)
    _set(options, "refit_timeout_s", refit_timeout, float)
    _set(options, "bucket_timeout_s", bucket_timeout, float)
    _set(options, "heartbeat_interval_s", heartbeat_interval, float)
    _set(options, "heartbeat_timeout_s", heartbeat_timeout, float)
    options.secret = secret or ""
    return options
