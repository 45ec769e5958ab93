"""A refit job of separate Python processes, for the binding's tests.

Each role runs in its own process (`python3 job.py <role> <config.json>`):

  coordinator  refit.Coordinator; prints its address on stdout, writes the
               report to <out>/coordinator.json when the job ends
               (heartbeat_interval / heartbeat_timeout in the config reach
               every role; absent: the library's defaults)
  trainer      refit.Trainer over numpy arrays (full tensors); before refit v
               it overwrites every array IN PLACE with bytes that are a
               function of (seed, v, tensor), saves a copy to
               <out>/trainer<r>_v<v>.npz, then calls refit(v); writes
               <out>/trainer<r>.json (versions committed, or the error)
  engine       refit.Engine over this rank's shards; after each committed
               version saves what it holds to <out>/engine<r>_v<v>.npz and
               writes <out>/engine<r>.json (versions, every load_fn call's
               dtypes and names, whether a kept view expired, or the error)

The test process (Job) starts them, waits with a deadline (a hang fails the
test instead of blocking ctest), and compares the saved arrays byte for byte.
"""
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# A small model with every situation the binding must carry: several dtypes
# (one load_fn call per dtype group), a tensor larger than a 4 KiB bucket
# (chunked and reassembled), a scalar, and uneven TP splits of each rule.
MODEL = [
    {"name": "model.embed_tokens.weight", "dtype": "float32", "shape": [11, 6], "rule": "vocab"},
    {"name": "model.layers.0.self_attn.q_proj.weight", "dtype": "float16", "shape": [7, 6], "rule": "column"},
    {"name": "model.layers.0.self_attn.q_proj.bias", "dtype": "int64", "shape": [7], "rule": "column"},
    {"name": "model.layers.0.self_attn.o_proj.weight", "dtype": "float32", "shape": [6, 7], "rule": "row"},
    {"name": "model.layers.0.input_layernorm.weight", "dtype": "float32", "shape": [6], "rule": "replicated"},
    {"name": "model.layers.0.mlp.big", "dtype": "uint8", "shape": [3, 3001], "rule": "row"},
    {"name": "model.layers.0.mlp.counts", "dtype": "int32", "shape": [5, 3], "rule": "column"},
    {"name": "model.scale", "dtype": "float64", "shape": [], "rule": "replicated"},
    {"name": "lm_head.weight", "dtype": "float16", "shape": [11, 6], "rule": "vocab"},
]


# An MoE layer for expert-parallel engines: a router and three experts'
# gate (column) and down (row) weights, split 2, 1 over 2 engine ranks.
MOE_MODEL = [
    {"name": "model.layers.0.mlp.gate.weight", "dtype": "float32", "shape": [3, 6], "rule": "replicated"},
] + [
    {"name": f"model.layers.0.mlp.experts.{j}.{proj}", "dtype": "float16", "shape": shape, "rule": rule}
    for j in range(3)
    for proj, shape, rule in (("gate_proj.weight", [5, 6], "column"), ("down_proj.weight", [6, 5], "row"))
]


def engine_rule(model, t, rank, ranks, engine_experts):
    """The split of tensor t on an engine rank: its rule, or under engine_experts "ep" for a per-expert
    tensor "whole" on the expert's owner (contiguous ranges, the first E % N ranks one more: vLLM's
    expert map) and "empty" (0 rows) elsewhere."""
    if engine_experts != "ep" or ".experts." not in t["name"]:
        return t["rule"]
    layer, rest = t["name"].split(".experts.")
    expert = int(rest.split(".")[0])
    experts = len({u["name"].split(".experts.")[1].split(".")[0] for u in model
                   if u["name"].startswith(layer + ".experts.")})
    base, extra = divmod(experts, ranks)
    begin = rank * base + min(rank, extra)
    return "whole" if begin <= expert < begin + base + (1 if rank < extra else 0) else "empty"


