"""refit.adapters: refit engine ranks inside vLLM and SGLang, through the hooks
they document for weight updates (issue 21 items 4 and 5).

    VllmWorkerExtension   a mixin for vLLM's worker_extension_cls: the driver
                          calls its methods on every worker through
                          llm.collective_rpc("refit_join" | "refit_next" |
                          "refit_status" | "refit_close", args=..., kwargs=...)
    sglang_load_weights   a function of SGLang's custom weight loader shape
                          fn(model, named_tensors); registered at launch
                          (custom_weight_loader=[SGLANG_LOADER]) it runs a
                          refit engine rank inside each TP scheduler process
    SglangRefit           the driver side of it: join(), next(), close()
                          through engine.update_weights_from_tensor(...)
    LoaderCapture         (refit/_loader_capture.py) the server's loader at
                          the speed of refit's copy mode; both adapters use it

Each engine rank is a refit.Engine (staged mode) whose (name, dtype, shape)
specs are the trainers' names: Hugging Face checkpoint names, the names the
servers' load_weights take. Each aligned batch goes to the server's own
loader as [(name, torch tensor)] pairs; LoaderCapture watches the first refit
and, when the loader only copied each tensor whole into the model, replays
those copies with refit's copy mode afterwards (see its docstring; `mode`
says which path runs, `reason` why not replay).

Tensor parallelism: vLLM's and SGLang's load_weights take FULL checkpoint
tensors and cut each TP rank's part themselves. So give every engine rank the
full specs and register the trainers with rules="replicated" when an engine
has more than one TP rank; the loader's copies are then partial and the
capture keeps calling the loader ("is copied in part"). At TP 1 any rules
work and the copies replay.

The hook shapes this module builds on (read in the repositories' sources
through the code index; no code copied):

vLLM (vllm-project/vllm)
  vllm/v1/worker/worker_base.py @ 0243225317f5e0a05eb29485ac0810644409eedf,
    WorkerWrapperBase.init_worker(self, all_kwargs): resolves
    parallel_config.worker_extension_cls (a dotted name every worker process
    imports) with resolve_obj_by_qualname; for each non-dunder attribute of
    the extension asserts `not hasattr(worker_class, attr)`; then
    `worker_class.__bases__ = worker_class.__bases__ + (worker_extension_cls,)`
    and builds the worker. The extension has no __init__ of its own that runs;
    its methods see the worker: self.model_runner.model, self.device,
    self.rank (global rank), self.local_rank (WorkerBase.__init__).
  vllm/entrypoints/llm.py @ 0012cf691b7e69423244d2b1405f4b6832156e19:
    LLM.collective_rpc(self, method: Union[str, Callable[..., _R]], timeout:
    Optional[float] = None, args: tuple = (), kwargs: Optional[dict[str,
    Any]] = None) -> list[_R] ("A list containing the results from each
    worker"; newer trees spell the same `str | Callable[..., _R]`,
    `float | None`): each worker runs getattr(worker, method)(*args,
    **kwargs); arguments cross processes as plain data ("only pass control
    messages, and set up data-plane communication to pass data").
  vllm/model_executor/models/llama.py @ e06c9ba2a6ea923a84add30f5dafaea126429b81:
    load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str];
    stacked_params_mapping (".qkv_proj", ".q_proj", "q") ... (".gate_up_proj",
    ".up_proj", 1); `param.weight_loader(param, loaded_weight, shard_id)`,
    else getattr(param, "weight_loader", default_weight_loader)(param, w).
  vllm/model_executor/layers/fused_moe/layer.py:
    FusedMoE.make_expert_params_mapping(ckpt_gate_proj_name,
    ckpt_down_proj_name, ckpt_up_proj_name, num_experts) ->
    [("experts.w13_" | "experts.w2_", f"experts.{expert_id}.{weight_name}.",
    expert_id, "w1" | "w2" | "w3")]: gate (w1) and up (w3) rows of
    w13_weight [E, 2I, H], down (w2) into w2_weight [E, H, I].
  examples/offline_inference/rlhf_utils.py @ 081b8e32277e01f1f759601c714f808b5e9676b2:
    WorkerExtension.update_weight(self, name, dtype_name, shape) ->
    self.model_runner.model.load_weights(weights=[(name, weight)]).
SGLang (sgl-project/sglang)
  python/sglang/srt/model_executor/model_runner.py @ 01cc04e2b5b01ce379698a3fee1bd17706e1d0ec:
    ModelRunner.update_weights_from_tensor(self, named_tensors:
    List[Tuple[str, Union[torch.Tensor, "LocalSerializedTensor"]]],
    load_format: Optional[str] = None): unwraps each tensor onto the current
    device, then `elif load_format in self.server_args.custom_weight_loader:
    custom_loader = dynamic_import(load_format); custom_loader(self.model,
    named_tensors)`, `elif load_format is None: self.model.load_weights(
    named_tensors)`; returns (True, "Success"). It runs in every TP
    scheduler process; the loader's return value is ignored, an exception
    fails the request.
  python/sglang/srt/entrypoints/engine.py:
    Engine.update_weights_from_tensor(self, named_tensors: List[Tuple[str,
    torch.Tensor]], load_format: Optional[str] = None, flush_cache: bool =
    True): serializes the pairs once per TP rank and waits for the
    tokenizer manager, which returns (success, message); the scheduler
    flushes the KV cache after a successful update when flush_cache.
  python/sglang/srt/server_args.py: custom_weight_loader:
    Optional[List[str]] = None (dotted paths of loaders allowed as
    load_format; `--custom-weight-loader` on the command line).

Caches: vLLM has no weight version; after collective_rpc("refit_next")
returns, the driver flushes what depends on the weights
(llm.reset_prefix_cache(); DESIGN.md rule 9). SGLang flushes its cache itself
after SglangRefit.next() (flush_cache=True).
"""

