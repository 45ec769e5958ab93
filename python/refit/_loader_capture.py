"""LoaderCapture: a server's weight loader at the speed of refit's copy mode
(part of the refit package; exported from refit.adapters; issue 21 item 5).

A server loads weights through its own loader, e.g. vLLM's and SGLang's
model.load_weights([(checkpoint_name, tensor), ...]), which maps each
checkpoint tensor to a parameter (or a slice of a fused qkv / gate_up /
stacked-expert parameter) and calls param.copy_(tensor). Called with every
tensor of every refit, that costs Python per tensor: measured 3.02x one
device copy for llama3-8b and 8.61x for qwen3-30b-a3b (9,435 tensors),
where refit's copy mode (one batched CUDA copy per dtype group) reaches 2.64x.

LoaderCapture calls the real loader once, watching it, and when all the
loader did was copy each incoming tensor whole into a piece of the model's
memory, it registers those pieces with the engine (Engine.set_targets) and
lets refit copy into them itself from the next refit on ("replay"):

  first refit   next(load_fn) calls the loader under a TorchDispatchMode
                that records every aten op: each aten::copy_ whose source is
                an incoming view (or a view of one) gives that tensor's
                destination. After the loader returns, while the views are
                still valid, the capture is checked (below).
  valid         set_targets([(name, destination)]) in the engine's spec
                order; mode "replay": later refits call engine.next()
                without load_fn. Before each, the model's layout (every
                parameter's and buffer's data_ptr, shape, stride and dtype,
                by name) is compared with the one recorded at capture; a
                difference (a parameter replaced or re-allocated) captures
                again (the loader runs under capture once more).
  not valid     mode "loader": the loader is called every refit, and the
                first tensor that failed and why is logged once (logger
                "refit.adapters", WARNING) and kept in `reason`.

A capture is valid when, for every tensor of the engine's stream:
  * the loader copied it exactly once, whole (the copy's source starts at
    the view, has all its elements, is C-contiguous, of its dtype),
  * into a destination of the same dtype and number of elements that is
    C-contiguous, on the same device, inside the memory of a parameter or
    buffer of `model` (a slice along dim 0 of a fused or stacked parameter is
    contiguous; a temporary is not the model's),
  * no other op read or wrote an incoming view (a cast, a transpose, a
    scale, a sum, .item(), ...; views of it such as narrow or reshape are
    fine), and no op other than these copies wrote into the model's memory,
  * no two destinations overlap,
  * after the loader returned, each destination's bytes equal its source's
    (torch.equal on uint8 views: catches writes the dispatch mode cannot see,
    e.g. a Triton kernel or a later in-place change), and
  * the model's layout (below) is the same after the refit as before it (a
    loader that swaps a parameter's storage leaves the copy in dead memory).
A loader that passes moved each tensor's bytes unchanged into one place of
the model, so copying the same bytes there is the same load.

What it cannot see: state the loader changes outside the model's parameters
and buffers, and model memory it writes without an aten op in a way that
leaves the copied bytes in place. After a capture the loader is not called
again until the layout changes: a server that must run something after every
load (vLLM's process_weights_after_loading for quantized layers) needs the
loader mode (LoaderCapture(..., enabled=False)).

Thread safety: one thread drives a LoaderCapture (the engine rank's).
"""

import bisect
import logging
import time

_logger = logging.getLogger("refit.adapters")

# aten ops that look at an incoming view's metadata (shape, dtype, device), never its bytes.
_METADATA_OPS = frozenset({
    "aten::is_same_size", "aten::sym_size", "aten::sym_numel", "aten::sym_stride", "aten::sym_storage_offset",
    "aten::size", "aten::stride", "aten::numel", "aten::dim", "aten::is_contiguous",
    "aten::is_non_overlapping_and_dense",
    "aten::empty_like", "aten::new_empty", "aten::new_empty_strided",
})


