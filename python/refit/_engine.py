"""refit.Engine: one engine rank hosted by this Python process (see the
package docstring and README "Python")."""

from . import _refit
from ._options import _rank_options, _set, _slot_count, parse_bytes
from ._refit import InvalidArgumentError
from ._tensors import _dtype_name, _exportable, _is_cuda, quantized_specs


class Engine:
    """An engine rank hosted by this process.

    params: this rank's shards, in the model's order (the order the trainers
        registered the full tensors in), as
        [(name, dtype, shape), ...]   specs: next(load_fn) is the only way in
        {name: tensor} or [(name, tensor), ...]
                                      staged: next() copies into these tensors
                                      (or next(load_fn) hands you the views);
                                      direct: their values seed refit's arena
    mode="staged": trainers write into a rotating receive pool; next(load_fn)
        calls load_fn(items) once per dtype group of each aligned batch, items
        being [(name, TensorView)] of this rank's payload. The views point into
        the staging slot and are valid ONLY during that call: copy from them
        (param.copy_(torch.from_dlpack(view))), never keep them. On a CUDA
        device refit waits for the device after load_fn returns, so copies you
        queued have finished before the slot is reused.
    mode="direct" (cuda_ipc): the trainers write into a weight arena refit owns;
        weights() gives {name: TensorView} of it: adopt them (param.data =
        torch.from_dlpack(view)) and the next refit lands in your parameters.
        Don't read the weights while next() runs.
    device: "cpu" or "cuda" (default: where the tensors are, else "cpu"); gpu:
        the local CUDA index (default: base_gpu_id + rank, DESIGN.md rule 7).
    on_commit: on_commit(version) is called exactly once per committed refit,
        after its last batch and before next() returns the version: flush the
        caches that depend on the weights there (KV cache, DESIGN.md rule 9).
        A failed refit calls it not at all. An exception it raises comes out of
        next(); the version stays committed.
    heartbeat_interval, heartbeat_timeout: as Trainer's (defaults 1 and 10
        seconds): a coordinator silent for heartbeat_timeout ends next(),
        also while it waits for the next refit to start, with
        UnavailableError "lost the coordinator: ...".
    shadow: shadow weights ((name, dtype, shape) specs; staged or direct
        mode): refit holds two arenas of this rank's weights
        (weight_memory_bytes: twice the weights); each refit lands in the one
        not served (in direct mode the trainers write it), and a failed refit leaves the served one whole
        (weights_complete stays True). Serve from weights(): after each
        commit, on_flip(version) runs with weights() already the new
        arena's views and weight_version already `version`; adopt them there
        (e.g. param.data = torch.from_dlpack(view) under the lock your
        forward pass holds, then drop caches built from older weights). The
        arena served before is written again only when you call next() once
        more, so a forward pass still on it finishes safely if next() runs
        after it (call next() from the thread that does the flip, or wait
        for in-flight passes first).
    on_flip: on_flip(version), shadow weights only (see shadow); on_commit,
        when given too, runs after it.
    quantize: with (name, dtype, shape) specs of the bf16 (or fp32) weights
        the trainers hold, the engine holds them as the trainers' quantize
        makes them (see Trainer; refit.quantized_specs): each selected
        weight becomes (name, "float8_e4m3fn", shape) and (name +
        "_scale_inv", "float32", blocks), and load_fn receives those views.
        Default: as declared.
    """

    def __init__(self, coordinator, params, *, rank=None, trainer_ranks=None, engine_ranks=None, bucket_size=None,
                 transport=None, mode=None, device=None, gpu=None, base_gpu_id=None, pool_slots=None,
                 memory_limit=None, listen_host=None, poison_recycled=None, supported_dtypes=None,
                 setup_timeout=None, refit_timeout=None, bucket_timeout=None, heartbeat_interval=None,
                 heartbeat_timeout=None, secret=None, on_commit=None, quantize=None, shadow=False, on_flip=None,
                 engine=None):
        entries = self._entries(params)
        if quantize not in (None, "none"):
            if any(len(e) != 3 for e in entries):
                raise InvalidArgumentError("quantize: declare the weights as (name, dtype, shape) specs; "
                                           "refit then holds the codes and scales for you")
            entries = quantized_specs(entries, quantize)
        if device is None:
            device = "cuda" if entries and len(entries[0]) == 2 and _is_cuda(entries[0][1]) else "cpu"
        options = _rank_options(_refit.EngineOptions(), coordinator, rank, trainer_ranks, engine_ranks, bucket_size,
                                transport, mode, device, gpu, setup_timeout, refit_timeout, bucket_timeout, secret,
                                heartbeat_interval=heartbeat_interval, heartbeat_timeout=heartbeat_timeout)
        _set(options, "base_gpu_id", base_gpu_id)
        _set(options, "pool_slots", pool_slots, _slot_count)
        _set(options, "memory_limit", memory_limit, parse_bytes)
        _set(options, "listen_host", listen_host)
        _set(options, "poison_recycled", poison_recycled)
        options.supported_dtypes = [_dtype_name(d) for d in (supported_dtypes or [])]
        options.shadow = bool(shadow)
        _set(options, "engine", engine)
        self._impl = _refit.Engine(options, entries, on_commit, on_flip)

    @staticmethod
    def _entries(params):
        items = list(params.items()) if isinstance(params, dict) else list(params)
        entries = []
        for item in items:
            if len(item) == 3:
                entries.append((item[0], _dtype_name(item[1]), tuple(int(d) for d in item[2])))
            elif len(item) == 2:
                entries.append((item[0], _exportable(item[1])))
            else:
                raise InvalidArgumentError(f"param {item[:1]!r}: expected (name, dtype, shape) or (name, tensor)")
        return entries

    def next(self, load_fn=None, convert=None):
        """Takes part in one refit: returns its version once committed, or None
        when the job ended. load_fn(items) is called per dtype group (staged
        mode); convert (e.g. torch.from_dlpack) is applied to each view first.
        Raises a refit.Error when the refit failed (the weights are then
        incomplete until the next refit commits; weights_complete says so); an
        exception raised by load_fn fails the refit and becomes its __cause__."""
        if load_fn is not None and convert is not None:
            user_fn = load_fn

            def load_fn(items):  # noqa: F811 - the converting wrapper
                user_fn([(name, convert(view)) for name, view in items])

        return self._impl.next(load_fn)

    def serve(self, load_fn=None, convert=None):
        """next() until the job ends; returns the last committed version."""
        version = None
        while True:
            got = self.next(load_fn, convert)
            if got is None:
                return version
            version = got

    def set_targets(self, pairs):
        """Staged mode: copy mode from now on. pairs [(name, tensor)] give one
        C-contiguous tensor for every tensor of `specs` (same dtype and number
        of bytes, on this engine's device; e.g. a slice along dim 0 of a fused
        parameter); next() without load_fn then copies each incoming tensor
        into its target (on a device one batched copy per dtype group).
        Replaces the tensors registered before; refit keeps them alive until
        the next set_targets or close. refit.adapters' LoaderCapture finds
        these targets by watching a server's loader once."""
        self._impl.set_targets([(name, _exportable(tensor)) for name, tensor in
                                (pairs.items() if isinstance(pairs, dict) else pairs)])

    def weights(self, convert=None):
        """Direct mode and shadow weights: {name: view of the weight in
        refit's (served) arena} (or convert(view)). The arena lives as long
        as any tensor made from it."""
        views = self._impl.weights()
        return views if convert is None else {name: convert(view) for name, view in views.items()}

    def close(self):
        self._impl.close()

    @property
    def weight_version(self):
        """The last committed version (0 before the first refit)."""
        return self._impl.weight_version

    @property
    def weights_complete(self):
        """False after a failed refit, until the next one commits (with
        shadow weights always True: the served arena is never written)."""
        return self._impl.weights_complete

    @property
    def shadow(self):
        """True with shadow weights."""
        return self._impl.shadow

    @property
    def last_only(self):
        """The globs of the last committed refit when it was partial (only the
        tensors they select changed: invalidate what was built from those);
        () when it moved every tensor."""
        return self._impl.last_only

    @property
    def weight_memory_bytes(self):
        """With shadow weights, the bytes of both arenas (else 0)."""
        return self._impl.weight_memory_bytes

    @property
    def posts(self):
        """Dtype groups applied so far (one load_fn call or copy launch each)."""
        return self._impl.posts

    @property
    def cache_flushes(self):
        """on_commit calls made so far (one per committed refit; 0 without on_commit)."""
        return self._impl.cache_flushes

    @property
    def specs(self):
        """[(name, dtype, shape)] of this rank's stream."""
        return self._impl.specs

    @property
    def device(self):
        return self._impl.device

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