import importlib
import json

from ._loader_capture import LoaderCapture

__all__ = ["LoaderCapture", "SGLANG_LOADER", "SglangEngineRank", "SglangRefit", "VllmWorkerExtension",
           "sglang_load_weights", "sglang_rank"]


def _plain_specs(specs):
    """[(name, dtype, shape)] as plain data (lists from msgpack or JSON are fine;
    dtypes as strings, "bfloat16" or "torch.bfloat16", or torch dtypes)."""
    return [(str(name), str(dtype), tuple(int(d) for d in shape)) for name, dtype, shape in specs]


def _join_engine(coordinator, rank, specs, engine_options):
    """A refit.Engine for this engine rank on the current CUDA device (staged mode)."""
    import torch
    import refit
    options = dict(engine_options)
    options.setdefault("device", "cuda")
    if options["device"] == "cuda":
        options.setdefault("gpu", torch.cuda.current_device())
    return refit.Engine(coordinator, _plain_specs(specs), rank=rank, **options)


def _status(capture, engine):
    return {"mode": capture.mode, "reason": capture.reason, "history": list(capture.history),
            "weight_version": engine.weight_version, "last_check_s": capture.last_check_s}


# ---------------------------------------------------------------- vLLM


class VllmWorkerExtension:
    """vLLM worker extension: LLM(..., worker_extension_cls=
    "refit.adapters.VllmWorkerExtension"), then from the driver:

        llm.collective_rpc("refit_join", args=(coordinator_address, None, specs),
                           kwargs={"transport": "cuda_ipc"})
        while llm.collective_rpc("refit_next")[0] is not None:   # one refit each
            llm.reset_prefix_cache()                              # rule 9
        llm.collective_rpc("refit_close")

    with the trainers calling Trainer.refit(v) meanwhile. Every method runs on
    every worker; names start with refit_ (vLLM refuses an extension whose
    attribute the worker class already has). Arguments are plain data.
    """

    def refit_join(self, coordinator, rank=None, specs=(), capture=True, **engine_options):
        """Joins the refit job at `coordinator` (host:port) as engine rank
        `rank` (None: this worker's rank, self.rank), with `specs`
        [(name, dtype, shape)] of the checkpoint tensors this rank loads, in
        the trainers' order. capture=False calls load_weights every refit (no
        replay). engine_options go to refit.Engine (transport, bucket_size,
        trainer_ranks, engine_ranks, setup_timeout, ...; device "cuda" and
        gpu the worker's current device unless given). Returns {"rank",
        "tensors", "device"}. Blocks until the job is set up (the trainers
        join meanwhile)."""
        if getattr(self, "_refit_adapter_state", None) is not None:
            raise RuntimeError("refit_join: this worker already joined a refit job (refit_close first)")
        if rank is None:
            rank = int(getattr(self, "rank", 0))
        model = self.model_runner.model
        engine = _join_engine(coordinator, rank, specs, engine_options)
        capture = LoaderCapture(engine, model, lambda pairs: model.load_weights(weights=pairs), enabled=capture)
        self._refit_adapter_state = (engine, capture)
        return {"rank": rank, "tensors": len(specs), "device": engine.device}

    def refit_next(self):
        """Takes part in one refit: its version once committed, None when the job ended."""
        return self._refit_adapter_joined()[1].next()

    def refit_status(self):
        """{"mode", "reason", "history", "weight_version", "last_check_s"} (LoaderCapture's)."""
        engine, capture = self._refit_adapter_joined()
        return _status(capture, engine)

    def refit_close(self):
        """Leaves the job (after it ended, or to give up); refit_join may follow."""
        state = getattr(self, "_refit_adapter_state", None)
        self._refit_adapter_state = None
        if state is not None:
            state[0].close()

    def _refit_adapter_joined(self):
        state = getattr(self, "_refit_adapter_state", None)
        if state is None:
            raise RuntimeError("this worker has not joined a refit job (collective_rpc('refit_join', ...) first)")
        return state