class LoaderCapture:
    """Drives one engine rank's refits through `loader`, replaying its copies
    with refit's copy mode once a capture proved them plain copies.

    engine:  a refit.Engine in staged mode built with (name, dtype, shape)
             specs (or tensors); its set_targets() takes the destinations.
    model:   the torch.nn.Module whose parameters and buffers the loader
             writes into (vLLM: worker.model_runner.model; SGLang: the model
             the custom weight loader receives).
    loader:  loader(pairs) with pairs = [(name, torch.Tensor)], the tensors
             valid only during the call (e.g. lambda pairs:
             model.load_weights(weights=pairs)); called under torch.no_grad().
    enabled: False calls the loader every refit (mode "loader", no capture).

    mode:    "capture" (the next refit runs the loader under capture: before
             the first refit, and after a layout change), "replay" or
             "loader". reason: why not "replay" ("" otherwise). history: the
             path each committed refit took, in order ("capture", "replay",
             "loader"). last_check_s: seconds the last layout check took.
    """

    def __init__(self, engine, model, loader, *, enabled=True):
        self._engine = engine
        self._model = model
        self._loader = loader
        self.mode = "capture" if enabled else "loader"
        self.reason = "" if enabled else "capture disabled (enabled=False)"
        self.history = []
        self.last_check_s = 0.0
        self._layout = None  # the model's layout when the targets were registered
        self._warned = False

    def next(self):
        """Takes part in one refit (Engine.next): returns its version once
        committed, or None when the job ended. A refit that fails raises as
        Engine.next does; the mode is kept (a failed capture is tried again)."""
        if self.mode == "replay":
            started = time.perf_counter()
            changed = _layout_difference(self._layout, _layout(self._model))
            self.last_check_s = time.perf_counter() - started
            if changed is None:
                version = self._engine.next()
                if version is not None:
                    self.history.append("replay")
                return version
            _logger.info("refit.adapters: the model's layout changed since the capture (%s); capturing the loader "
                         "again", changed)
            self.mode = "capture"
        if self.mode == "loader":
            version = self._engine.next(self._call_loader)
            if version is not None:
                self.history.append("loader")
            return version
        return self._capture_refit()

    def serve(self):
        """next() until the job ends; returns the last committed version."""
        version = None
        while True:
            got = self.next()
            if got is None:
                return version
            version = got

    def _call_loader(self, items):
        import torch
        pairs = [(name, torch.from_dlpack(view)) for name, view in items]
        with torch.no_grad():
            self._loader(pairs)

    def _capture_refit(self):
        import torch
        state = _Capture(self._model)
        layout = _layout(self._model)

        def load(items):
            pairs = [(name, torch.from_dlpack(view)) for name, view in items]
            if state.failure is not None:  # already refused: just load
                with torch.no_grad():
                    self._loader(pairs)
                return
            state.begin_batch(pairs)
            with torch.no_grad(), _recorder(state):
                self._loader(pairs)
            state.end_batch(pairs)  # the views are valid until load returns

        version = self._engine.next(load)
        if version is None:
            return None
        self.history.append("capture")
        moved = _layout_difference(layout, _layout(self._model))
        if state.failure is None and moved is not None:
            state.fail(None, f"the loader re-allocated the model's memory while loading ({moved})")
        if state.failure is None and self._engine.last_only:
            # A partial refit (Trainer.refit(only=...)) moved some tensors: not a capture of every one. The
            # loader ran as it is; the next refit captures again.
            self.history[-1] = "loader"
            return version
        if state.failure is None:
            state.finish(self._engine.specs)
        if state.failure is None:
            pairs = [(name, state.copies[name][0].detach()) for name, _, _ in self._engine.specs]
            try:
                self._engine.set_targets(pairs)
            except Exception as e:  # refit.Error: e.g. a destination refit cannot import
                state.failure = f"Engine.set_targets refused the destinations: {e}"
        if state.failure is None:
            self._layout = _layout(self._model)
            self.mode, self.reason = "replay", ""
        else:
            self.mode, self.reason = "loader", state.failure
            if not self._warned:
                self._warned = True
                _logger.warning("refit.adapters: the weight loader cannot be replayed as copies, so it runs every "
                                "refit: %s", state.failure)
        return version


# ---------------------------------------------------------------- the capture