def shard_shape(shape, rule, rank, ranks):
    """refit's split (model.h): dim D over N ranks gives rank i D//N + (i < D%N)."""
    if rule in ("replicated", "whole"):
        return list(shape)
    if rule == "empty":
        return [0] + list(shape[1:])
    axis = 1 if rule == "row" else 0
    out = list(shape)
    out[axis] = shape[axis] // ranks + (1 if rank < shape[axis] % ranks else 0)
    return out


def shard(full, rule, rank, ranks):
    """The shard of a full numpy array (numpy.array_split splits the same way)."""
    import numpy as np
    if rule in ("replicated", "whole"):
        return full
    if rule == "empty":
        return full[:0]
    return np.array_split(full, ranks, axis=1 if rule == "row" else 0)[rank]


def fill(array, seed, version, index):
    """Overwrites `array` in place with bytes that depend on (seed, version, tensor)."""
    import numpy as np
    rng = np.random.default_rng([seed, version, index])
    flat = array.reshape(-1).view(np.uint8)
    flat[:] = rng.integers(0, 256, size=flat.size, dtype=np.uint8)


# ---- roles (run in the child processes) --------------------------------------

def _write(path, value):
    with open(path + ".tmp", "w") as f:
        json.dump(value, f)
    os.replace(path + ".tmp", path)


def pool_maps():
    """Mappings of a refit receive pool in this process: the shm transport's unnamed tmpfs file
    (/dev/shm, O_TMPFILE: "/dev/shm/#<inode> (deleted)"), or its memfd ("refit-pool")."""
    with open("/proc/self/maps") as f:
        return sum("/dev/shm/#" in line or "memfd:refit-pool" in line for line in f)


def _await_file(path, seconds=60):
    """Returns once `path` exists (None: at once): the test says so when the event it waits for happened."""
    until = time.monotonic() + seconds
    while path and not os.path.exists(path):
        if time.monotonic() > until:
            raise TimeoutError(f"no {path} within {seconds} s")
        time.sleep(0.01)


def _error(e, started):
    return {"error_class": type(e).__name__, "message": str(e), "seconds": time.monotonic() - started,
            "cause": type(e.__cause__).__name__ if e.__cause__ is not None else None}


def run_coordinator(c):
    import refit
    coordinator = refit.Coordinator(c["trainer_ranks"], c["engine_ranks"], refits=c.get("refits", 0),
                                    setup_timeout=c.get("setup_timeout", 30), refit_timeout=c.get("refit_timeout", 60),
                                    heartbeat_interval=c.get("heartbeat_interval"),
                                    heartbeat_timeout=c.get("heartbeat_timeout"),
                                    trainer_replace_timeout=c.get("trainer_replace_timeout"),
                                    release_between_refits=c.get("release", False),
                                    engines=c.get("engines"), min_engines=c.get("min_engines"),
                                    max_engines=c.get("max_engines"))
    print(coordinator.address, flush=True)
    _write(os.path.join(c["out"], "coordinator.json"), coordinator.wait())