# ---------------------------------------------------------------- SGLang

SGLANG_LOADER = "refit.adapters.sglang_load_weights"  # for custom_weight_loader=[...] and load_format=
_CONTROL = "refit.adapters:"  # a control message: one pair whose name is this prefix + JSON
_SGLANG_RANKS = {}  # id(model) -> SglangEngineRank, in each scheduler process


def _sglang_model_load(model, named_tensors):
    """SGLang's default path (load_format=None): the model's own loader."""
    model.load_weights(named_tensors)


def _sglang_tp_rank():
    """This scheduler process's TP rank (SGLang's parallel state, else torch.distributed, else 0)."""
    for module in ("sglang.srt.distributed", "sglang.srt.distributed.parallel_state"):
        try:
            return int(importlib.import_module(module).get_tensor_model_parallel_rank())
        except Exception:  # not SGLang, or its groups not set up
            pass
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except ImportError:
        pass
    return 0


def _import(dotted):
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


class SglangEngineRank:
    """One refit engine rank inside an SGLang scheduler process (made by
    sglang_load_weights on a "join" message). Each aligned batch goes to
    loader(model, pairs) (SGLang's custom-loader shape; default
    model.load_weights(pairs), SGLang's load_format=None path) under
    LoaderCapture. version: the last committed refit; ended: the job ended."""

    def __init__(self, model, coordinator, specs, rank=None, capture=True, loader=None, **engine_options):
        if rank is None:
            rank = _sglang_tp_rank()
        if isinstance(loader, str):
            loader = _import(loader)
        loader = loader or _sglang_model_load
        self.model = model
        self.rank = rank
        self.engine = _join_engine(coordinator, rank, specs, engine_options)
        self.capture = LoaderCapture(self.engine, model, lambda pairs: loader(model, pairs), enabled=capture)
        self.version = None
        self.ended = False

    def next(self):
        """One refit: its version, or None when the job ended (the engine then closes)."""
        if self.ended:
            return None
        version = self.capture.next()
        if version is None:
            self.ended = True
            self.engine.close()
        else:
            self.version = version
        return version

    def status(self):
        return dict(_status(self.capture, self.engine), ended=self.ended)

    def close(self):
        self.engine.close()


def _control(named_tensors):
    """The control message in named_tensors, or None when it carries weights."""
    if len(named_tensors) == 1 and isinstance(named_tensors[0][0], str) and named_tensors[0][0].startswith(_CONTROL):
        return json.loads(named_tensors[0][0][len(_CONTROL):])
    return None


