"""refit: move model weights from trainer processes into inference engines.

A refit job has one coordinator, trainer ranks and engine ranks (README,
docs/DESIGN.md). This package runs any of them inside a Python process:

    Coordinator   the control plane, on a background thread of this process
    Trainer       a trainer rank whose weights are your tensors (registered once,
                  updated in place, e.g. by an optimizer step); refit(version)
    Engine        an engine rank: next(load_fn) hands each aligned batch to your
                  loader (staged mode), or the trainers write straight into a
                  weight arena whose tensors you adopt (direct mode)

Tensors cross the boundary through DLPack: numpy arrays, torch and cupy
tensors go in; refit.TensorView objects come out, which torch.from_dlpack,
numpy.from_dlpack and cupy.from_dlpack map without a copy. No transfer copies
through Python objects, and the GIL is released while bytes move.

Errors are refit.Error subclasses (InvalidArgumentError, FailedPreconditionError,
AbortedError, DeadlineExceededError, ...), each with the C++ message.

refit's own messages (warnings, notices, progress) go to Python's logging, to
the logger "refit", from the moment the package is imported; see
set_log_handler to send them elsewhere.
"""

import atexit
import dataclasses
import logging
from typing import NamedTuple

from . import _refit
from ._engine import Engine
from ._options import _rank_options, _set, parse_bytes
from ._tensors import _dtensor_split, _exportable, _is_dtensor, _shape, quantized_specs
from ._refit import (
    AbortedError,
    DataLossError,
    DeadlineExceededError,
    Error,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    TensorView,
    UnavailableError,
    cuda_built,
    dtypes,
    shard_rule,
    tensor_spec,
)

__version__ = "0.1.0"

__all__ = [
    "AbortedError", "Coordinator", "DataLossError", "DeadlineExceededError", "Engine", "Error",
    "FailedPreconditionError", "InternalError", "InvalidArgumentError", "NotFoundError", "RefitReport",
    "ResourceExhaustedError", "TensorView", "Trainer", "TransportAvailability", "UnavailableError", "cuda_built",
    "dtypes", "parse_bytes", "quantized_specs", "set_log_handler", "shard_rule", "tensor_spec", "transports",
]

# ---------------------------------------------------------------- log messages

_logger = logging.getLogger("refit")
_LOG_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR, "progress": logging.DEBUG}


def _to_logging(level, source, message):
    """refit's default handler: one record on the "refit" logger, "<source>: <message>"."""
    _logger.log(_LOG_LEVELS.get(level, logging.INFO), "%s: %s", source, message.strip("\r\n"),
                extra={"refit_source": source, "refit_level": level})


def set_log_handler(handler):
    """Sends refit's messages to handler(level, source, message).

    level is "info", "warning", "error" or "progress"; source names who speaks
    ("refit coordinator", "engine rank 0", "refit ucx", ...). The handler runs on
    a thread of refit's own, one message at a time, in order; an exception it
    raises is reported through sys.unraisablehook. None: refit writes its
    messages to stderr itself. At import refit routes them into logging (the
    logger "refit", levels INFO, WARNING, ERROR, and DEBUG for progress lines).
    """
    _refit._set_log_handler(handler)


set_log_handler(_to_logging)
# Before the interpreter finalizes: no refit thread may call into Python after.
atexit.register(_refit._stop_logging)

RULES = ("replicated", "column", "row", "vocab")

# ---------------------------------------------------------------- transports


class TransportAvailability(NamedTuple):
    """Whether one transport can run on this machine (refit.transports())."""
    name: str        # as transport= takes it
    available: bool  # built into this refit, and what it needs (a CUDA device) is here
    reason: str      # why not, e.g. "built without NCCL", "no CUDA device (...)"; "" when available


def transports():
    """Every transport refit knows, in the order shm, tcp, cuda_ipc, ucx, nccl,
    each a TransportAvailability(name, available, reason): whether it can run
    on this machine, and if not why (built without it; no CUDA device for
    cuda_ipc and nccl). The names that can run:
    [t.name for t in refit.transports() if t.available]."""
    return [TransportAvailability(*t) for t in _refit.transport_availability()]


# ---------------------------------------------------------------- refit reports