class _Spans:
    """Disjoint byte ranges [lo, hi) with a key each, sorted: which one a tensor touches."""

    def __init__(self, spans):
        self.spans = sorted(spans)
        self.starts = [s[0] for s in self.spans]

    def overlapping(self, lo, hi):
        """The first span that overlaps [lo, hi), or None."""
        if hi <= lo:
            return None
        i = bisect.bisect_right(self.starts, lo) - 1
        if i >= 0 and self.spans[i][1] > lo:
            return self.spans[i]
        if i + 1 < len(self.spans) and self.spans[i + 1][0] < hi:
            return self.spans[i + 1]
        return None

    def containing(self, lo, hi):
        """The span that holds all of [lo, hi), or None."""
        i = bisect.bisect_right(self.starts, lo) - 1
        if i >= 0 and self.spans[i][1] >= hi:
            return self.spans[i]
        return None


def _span(t):
    """[lo, hi) of the bytes a strided tensor can touch; (0, 0) when it has none."""
    if t.numel() == 0:
        return 0, 0
    extent = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    lo = t.data_ptr()
    return lo, lo + extent * t.element_size()


def _holders(model):
    """[(name, tensor)] of the model's parameters and buffers (with memory)."""
    out = [(name, p) for name, p in model.named_parameters()]
    out += [(name, b) for name, b in model.named_buffers() if b is not None]
    return out


def _layout(model):
    """What must not change for the registered destinations to stay the model's."""
    return [(name, t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype, t.device) for name, t in _holders(model)]


def _layout_difference(before, after):
    """None when equal, else a few words naming the first difference."""
    if before == after:
        return None
    old = {entry[0]: entry for entry in before}
    new = {entry[0]: entry for entry in after}
    for name in old:
        if name not in new:
            return f"'{name}' is gone"
        if old[name] != new[name]:
            return f"'{name}' moved or changed shape"
    for name in new:
        if name not in old:
            return f"'{name}' is new"
    return "the order of the parameters changed"


def _model_memory(model):
    """_Spans of the union of the model's parameter and buffer memory."""
    ranges = sorted(_span(t) + (name,) for name, t in _holders(model))
    merged = []
    for lo, hi, name in ranges:
        if hi <= lo:
            continue
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi), merged[-1][2])
        else:
            merged.append((lo, hi, name))
    return _Spans(merged)


def _holder_name(model, lo, hi):
    """The parameter or buffer whose memory holds [lo, hi) (for messages)."""
    best = None
    for name, t in _holders(model):
        a, b = _span(t)
        if a <= lo and hi <= b and (best is None or b - a < best[1]):
            best = (name, b - a)
    return best[0] if best else "memory of the model"


def _tensors(value):
    import torch
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


def _is_view_op(schema):
    """An op that only makes aliases: every result aliases an input, nothing is written."""
    if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return False
    return len(schema.returns) > 0 and all(r.alias_info is not None and not r.alias_info.is_write
                                           for r in schema.returns)