def sglang_load_weights(model, named_tensors):
    """SGLang custom weight loader (fn(model, named_tensors)); register it at
    launch with custom_weight_loader=[refit.adapters.SGLANG_LOADER] and drive
    it with SglangRefit. A control message from SglangRefit joins, runs one
    refit, or closes this scheduler process's refit engine rank; anything
    else is loaded as SGLang's default path does (model.load_weights)."""
    message = _control(named_tensors)
    if message is None:
        _sglang_model_load(model, named_tensors)
        return
    op = message.pop("op")
    key = id(model)
    if op == "join":
        if key in _SGLANG_RANKS:
            raise RuntimeError("refit.adapters: this SGLang model already joined a refit job (close first)")
        _SGLANG_RANKS[key] = SglangEngineRank(model, **message)
    elif op == "next":
        rank = _SGLANG_RANKS.get(key)
        if rank is None:
            raise RuntimeError("refit.adapters: 'next' before 'join' (SglangRefit.join first)")
        rank.next()
    elif op == "close":
        rank = _SGLANG_RANKS.pop(key, None)
        if rank is not None:
            rank.close()
    else:
        raise ValueError(f"refit.adapters: unknown control message {op!r}")


def sglang_rank(model):
    """The SglangEngineRank this process runs for `model` (None before join
    and after close): its status(), version, ended. In-process only (the
    scheduler's), for tests and logs."""
    return _SGLANG_RANKS.get(id(model))


def _outcome(result):
    """(success, message) of an update_weights_from_tensor result."""
    if isinstance(result, tuple) and len(result) >= 2:
        return bool(result[0]), str(result[1])
    if isinstance(result, dict):
        return bool(result.get("success", True)), str(result.get("message", ""))
    return True, ""


class SglangRefit:
    """The driver side: sends control messages to sglang_load_weights in every
    TP scheduler through engine.update_weights_from_tensor(named_tensors,
    load_format, flush_cache). `engine` is an sglang.Engine launched with
    custom_weight_loader=[load_format]. The bytes never cross this call: each
    scheduler's refit engine rank receives them from the trainers.

        sgl = SglangRefit(engine)
        sgl.join(coordinator_address, specs, transport="cuda_ipc")
        for step in ...:
            sgl.next()       # one refit (the trainers call refit(v) meanwhile); SGLang flushes its cache
        sgl.next()           # after the trainers finished: sees the job end
        sgl.close()
    """

    def __init__(self, engine, load_format=SGLANG_LOADER):
        self.engine = engine
        self.load_format = load_format

    def join(self, coordinator, specs, *, rank=None, capture=True, loader=None, **engine_options):
        """Every TP rank joins the job at `coordinator` as engine rank `rank`
        (None: its TP rank) with `specs` [(name, dtype, shape)] (the
        checkpoint tensors, full; see the module's note on TP). loader: the
        dotted name of a fn(model, named_tensors) to load each batch with
        (default the model's load_weights). engine_options: plain data for
        refit.Engine. Blocks until the job is set up."""
        self._send("join", flush_cache=False, coordinator=str(coordinator),
                   specs=[[n, str(d), [int(x) for x in s]] for n, d, s in _plain_specs(specs)],
                   rank=rank, capture=bool(capture), loader=loader, **engine_options)

    def next(self, flush_cache=True):
        """Every TP rank takes part in one refit (or sees the job end)."""
        self._send("next", flush_cache=flush_cache)

    def close(self):
        self._send("close", flush_cache=False)

    def _send(self, op, flush_cache, **fields):
        import torch
        name = _CONTROL + json.dumps(dict(op=op, **fields))
        result = self.engine.update_weights_from_tensor(named_tensors=[(name, torch.zeros(1, dtype=torch.uint8))],
                                                        load_format=self.load_format, flush_cache=flush_cache)
        ok, message = _outcome(result)
        if not ok:
            raise RuntimeError(f"refit.adapters: SGLang's update_weights_from_tensor failed for '{op}': {message}")
        return result