def chunk_index(shape, dim, index, count):
    """torch.chunk(full, count, dim)[index] (FSDP2, DTensor Shard(dim)) as a numpy index."""
    size = -(-shape[dim] // count)
    begin = min(index * size, shape[dim])
    return tuple(slice(begin, min(begin + size, shape[dim])) if d == dim else slice(None) for d in range(len(shape)))


def shard_dim(t):
    """The sharded trainer's split of a tensor: Shard(1) for row weights, Shard(0) otherwise, none for a scalar."""
    return None if not t["shape"] else (1 if t["rule"] == "row" else 0)


def dtensor_entries(c, model, arrays):
    """(name, DTensor) entries, Shard(shard_dim) or Replicate() over every trainer rank, and each
    tensor's local piece (a numpy view of the DTensor's local tensor, to update in place)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{c['dist_port']}", rank=c["rank"],
                            world_size=c["trainer_ranks"])
    mesh = init_device_mesh("cpu", (c["trainer_ranks"],))
    entries, local = [], {}
    for t in model:
        d = shard_dim(t)
        dt = distribute_tensor(torch.from_numpy(arrays[t["name"]]), mesh, [Shard(d) if d is not None else Replicate()])
        entries.append((t["name"], dt))
        local[t["name"]] = dt.to_local().numpy()  # shares the DTensor's storage
    return entries, local


def run_trainer(c):
    import numpy as np
    import refit
    rank, out, model = c["rank"], c["out"], c.get("model", MODEL)
    arrays = {t["name"]: np.zeros(t["shape"], dtype=t["dtype"]) for t in model}
    # sharded: this rank registers only its own chunks (explicit entries; a
    # scalar stays a full, replicated entry) and copies the new values into
    # them in place before each refit; the full arrays are only the test's record.
    index = {t["name"]: chunk_index(t["shape"], shard_dim(t), rank, c["trainer_ranks"])
             for t in model if c.get("sharded") and shard_dim(t) is not None}
    local = {name: np.ascontiguousarray(arrays[name][i]) for name, i in index.items()}
    entries = []
    for t in model:
        name = t["name"]
        if name in local:
            entries.append((name, local[name], t["shape"], shard_dim(t), rank, c["trainer_ranks"]))
        else:
            entries.append((name, arrays[name]))
    if c.get("dtensor"):  # the same pieces as torch DTensors on a 1-D gloo mesh (FSDP2's parameters)
        entries, local = dtensor_entries(c, model, arrays)
    result = {"versions": []}
    started = time.monotonic()
    try:
        with refit.Trainer(c["address"], entries, rules={t["name"]: t["rule"] for t in model}, rank=rank,
                           trainer_ranks=c["trainer_ranks"], engine_ranks=c["engine_ranks"],
                           bucket_size=c.get("bucket_size", 4096), transport=c.get("transport", "shm"),
                           mode=c.get("mode", "staged"), bucket_timeout=c.get("bucket_timeout", 60),
                           refit_timeout=c.get("refit_timeout", 60),
                           heartbeat_interval=c.get("heartbeat_interval"), heartbeat_timeout=c.get("heartbeat_timeout"),
                           setup_timeout=30, engine_experts=c.get("engine_experts"),
                           debug_fault=c.get("debug_fault")) as trainer:
            for v in c["versions"]:
                for i, t in enumerate(model):
                    fill(arrays[t["name"]], c.get("seed", 7), v, i)  # in place: an optimizer step
                for t in model:
                    name = t["name"]
                    if name in local:
                        piece = chunk_index(t["shape"], shard_dim(t), rank, c["trainer_ranks"]) \
                            if shard_dim(t) is not None else ()
                        np.copyto(local[name], arrays[name][piece])
                np.savez(os.path.join(out, f"trainer{rank}_v{v}.npz"), **arrays)
                _await_file(c.get("go_files", {}).get(str(v)))  # the test's go-ahead for refit v
                started = time.monotonic()
                only = c.get("only") if v >= c.get("only_from", 2) else None  # a partial refit's globs
                try:
                    result.setdefault("only", []).append(list(trainer.refit(v, only=only).only))
                except refit.AbortedError as e:  # an engine dropped mid-refit (retry_aborted): ask for v again
                    if len(result.get("retried", [])) >= c.get("retry_aborted", 0):
                        raise
                    result.setdefault("retried", []).append(str(e))
                    trainer.refit(v)
                result["versions"].append(v)
                result.setdefault("pool_maps", []).append(pool_maps())
            result["committed"] = trainer.committed_version
    except refit.Error as e:
        result.update(_error(e, started))
    _write(os.path.join(out, f"trainer{rank}.json"), result)


def run_engine(c):
    import numpy as np
    import refit
    rank, ranks, out, model = c["rank"], c["engine_ranks"], c["out"], c.get("model", MODEL)
    # Many engines: engine k's files are engine<k>.<rank>*; engine 0's as before.
    tag = f"engine{rank}" if not c.get("engine") else f"engine{c['engine']}.{rank}"
    shapes = {t["name"]: shard_shape(t["shape"], engine_rule(model, t, rank, ranks, c.get("engine_experts")), rank,
                                     ranks) for t in model}
    store = {}
    for t in model:  # filled with 0xEE bytes: a tensor never written stays visibly wrong
        nbytes = int(np.prod(shapes[t["name"]], dtype=np.int64)) * np.dtype(t["dtype"]).itemsize
        store[t["name"]] = np.full(nbytes, 0xEE, dtype=np.uint8).view(t["dtype"]).reshape(shapes[t["name"]])
    calls, kept = [], []
    result = {"versions": [], "calls": calls, "flushes": []}
    die_at = c.get("die_at_version")
    raise_at = c.get("raise_at_version")

    def load(items):
        version = len(result["versions"]) + 1
        if die_at == version:
            os.kill(os.getpid(), signal.SIGKILL)  # an engine process that dies mid-refit
        if raise_at == version:
            raise ValueError("the engine's loader refused the batch")
        calls.append({"dtypes": sorted({view.dtype for _, view in items}), "names": [name for name, _ in items],
                      "version": version})
        for name, view in items:
            np.copyto(store[name], np.from_dlpack(view))
        kept.append(items[0][1])

    if c.get("params") == "tensors":  # staged copy mode: next() writes into these arrays
        params, load_fn = dict(store), None
    elif c.get("shadow"):  # shadow weights: refit's two arenas; on_flip copies the served one into store
        params, load_fn = [(t["name"], t["dtype"], shapes[t["name"]]) for t in model], None
    elif c.get("params") == "retarget":  # the loader once, then set_targets: slices of one fused buffer
        params, load_fn = [(t["name"], t["dtype"], shapes[t["name"]]) for t in model], load
    else:
        params, load_fn = [(t["name"], t["dtype"], shapes[t["name"]]) for t in model], load
    held = []  # the engine, for on_flip
    result["flips"] = []

    def on_flip(version):  # the served arena is version's now; the one before it is still whole
        engine = held[0]
        result["flips"].append([version, engine.weight_version, len(result["versions"])])
        for name, view in engine.weights().items():
            np.copyto(store[name], np.from_dlpack(view))

    started = time.monotonic()
    try:
        with refit.Engine(c["address"], params, rank=rank, trainer_ranks=c["trainer_ranks"], engine_ranks=ranks,
                          bucket_size=c.get("bucket_size", 4096), transport=c.get("transport", "shm"),
                          mode=c.get("mode", "staged"), poison_recycled=True,
                          bucket_timeout=c.get("bucket_timeout", 60),
                          refit_timeout=c.get("refit_timeout", 60), setup_timeout=30,
                          heartbeat_interval=c.get("heartbeat_interval"), heartbeat_timeout=c.get("heartbeat_timeout"),
                          on_commit=result["flushes"].append, shadow=c.get("shadow", False),
                          on_flip=on_flip if c.get("shadow") else None, engine=c.get("engine")) as engine:
            held.append(engine)
            try:
                while True:
                    try:
                        version = engine.next(load_fn)
                    except refit.AbortedError as e:  # a failed refit the job recovers from (keep_serving: how many)
                        if len(result.get("failures", [])) >= c.get("keep_serving", 0):
                            raise
                        result.setdefault("failures", []).append(str(e))
                        continue
                    if version is None:
                        break
                    result["versions"].append(version)
                    result.setdefault("last_only", []).append(list(engine.last_only))
                    if c.get("die_after_version") == version:  # an engine process that dies between refits
                        os.kill(os.getpid(), signal.SIGKILL)
                    result.setdefault("pool_maps", []).append(pool_maps())
                    np.savez(os.path.join(out, f"{tag}_v{version}.npz"), **store)
                    if c.get("params") == "retarget" and load_fn is not None:
                        _retarget(engine, store)
                        load_fn = None
            finally:
                result["posts"] = engine.posts
                result["cache_flushes"] = engine.cache_flushes
                result["weight_version"] = engine.weight_version
                result["complete"] = engine.weights_complete
                if c.get("shadow"):  # what the engine serves at its end (after a failed refit too)
                    served = {name: np.from_dlpack(view).copy() for name, view in engine.weights().items()}
                    np.savez(os.path.join(out, f"{tag}_served.npz"), **served)
                    result["weight_memory_bytes"] = engine.weight_memory_bytes
        try:
            if kept:
                np.from_dlpack(kept[0])
            result["expired"] = False
        except BufferError:
            result["expired"] = True
    except refit.Error as e:
        result.update(_error(e, started))
    _write(os.path.join(out, f"{tag}.json"), result)


def _retarget(engine, store):
    """Moves `store` into 64-byte-aligned slices of one fused buffer (as a server fuses q/k/v)
    and makes them the engine's copy targets; the old arrays keep their bytes."""
    import numpy as np
    offsets, total = {}, 0
    for name, array in store.items():
        offsets[name] = total
        total += (array.nbytes + 63) // 64 * 64
    fused = np.full(total + 64, 0xEE, dtype=np.uint8)
    base = (-fused.ctypes.data) % 64
    for name, array in list(store.items()):
        at = base + offsets[name]
        store[name] = fused[at:at + array.nbytes].view(array.dtype).reshape(array.shape)
    engine.set_targets(list(store.items()))


# ---- the test side -------------------------------------------------------------

class Job:
    """Starts a coordinator process, then trainer and engine processes."""

    def __init__(self, out, trainer_ranks=1, engine_ranks=1, timeout=60, **config):
        self.out = out
        self.deadline = time.monotonic() + timeout
        self.config = dict(config, out=out, trainer_ranks=trainer_ranks, engine_ranks=engine_ranks)
        self.processes = {}
        coordinator = self._start("coordinator", self.config)
        line = coordinator.stdout.readline().strip()
        coordinator.stdout.close()
        if not line:
            coordinator.wait()
            raise AssertionError("the coordinator process printed no address: " + self.log("coordinator"))
        self.config["address"] = line

    def _start(self, name, config, role=None):
        path = os.path.join(self.out, name + ".config.json")
        _write(path, config)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        # Output goes to files (a pipe nobody reads could fill and block the role); only the
        # coordinator's stdout is a pipe: it prints its address there.
        with open(os.path.join(self.out, name + ".log"), "w") as log:
            stdout = subprocess.PIPE if name == "coordinator" else log
            process = subprocess.Popen([sys.executable, os.path.join(HERE, "job.py"), role or name.rstrip("0123456789"),
                                        path], stdout=stdout, stderr=log, text=True, env=env)
        self.processes[name] = process
        return process

    def start(self, role, rank, name=None, **overrides):
        """name: the process's key, log and config file (default role + rank; another for a replacement)."""
        return self._start(name or f"{role}{rank}", dict(self.config, rank=rank, **overrides), role)

    def wait(self):
        """{name: (exit status, its output)}; kills whatever outlives the deadline."""
        results = {}
        for name, process in self.processes.items():
            try:
                process.wait(timeout=max(1, self.deadline - time.monotonic()))
                killed = ""
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                killed = "[killed at the test's deadline: a hang]\n"
            results[name] = (process.returncode, killed + self.log(name))
        return results

    def log(self, name):
        with open(os.path.join(self.out, name + ".log")) as f:
            return f.read()

    def result(self, name):
        path = os.path.join(self.out, name + ".json")
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return json.load(f)


def main():
    role, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        config = json.load(f)
    {"coordinator": run_coordinator, "trainer": run_trainer, "engine": run_engine}[role](config)


if __name__ == "__main__":
    main()