@dataclasses.dataclass(frozen=True)
class RefitReport:
    """What one committed refit took on this trainer rank (Trainer.refit's
    result), for a training loop's log: log(**report.as_dict()) or print(report).

    Times are this rank's wall-clock seconds; the wait_* fields are the parts
    of `seconds` it spent waiting for others."""
    version: int
    bytes: int             # bytes this rank sent (its buckets' share of the plan)
    buckets: int           # buckets this rank sent
    seconds: float         # refit(version) called until the coordinator committed it
    gb_per_s: float        # bytes / seconds, in GB/s (1e9 bytes)
    send_s: float          # 'go' until every bucket was sent
    wait_start_s: float    # asking for the version until it started (the other trainer ranks asking)
    wait_go_s: float       # ready until 'go' (every rank ready)
    wait_credits_s: float  # waiting for the engine rank's free pool slots (part of send_s)
    wait_commit_s: float   # done until the commit (the other ranks finishing)
    only: tuple = ()       # a partial refit's globs; (): every tensor moved

    def as_dict(self):
        """{field: number}, for a logger (wandb.log, tensorboard, json): every
        field but `only` (a partial refit's globs, which is not a number)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "only"}

    def __repr__(self):
        fields = ", ".join(f"{f.name}={_short(getattr(self, f.name))}" for f in dataclasses.fields(self))
        return f"RefitReport({fields})"

    def __str__(self):
        return (f"refit {self.version}: {self.bytes} bytes in {self.seconds:.3f} s ({self.gb_per_s:.3g} GB/s); "
                f"waited {self.wait_start_s:.3f} s to start, {self.wait_go_s:.3f} s for go, "
                f"{self.wait_credits_s:.3f} s for credits, {self.wait_commit_s:.3f} s for the commit")


def _short(value):
    return f"{value:.4g}" if isinstance(value, float) else repr(value)

class Coordinator:
    """The control plane of one job, on a background thread of this process.

    refits=0 (the default) runs refits on demand: each one starts when every
    trainer rank called Trainer.refit(version), and the job ends when every
    trainer rank called finish(). refits=N schedules N refits (Trainer.serve()).
    The constructor returns once the socket listens (`address`, `port`).

    Liveness: the coordinator sends every rank a heartbeat each
    `heartbeat_interval` seconds (default 1) and loses a rank it heard nothing
    from for `heartbeat_timeout` seconds (default 10), in any phase, idle
    between on-demand refits included: a stalled, dead or cut-off rank ends
    the job that soon, named. heartbeat_timeout must exceed every rank's
    heartbeat_interval. A new connection has `handshake_timeout` seconds
    (default 5) to authenticate and join. None keeps these defaults
    (CoordinatorOptions').

    trainer_replace_timeout (on demand only): a trainer rank whose process
    is lost while a refit is in flight no longer ends the job: the refit is
    aborted (the engines keep their committed version), and for this many
    seconds the coordinator waits for a new process of that rank (a
    refit.Trainer with the same rank and the same tensors) to join; the
    next refit then commits. Default None (0): a lost rank ends the job.

    release_between_refits (colocated jobs, where trainer and engine share a
    GPU): after each commit the trainer ranks close their mappings of the
    engines' memory and free their staging, then the engine ranks free their
    receive pools, so that the memory is the trainer's while it trains; both
    take them again before the next refit. Trainer.refit() returns once its
    rank released; Engine.next() returns the version once its rank released,
    and its next call takes the pool again: a server calls nothing new.
    Direct mode has no pool (the weights are the target). Default False.

    engines (many engine replicas, each of engine_ranks ranks: refit.Engine(
    ..., engine=k)): engine 0 is fed by the trainer ranks, every other by its
    parent in a relay tree of `relay_fanout` (default 1: a chain), so the
    trainers' links carry each byte once. A refit commits once every rank of
    every engine has it. min_engines: an engine whose rank dies, stalls or
    misses a deadline is dropped while this many stay (engine 0 too: the
    trainers then feed the next live engine); a
    refit in flight is aborted (Trainer.refit raises; call it again with the
    same version) and the relay routed around it. Default None: every
    engine, a lost engine ends the job. Staged mode, host pools only.
    max_engines: engines engines..max_engines-1 may join the running job
    (an Engine(..., engine=k) started later); at the next refit boundary
    each first receives the last committed version from its parent in the
    relay tree (an engine bound to host tensors; not from the trainers),
    commits it, and then counts as live. Default None: no joining.
    """

    def __init__(self, trainer_ranks=None, engine_ranks=None, refits=0, listen=None, *, seed=None,
                 setup_timeout=None, refit_timeout=None, heartbeat_interval=None, heartbeat_timeout=None,
                 handshake_timeout=None, secret=None, progress=None, log_joins=False, trainer_replace_timeout=None,
                 release_between_refits=False, engines=None, relay_fanout=None, min_engines=None,
                 max_engines=None):
        o = _refit.CoordinatorOptions()
        _set(o, "trainer_ranks", trainer_ranks)
        _set(o, "engine_ranks", engine_ranks)
        _set(o, "engines", engines)
        _set(o, "relay_fanout", relay_fanout)
        _set(o, "min_engines", min_engines)
        _set(o, "max_engines", max_engines)
        _set(o, "listen", listen)
        _set(o, "seed", seed)
        _set(o, "setup_timeout_s", setup_timeout, float)
        _set(o, "refit_timeout_s", refit_timeout, float)
        _set(o, "heartbeat_interval_s", heartbeat_interval, float)
        _set(o, "heartbeat_timeout_s", heartbeat_timeout, float)
        _set(o, "handshake_timeout_s", handshake_timeout, float)
        _set(o, "trainer_replace_timeout_s", trainer_replace_timeout, float)
        _set(o, "progress", progress)
        o.release_between_refits = bool(release_between_refits)
        # refits=0 (on demand) and log_joins=False are this class's own
        # defaults, unlike the `refit coordinator` command's: a Python
        # trainer asks for each refit, and logs through its own logging.
        o.refits = refits
        o.log_joins = log_joins
        self._impl = _refit.Coordinator(o, secret or "")

    @property
    def address(self):
        """host:port that ranks pass as `coordinator`."""
        return self._impl.address

    @property
    def port(self):
        return self._impl.port

    @property
    def done(self):
        return self._impl.done

    def wait(self, timeout=None):
        """Blocks until the job ends; returns its report (a dict: "refits",
        "ranks", ..., and "error" when it failed). DeadlineExceededError after
        `timeout` seconds. timeout=None waits as long as the job runs: it ends
        when every rank left, or once a rank is lost (heartbeat_timeout), but
        an on-demand job whose ranks stay alive runs until they finish().
        Ctrl-C (KeyboardInterrupt) interrupts the wait, not the job."""
        return self._impl.wait(-1.0 if timeout is None else float(timeout))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            self.wait()
        return False


class Trainer:
    """A trainer rank whose weights are your tensors.

    tensors: {name: tensor} or [(name, tensor), ...] or [(name, tensor, rule), ...]
        The FULL (unsharded) weights in model order; numpy arrays, torch or cupy
        tensors, C-contiguous, all on the host or all on one CUDA device.
        A sharded trainer (FSDP2, DTensor) gives each rank's OWN shards
        instead, never gathering: a torch DTensor on a 1-D mesh (Shard(d) or
        Replicate(); read through .to_local(), .placements and its mesh
        coordinate), or an explicit (name, local_tensor, full_shape, dim,
        index, count) entry: this rank (index) holds torch.chunk(full, count,
        dim)[index] (dim None: the whole tensor, replicated). Then every entry
        is a shard or a replica, index is this trainer's rank and count its
        trainer_ranks; a full (name, tensor) entry counts as replicated.
        Sharded trainers run over every transport but nccl. Their memory is captured once: update them in place (an
        optimizer step does) and never swap their storage (`param.data = other` would leave refit
        sending the old memory). refit holds a DLPack reference, which keeps
        the memory alive until close().
    rules: how each engine splits a tensor over its TP ranks: "auto" (refit's
        table by name: q/k/v and gate/up column, o/down row, embeddings vocab,
        the rest replicated; see refit.shard_rule), one rule for all
        ("replicated", "column", "row", "vocab"), or {name: rule} (unlisted
        names: "auto"). A rule in a (name, tensor, rule) entry wins.
    engine_experts: how the engine ranks hold MoE experts (tensors named
        "*.experts.*"): "tp" (by their rules, the default) or "ep" (expert
        parallel: each engine rank holds whole experts, contiguous ranges,
        the first E % N ranks one more; an engine rank declares the experts
        it does not own with 0 rows). The engines must hold them so: their
        streams are compared at setup.
    quantize: the conversions the engines declare: "none" (the default),
        "fp8-block128" (every bf16 or fp32 linear "*.weight" but embeddings,
        lm_head, norms and the router becomes float8_e4m3fn codes of its
        shape and "*.weight_scale_inv" float32 128x128 block scales, the
        DeepSeek-V3 / Qwen3-FP8 format; docs/DESIGN.md) or
        "fp8-block128:GLOB,..." (exactly the weights the globs match). The
        trainer quantizes on its own side (its GPU, or the CPU), so the link
        carries FP8; the engine declares the codes and scales, (name,
        "float8_e4m3fn", shape) and (name + "_scale_inv", "float32",
        blocks), and its streams are compared with the trainer's at setup.
        Not with sharded trainers yet.
    Tensors on a CUDA device: refit() waits for the device first, so updates
    queued on any stream have landed.
    heartbeat_interval: this rank sends the coordinator a heartbeat each this
        many seconds, whatever it is doing (default 1; below the
        coordinator's heartbeat_timeout). heartbeat_timeout: a coordinator
        heard nothing from for this many seconds is lost (default 10): every
        call waiting on it, refit() waiting for the next refit to start
        included, raises UnavailableError "lost the coordinator: ...". None
        keeps these defaults (RankOptions'). debug_fault: fault injection
        for tests, as the CLI's --debug-fault ("sent:2:kill": this process
        kills itself before it says sent for refit 2). Other arguments: see
        README "Python".
    """

    def __init__(self, coordinator, tensors, *, rank=None, trainer_ranks=None, engine_ranks=None, rules="auto",
                 bucket_size=None, transport=None, mode=None, device=None, gpu=None, setup_timeout=None,
                 refit_timeout=None, bucket_timeout=None, heartbeat_interval=None, heartbeat_timeout=None,
                 secret=None, engine_experts=None, quantize=None, debug_fault=None):
        entries = self._entries(tensors, rules)
        options = _rank_options(_refit.RankOptions(), coordinator, rank, trainer_ranks, engine_ranks, bucket_size,
                                transport, mode, device, gpu, setup_timeout, refit_timeout, bucket_timeout, secret,
                                heartbeat_interval=heartbeat_interval, heartbeat_timeout=heartbeat_timeout)
        _set(options, "engine_experts", engine_experts)
        _set(options, "quantize", quantize)
        _set(options, "debug_fault", debug_fault)  # tests: "STEP:VERSION:ACTION", as the CLI's --debug-fault
        if any(len(e) == 7 for e in entries):  # sharded: full tensors are replicas
            entries = [e if len(e) == 7 else e + (tuple(_shape(e[1])), None, options.rank, options.trainer_ranks)
                       for e in entries]
        if gpu is None:
            options.gpu = 0
        self._impl = _refit.Trainer(options, entries)

    @staticmethod
    def _entries(tensors, rules):
        items = list(tensors.items()) if isinstance(tensors, dict) else list(tensors)
        if isinstance(rules, dict):
            names = {item[0] for item in items}
            unknown = sorted(set(rules) - names)
            if unknown:
                raise InvalidArgumentError(f"rules name tensors that are not registered: {', '.join(unknown)}")
        elif rules != "auto" and rules not in RULES:
            raise InvalidArgumentError(f"rules={rules!r} is not 'auto', one of {', '.join(RULES)}, or a dict")
        entries = []
        for item in items:
            if len(item) not in (2, 3, 6):
                raise InvalidArgumentError(f"tensor entry {item[:1]!r}: expected (name, tensor), (name, tensor, rule) "
                                           "or (name, local_tensor, full_shape, dim, index, count)")
            name, tensor = item[0], item[1]
            rule = item[2] if len(item) == 3 else (rules.get(name, "auto") if isinstance(rules, dict) else rules)
            if rule == "auto":
                rule = shard_rule(name)
            if len(item) == 6:
                full_shape, dim, index, count = item[2:]
                entries.append((name, _exportable(tensor), rule, tuple(full_shape), dim, index, count))
            elif _is_dtensor(tensor):
                entries.append((name, _exportable(tensor.to_local()), rule) + _dtensor_split(name, tensor))
            else:
                entries.append((name, _exportable(tensor), rule))
        return entries

    def refit(self, version, only=None):
        """Sends the tensors' current bytes as weight version `version` (on-demand
        jobs) and returns once the job committed it: every engine rank
        received and verified it and the coordinator decided the commit
        (each engine rank switches to it as its Commit arrives), with a
        RefitReport of this rank's part (bytes, seconds, GB/s, waits). Raises a
        refit.Error (e.g. AbortedError naming a lost engine rank) when the refit
        failed anywhere; the version is then not committed.

        only: a partial refit: a whole-name glob ('*' only) or a list of them,
        e.g. "*lora*" or ["*.q_proj.weight", "*norm*"]; only the tensors they
        select move (every trainer rank passes the same), and the version
        still applies to the whole engine. A glob that selects nothing is
        refused. The first refit, and the one after a failed refit left an
        engine's weights incomplete, move every tensor anyway (the report's
        `only` is then ()). Not with sharded trainers or quantize yet."""
        if only is None:
            only = []
        elif isinstance(only, str):
            only = [only]
        return RefitReport(**self._impl.refit(version, list(only)))

    def serve(self):
        """Takes part in every refit of a coordinator-scheduled job (refits=N)."""
        self._impl.serve()

    def finish(self):
        """On-demand jobs: this rank asks for no more refits (the job ends once
        every trainer rank finished)."""
        self._impl.finish()

    def close(self):
        """Leaves the job and releases the tensors."""
        self._impl.close()

    @property
    def committed_version(self):
        return self._impl.committed_version

    @property
    def last_refit(self):
        """The RefitReport of the last refit this rank saw committed (also
        under serve()), or None before the first."""
        report = self._impl.last_refit
        return None if report is None else RefitReport(**report)

    @property
    def specs(self):
        """[(name, dtype, shape)] as registered."""
        return self._impl.specs

    @property
    def device(self):
        return self._impl.device

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            if exc[0] is None:
                self.finish()
        finally:
            self.close()
        return False