class _Capture:
    """What the loader did during one refit; `failure` is the first reason it
    cannot be replayed ("'name': why"), None while it still can."""

    def __init__(self, model):
        self.model = model
        self.memory = _model_memory(model)
        self.copies = {}       # name -> (destination, source dtype)
        self.failure = None
        self.incoming = _Spans([])
        self.batch = {}        # name -> incoming tensor, this batch

    def fail(self, name, why):
        if self.failure is None:
            self.failure = f"'{name}' {why}" if name else why

    def begin_batch(self, pairs):
        spans = []
        for name, t in pairs:
            if t.numel() == 0:
                self.fail(name, "has no elements (a capture follows bytes)")
                continue
            lo, hi = _span(t)
            spans.append((lo, hi, name))
        self.incoming = _Spans(spans)
        self.batch = dict(pairs)

    def observe(self, func, args, kwargs):
        """Called for every aten op the loader runs, before it runs."""
        schema = func._schema
        op = schema.name + ("." + schema.overload_name if schema.overload_name else "")
        if schema.name == "aten::copy_" and schema.overload_name == "":
            dst = args[0]
            src = args[1] if len(args) > 1 else kwargs.get("src")
            hit = self.incoming.overlapping(*_span(src))
            if hit is not None:
                self.copy(hit[2], src, dst)
                return
        view = _is_view_op(schema)
        for position, arg in enumerate(schema.arguments):
            if position < len(args) and not arg.kwarg_only:
                value = args[position]
            elif arg.name in kwargs:
                value = kwargs[arg.name]
            else:
                continue
            written = arg.alias_info is not None and arg.alias_info.is_write
            for t in _tensors(value):
                lo, hi = _span(t)
                hit = self.incoming.overlapping(lo, hi)
                if hit is not None:
                    if written:
                        self.fail(hit[2], f"is written by {op} (the loader changes the incoming tensor)")
                    elif not view and schema.name not in _METADATA_OPS:
                        self.fail(hit[2], f"is read by {op}: the loader computes from it (a cast, a transpose made "
                                          "contiguous, a scale, a sum, .item(), ...), not a plain copy")
                if written and self.memory.overlapping(lo, hi) is not None:
                    self.fail(None, f"{op} writes into '{_holder_name(self.model, lo, hi)}' with something other "
                                    "than a whole incoming tensor")

    def copy(self, name, src, dst):
        incoming = self.batch[name]
        if name in self.copies:
            self.fail(name, "is copied twice (into two destinations)")
        elif src.dtype != incoming.dtype:
            self.fail(name, f"is reinterpreted as {src.dtype} before the copy")
        elif src.data_ptr() != incoming.data_ptr() or src.numel() != incoming.numel():
            self.fail(name, f"is copied in part ({src.numel()} of its {incoming.numel()} elements, e.g. a "
                            "tensor-parallel shard), not whole")
        elif not src.is_contiguous():
            self.fail(name, f"is copied as a transposed or strided view (shape {tuple(src.shape)}, stride "
                            f"{tuple(src.stride())})")
        elif dst.dtype != src.dtype:
            self.fail(name, f"is cast from {src.dtype} to {dst.dtype} by the copy")
        elif dst.numel() != src.numel():
            self.fail(name, f"is broadcast into {dst.numel()} elements")
        elif not dst.is_contiguous():
            self.fail(name, f"is copied into a destination that is not C-contiguous (shape {tuple(dst.shape)}, "
                            f"stride {tuple(dst.stride())})")
        elif dst.device != src.device:
            self.fail(name, f"is copied to {dst.device}, not to the engine's {src.device}")
        elif self.incoming.overlapping(*_span(dst)) is not None:
            self.fail(name, "is copied into another incoming tensor")
        else:
            self.copies[name] = (dst, src.dtype)

    def end_batch(self, pairs):
        """After the loader returned (the views still valid): each tensor landed, whole, in the model."""
        import torch
        for name, t in pairs:
            if self.failure is not None:
                return
            if name not in self.copies:
                self.fail(name, "is not copied by the loader (skipped, or written by an op the capture cannot see)")
                return
            dst = self.copies[name][0]
            lo, hi = _span(dst)
            if self.memory.containing(lo, hi) is None:
                self.fail(name, "is copied into memory that is not a parameter or buffer of the model (a temporary)")
            elif not torch.equal(dst.reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)):
                self.fail(name, "does not match its destination's bytes after the loader returned (changed after the "
                                "copy, or written by something the capture cannot see)")

    def finish(self, specs):
        """After the refit: every stream tensor has a destination; no two destinations overlap."""
        for name, _, _ in specs:
            if name not in self.copies:
                self.fail(name, "never reached the loader")
                return
        spans = sorted(_span(dst) + (name,) for name, (dst, _) in self.copies.items())
        for (lo_a, hi_a, a), (lo_b, hi_b, b) in zip(spans, spans[1:]):
            if lo_b < hi_a:
                self.fail(b, f"is copied into memory that overlaps the destination of '{a}'")
                return


def _recorder(state):
    """A TorchDispatchMode that shows every aten op the loader runs to state.observe."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if state.failure is None:
                try:
                    state.observe(func, args, kwargs)
                except Exception as e:  # never let the bookkeeping break the load: refuse the capture instead
                    state.fail(None, f"the capture could not follow {func}: {type(e).__name__}: {e}")
            return func(*args, **kwargs)

    return _Recorder()
