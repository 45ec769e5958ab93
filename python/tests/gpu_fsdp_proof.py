"""GPU proof of sharded trainers (issue 19 item 5): FSDP2 into engines of another TP size.

Hugging Face transformers models built from small configs in code (random
init, no downloads; gpu_transformers_proof.build_model: a Llama-style dense
model and a Qwen3-MoE model, bfloat16), sharded with FSDP2
(torch.distributed.fsdp.fully_shard: every decoder layer, then the root) over
M trainer processes of a gloo process group that share CUDA device 0, refit
into N engine processes (tensor parallel by refit's rules), M != N, every
process on GPU 0. Each case (model, M, N):

  driver (this process)  a refit.Coordinator (on demand, refits=0) and the
                         model's spec (names, dtypes, full shapes, each
                         tensor's engine rule) in a temp dir; starts the N
                         engine and M trainer processes (this script again,
                         --role), waits with a deadline, checks
  trainer rank r of M    gloo group, init_device_mesh("cuda", (M,)), the model
                         with seed 1, fully_shard: every parameter is a DTensor,
                         Shard(0) on the 1-D mesh, this rank holding only its
                         torch.chunk piece. Per version v: one AdamW step on a
                         fixed batch (the same on every rank), refit(v) through
                         refit.Trainer (the DTensors as they are: nothing is
                         gathered; transport cuda_ipc, mode direct: the shards
                         are written straight into the engines' weights), then
                         its local shards (to_local()) saved on the CPU
  engine rank e of N     refit.Engine in direct mode over its TP shards (shapes
                         by the rule, torch.tensor_split semantics), its arena
                         seeded with 0xEE bytes so a byte never written shows;
                         saves its shards after each committed version

The driver gathers on the CPU (DTensor.full_tensor() of CUDA tensors over gloo
crashes the process with SIGSEGV on the H200; on the CPU nothing needs gloo)
and checks, for every version:
  (a) the trainers' shards concatenated in rank order along their Shard dim
      (torch.chunk semantics, FSDP2's layout)
  (b) the engines' shards assembled along the rule's dim (column and vocab:
      dim 0, row: dim 1; replicated: every rank holds the whole, all equal),
      each of the shape the rule gives that rank
  (c) (b) == (a) bit for bit per tensor; a difference names the tensor, the
      first differing element, both values and the engine and trainer ranks
      that hold it
  (d) logits of a fixed probe batch from a fresh model loaded with (b) equal
      bit for bit those of a fresh model loaded with (a)
and the coordinator's report: no error, versions 1..3 committed,
gathered_bytes 0 (no trainer held more than its shards), duplicate_bytes 0
(each engine byte came from exactly one trainer rank), bytes_per_refit the
engines' shard bytes and the trainer ranks' bytes summing to it.
Controls: the trainers' initial shards (after fully_shard, before any step)
concatenate to the unsharded seed-1 model bit for bit (so (a) is FSDP2's real
layout), the probe's forward repeats bit for bit, the engine's logits differ
from a seed-2 model's and from the previous version's (the steps moved the
weights), and every engine arena was seeded (0xEE) before the first refit.
Reference, reported but no pass condition: an unsharded model trained the same
way in this process (seed 1, same batches, same AdamW). FSDP2 reduce-scatters
the gradients over gloo with its own reduce dtype, divide factors and order,
which may round differently from one process's gradient: a difference there is
FSDP2's, not refit's; it prints "bit-exact" or "differs by X".
The trainers register after version 1's step (FSDP2's lazy init in the first
forward may move a local shard); transformers 5's stacked expert parameters
(3-D, no rule by name) split dim 0, the experts, over the engine ranks.

Mutations caught: a trainer rank's shard index or Shard dim read wrong (the
mesh coordinate ignored, Shard(0) taken as whole: setup refuses the layout or
(c) names the tensor); an engine rule's dim wrong (row split along dim 0) or an
uneven split cut evenly (k_proj 128 rows over 3, experts 8 over 3: (b)'s shapes
or (c)); an engine rank given another rank's payload ((c), with both ranks
named); bytes sent twice or gathered first (the report's duplicate_bytes,
gathered_bytes); the local shard copied at registration, or FSDP2 swapping a
parameter's storage after registration (versions 2 and 3 differ in (c); each
trainer also checks that every to_local() still lives where it was registered,
and fails naming the parameter if not); a byte left unwritten (0xEE in (c)).

Usage: python3 gpu_fsdp_proof.py [--cases llama:2:1,llama:2:3,qwen3_moe:2:3,llama:4:3,qwen3_moe:4:2]
       (each case model:M:N; on the GPU machine: bash bench/python_gpu.sh fsdp)
Exit status: 0 PASS, 1 FAIL, 77 skipped (no torch with FSDP2 and gloo, no
transformers or CUDA device, or refit built without CUDA), with the reason
printed; the last line is "SUMMARY: PASS: ..." or "SUMMARY: FAIL: ...".
"""
import argparse
import datetime
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_transformers_proof as base  # noqa: E402  the same models, probe, save and bit views

SKIPPED = 77
VERSIONS = [1, 2, 3]
LR = 1e-2               # large enough that bf16 weights (norms at 1.0 too) move every step
BUCKET = 256 << 10      # small: the embeddings and stacked experts span several buckets
CASE_DEADLINE = 240     # seconds for one case's processes (less when --budget runs short)
GRACE = 20              # seconds the others get to stop once one process failed
DEFAULT_CASES = "llama:2:1,llama:2:3,qwen3_moe:2:3,llama:4:3,qwen3_moe:4:2"
RULE_DIM = {"column": 0, "vocab": 0, "row": 1, "replicated": None}
# Every case's coordinator, kept referenced: destroying one waits for its job to end (up to its
# setup timeout after a failed case); the driver exits past those still running.
COORDINATORS = []


class ProofError(Exception):
    """A check that failed; the message says what differed."""


# ---- shared by every role ------------------------------------------------------

def engine_rule(name, shape):
    """How engine ranks split `name`: refit's table by name (refit.shard_rule), except
    transformers 5's stacked experts (mlp.experts.gate_up_proj [E, 2I, H], mlp.experts.down_proj
    [E, H, I]: 3-D parameters no row of the table names, so "replicated"), which split dim 0, the
    experts, over the engine ranks ("column": expert parallel)."""
    import refit
    rule = refit.shard_rule(name)
    if rule == "replicated" and ".experts." in name and len(shape) == 3:
        return "column"
    if rule not in RULE_DIM:
        raise ProofError(f"{name}: refit.shard_rule says {rule!r}, a rule this proof cannot assemble "
                         f"(it knows {', '.join(RULE_DIM)})")
    return rule


def split_sizes(length, parts):
    """refit's TP split of a dimension (torch.tensor_split): rank i gets length//parts + (i < length%parts)."""
    return [length // parts + (1 if i < length % parts else 0) for i in range(parts)]


def chunk_bounds(length, parts):
    """torch.chunk(.., parts) along a dimension (FSDP2's Shard): [(begin, end)] per rank, the last ones maybe empty."""
    size = -(-length // parts)
    return [(min(i * size, length), min(i * size + size, length)) for i in range(parts)]


def engine_shard_shape(shape, rule, rank, ranks):
    dim = RULE_DIM[rule]
    out = list(shape)
    if dim is not None:
        out[dim] = split_sizes(shape[dim], ranks)[rank]
    return out


def torch_dtype(name):
    import torch
    return getattr(torch, name.split(".")[-1])


def fake_batch(vocab_size, version):
    """The training batch of one version: the same on every trainer rank and in the reference."""
    import torch
    generator = torch.Generator().manual_seed(100 + version)
    return torch.randint(0, vocab_size, (4, 32), generator=generator).cuda()


def make_optimizer(model):
    import torch
    # foreach=False: the same per-tensor elementwise ops on a DTensor's local piece as on the
    # unsharded reference's tensor (the reference comparison's best chance to be bit-exact).
    return torch.optim.AdamW(model.parameters(), lr=LR, foreach=False)


def train_step(model, optimizer, version):
    """One AdamW step on version's batch; the parameters change in place. Returns the loss."""
    model.train()
    batch = fake_batch(model.config.vocab_size, version)
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss)


def load_spec(out):
    with open(os.path.join(out, "spec.json")) as f:
        return json.load(f)


# ---- roles (child processes) ---------------------------------------------------

def sharded_parameters(model, spec, rank, ranks, when):
    """model.named_parameters(), checked against the driver's spec: same names in the same order
    (the order refit streams them), every one a DTensor sharded on the 1-D mesh with this rank's
    coordinate. Raises naming the first parameter that is not."""
    from torch.distributed.tensor import DTensor
    params = list(model.named_parameters())
    names, want = [n for n, _ in params], [s["name"] for s in spec]
    if names != want:
        first = next((i for i, (a, b) in enumerate(zip(names, want)) if a != b), min(len(names), len(want)))
        got_name = names[first] if first < len(names) else None
        want_name = want[first] if first < len(want) else None
        raise ProofError(f"trainer rank {rank} {when}: its parameters ({len(names)}) are not the driver's "
                         f"({len(want)}) in order; first difference at #{first}: {got_name!r} vs {want_name!r}")
    for (name, p), s in zip(params, spec):
        if not isinstance(p, DTensor):
            raise ProofError(f"trainer rank {rank} {when}: parameter {name!r} is a {type(p).__name__}, not a DTensor "
                             "(FSDP2 left it unsharded)")
        if list(p.shape) != s["shape"] or str(p.dtype) != s["dtype"]:
            raise ProofError(f"trainer rank {rank} {when}: parameter {name!r} is {p.dtype}{list(p.shape)}, the "
                             f"driver's model has {s['dtype']}{s['shape']}")
        if p.device_mesh.ndim != 1 or len(p.placements) != 1 or not p.placements[0].is_shard():
            raise ProofError(f"trainer rank {rank} {when}: parameter {name!r} has placements {p.placements} on a "
                             f"{p.device_mesh.ndim}-D mesh, not FSDP2's Shard(d) on a 1-D mesh")
        coordinate = p.device_mesh.get_coordinate()
        if coordinate is None or int(coordinate[0]) != rank or int(p.device_mesh.size()) != ranks:
            raise ProofError(f"trainer rank {rank} {when}: parameter {name!r} sits at mesh coordinate {coordinate} "
                             f"of {p.device_mesh.size()}, not {rank} of {ranks}")
    return params


def local_shards(params):
    return {name: p.to_local().detach().cpu() for name, p in params}


def run_trainer(args):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard
    from torch.distributed.tensor import DTensor
    import refit
    rank, ranks = args.rank, args.trainers
    spec = load_spec(args.out)
    torch.cuda.set_device(0)  # every rank on the one GPU
    torch.backends.cuda.matmul.allow_tf32 = False
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.dist_port}", rank=rank, world_size=ranks,
                            timeout=datetime.timedelta(seconds=120))
    try:
        mesh = init_device_mesh("cuda", (ranks,))
        model = base.build_model(args.model, seed=1)  # every rank the same full model; fully_shard keeps its chunk
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        params = sharded_parameters(model, spec, rank, ranks, "after fully_shard")
        layouts = {name: {"dim": int(p.placements[0].dim), "index": int(p.device_mesh.get_coordinate()[0]),
                          "count": int(p.device_mesh.size()), "placements": str(p.placements)} for name, p in params}
        initial_ptrs = {name: p.to_local().data_ptr() for name, p in params}
        base.save(os.path.join(args.out, f"trainer{rank}_v0.pt"), {"shards": local_shards(params), "layouts": layouts})

        optimizer = make_optimizer(model)
        # Version 1's step runs BEFORE refit.Trainer registers the shards: FSDP2's lazy init (in
        # the first forward, FSDPParam.reset_sharded_param) may move a parameter's local shard
        # into new memory (it re-pads an unevenly split one; every split here is even, and the
        # driver prints what moved). From then on FSDP2 keeps each local shard in the same
        # storage: unshard all-gathers into a separate buffer, reshard frees that buffer and
        # registers the same sharded DTensor again, and the optimizer step updates the local
        # shard in place. That is what refit relies on (it reads the memory registered once);
        # check_storage verifies it after every later step and fails naming what moved.
        losses = {1: train_step(model, optimizer, 1)}
        if not all(isinstance(p, DTensor) for _, p in model.named_parameters()):
            for module in model.modules():  # the root may keep its parameters unsharded after a forward
                if isinstance(module, FSDPModule):
                    module.reshard()
        params = sharded_parameters(model, spec, rank, ranks, "after version 1's step")
        registered = {name: p.to_local().data_ptr() for name, p in params}
        moved_at_first_step = sorted(n for n in registered if registered[n] != initial_ptrs[n])

        def check_storage(version):
            for name, p in sharded_parameters(model, spec, rank, ranks, f"after version {version}'s step"):
                ptr = p.to_local().data_ptr()
                if ptr != registered[name]:
                    raise ProofError(f"trainer rank {rank}: after version {version}'s step the local shard of "
                                     f"{name!r} lives at 0x{ptr:x}, not at 0x{registered[name]:x} where "
                                     "refit.Trainer registered it: FSDP2 replaced its storage, so refit would "
                                     "send the old bytes")

        with refit.Trainer(args.address, params, rules={s["name"]: s["rule"] for s in spec}, rank=rank,
                           trainer_ranks=ranks, engine_ranks=args.engines, transport="cuda_ipc", mode="direct",
                           gpu=0, bucket_size=BUCKET, setup_timeout=120, refit_timeout=120) as trainer:
            for v in VERSIONS:
                if v > 1:
                    losses[v] = train_step(model, optimizer, v)
                    check_storage(v)
                torch.cuda.synchronize()
                report = trainer.refit(v)
                base.save(os.path.join(args.out, f"trainer{rank}_v{v}.pt"),
                          {"shards": local_shards(params), "loss": losses[v], "refit": report.as_dict(),
                           "moved_at_first_step": moved_at_first_step})
    finally:
        dist.destroy_process_group()


def run_engine(args):
    import torch
    import refit
    rank, ranks = args.rank, args.engines
    spec = load_spec(args.out)
    torch.cuda.set_device(0)
    params = {}
    for s in spec:  # this rank's shards, in the model's order; every byte 0xEE until a refit writes it
        shape = engine_shard_shape(s["shape"], s["rule"], rank, ranks)
        dtype = torch_dtype(s["dtype"])
        numel = 1
        for d in shape:
            numel *= d
        raw = torch.full((numel * dtype.itemsize,), 0xEE, dtype=torch.uint8, device="cuda")
        params[s["name"]] = raw.view(dtype).view(shape)
    # gpu=0: otherwise engine rank e would want GPU base_gpu_id + e (DESIGN.md rule 7).
    engine = refit.Engine(args.address, params, rank=rank, trainer_ranks=args.trainers, engine_ranks=ranks,
                          transport="cuda_ipc", mode="direct", device="cuda", gpu=0, bucket_size=BUCKET,
                          setup_timeout=120, refit_timeout=120)
    del params  # their values seeded refit's arena; the weights live there now
    versions = []
    with engine:
        weights = engine.weights(convert=torch.from_dlpack)  # views of the arena the trainers write into
        seeded = all(bool((w.reshape(-1).view(torch.uint8) == 0xEE).all()) for w in weights.values())
        while True:
            version = engine.next()
            if version is None:
                break
            versions.append(version)
            torch.cuda.synchronize()
            base.save(os.path.join(args.out, f"engine{rank}_v{version}.pt"),
                      {"shards": {name: w.cpu() for name, w in weights.items()}})
        base.save(os.path.join(args.out, f"engine{rank}.pt"),
                  {"versions": versions, "weight_version": int(engine.weight_version),
                   "complete": bool(engine.weights_complete), "seeded": seeded,
                   "specs": [[n, d, list(s)] for n, d, s in engine.specs]})


# ---- the proof (driver) ----------------------------------------------------------

def skip(reason):
    base.skip(reason)


def check_requirements():
    base.check_requirements()  # torch, transformers, a CUDA device, refit with CUDA, cuda_ipc
    import torch
    import torch.distributed as dist
    if not dist.is_available():
        skip(f"torch {torch.__version__} was built without torch.distributed")
    if not dist.is_gloo_available():
        skip(f"torch {torch.__version__} has no gloo backend")
    try:
        from torch.distributed.device_mesh import init_device_mesh  # noqa: F401
        from torch.distributed.fsdp import FSDPModule, fully_shard  # noqa: F401
        from torch.distributed.tensor import DTensor  # noqa: F401
    except ImportError as e:
        skip(f"torch {torch.__version__} has no FSDP2 (fully_shard) or DTensor: {e}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_spec(model):
    return [{"name": n, "dtype": str(p.dtype), "shape": list(p.shape), "rule": engine_rule(n, list(p.shape))}
            for n, p in model.named_parameters()]


def cpu_params(model):
    return {n: p.detach().cpu() for n, p in model.named_parameters()}


def reference_run(kind):
    """The unsharded model trained the same way: its spec, its parameters and the probe's logits per version."""
    model = base.build_model(kind, seed=1)
    runs = {0: {"params": cpu_params(model), "logits": base.probe_logits(model)}}
    spec = model_spec(model)
    optimizer = make_optimizer(model)
    for v in VERSIONS:
        loss = train_step(model, optimizer, v)
        runs[v] = {"params": cpu_params(model), "logits": base.probe_logits(model), "loss": loss}
    del model, optimizer
    return {"spec": spec, "runs": runs}


def value(t, index):
    return t[index].item() if index else t.item()


def bit_pattern(t, index):
    raw = base.bits(t)
    width = 2 * t.element_size()
    return f"0x{(value(raw, index)) & ((1 << (8 * t.element_size())) - 1):0{width}x}"


def first_difference(got, want):
    """None when got and want are the same bits, else (count, index of the first differing element)."""
    import torch
    differ = base.bits(got) != base.bits(want)
    count = int(differ.sum())
    if count == 0:
        return None
    return count, tuple(int(i) for i in torch.nonzero(differ)[0]) if got.dim() else ()


def rank_of(position, bounds):
    return next((r for r, (b, e) in enumerate(bounds) if b <= position < e), None)


def holders(s, index, trainer_dim, trainers, engines):
    """Which trainer rank and which engine rank(s) hold element `index` of tensor spec s."""
    shape = s["shape"]
    trainer = rank_of(index[trainer_dim], chunk_bounds(shape[trainer_dim], trainers)) if index else 0
    dim = RULE_DIM[s["rule"]]
    if dim is None:
        engine = "every engine rank (replicated)"
    else:
        sizes = split_sizes(shape[dim], engines)
        starts = [sum(sizes[:i]) for i in range(engines)]
        engine = f"engine rank {rank_of(index[dim], [(b, b + n) for b, n in zip(starts, sizes)])}"
    return f"{engine}, trainer rank {trainer}"


def describe(name, got, want, what_got, what_want, where=""):
    """A line naming the first element where got and want differ, or None if they are the same bits."""
    if list(got.shape) != list(want.shape) or got.dtype != want.dtype:
        return (f"{name}: {what_got} is {got.dtype}{list(got.shape)} but {what_want} is "
                f"{want.dtype}{list(want.shape)}")
    found = first_difference(got, want)
    if found is None:
        return None
    count, index = found
    held = f" (held by {where(index)})" if where else ""
    return (f"{name}: {count} of {got.numel()} elements differ, the first at {list(index)}{held}: "
            f"{what_got} {value(got, index)!r} ({bit_pattern(got, index)}) vs {what_want} "
            f"{value(want, index)!r} ({bit_pattern(want, index)})")


def gather_trainers(spec, files, trainers):
    """(a): {name: full tensor} from the trainer ranks' local shards, concatenated in rank order along
    their Shard dim (FSDP2: torch.chunk). Raises ProofError naming a piece that does not fit."""
    import torch
    layouts = files["layouts"]
    full = {}
    for s in spec:
        name = s["name"]
        dim = layouts[0][name]["dim"]
        bounds = chunk_bounds(s["shape"][dim], trainers)
        pieces = []
        for r in range(trainers):
            layout = layouts[r][name]
            if (layout["dim"], layout["index"], layout["count"]) != (dim, r, trainers):
                raise ProofError(f"{name}: trainer rank {r} holds {layout['placements']} as piece "
                                 f"{layout['index']} of {layout['count']}, not Shard({dim}) piece {r} of {trainers}")
            piece = files["shards"][r][name]
            want = list(s["shape"])
            want[dim] = bounds[r][1] - bounds[r][0]
            if list(piece.shape) != want:
                raise ProofError(f"{name}: trainer rank {r}'s local shard is {list(piece.shape)}, torch.chunk of "
                                 f"{s['shape']} over {trainers} along dim {dim} gives it {want}")
            pieces.append(piece)
        full[name] = torch.cat(pieces, dim)
    return full


def assemble_engines(spec, shards, engines):
    """(b): {name: full tensor} from the engine ranks' shards, each checked to have the shape its
    rule gives that rank; replicas must agree. Raises ProofError naming what does not fit."""
    import torch
    full = {}
    for s in spec:
        name, rule = s["name"], s["rule"]
        pieces = []
        for e in range(engines):
            piece = shards[e][name]
            want = engine_shard_shape(s["shape"], rule, e, engines)
            if list(piece.shape) != want:
                raise ProofError(f"{name}: engine rank {e} holds {list(piece.shape)}, rule {rule} over {engines} "
                                 f"ranks gives it {want} of {s['shape']}")
            pieces.append(piece)
        if RULE_DIM[rule] is None:
            for e in range(1, engines):
                line = describe(name, pieces[e], pieces[0], f"engine rank {e}'s replica", "engine rank 0's")
                if line:
                    raise ProofError(line)
            full[name] = pieces[0]
        else:
            full[name] = torch.cat(pieces, RULE_DIM[rule])
    return full


def load_into(model, weights):
    """Copies `weights` ({name: CPU tensor}, every parameter, nothing else) into model's parameters."""
    import torch
    params = dict(model.named_parameters())
    if set(params) != set(weights):
        missing, extra = sorted(set(params) - set(weights)), sorted(set(weights) - set(params))
        raise ProofError(f"weights do not match the model's parameters: missing {missing[:4]}, extra {extra[:4]}")
    with torch.no_grad():
        for name, p in params.items():
            w = weights[name]
            if list(w.shape) != list(p.shape) or w.dtype != p.dtype:
                raise ProofError(f"{name}: {w.dtype}{list(w.shape)} cannot load into {p.dtype}{list(p.shape)}")
            p.copy_(w.to(p.device))


def max_abs_diff(a, b):
    return (a.float() - b.float()).abs().max().item() if a.numel() else 0.0


def wait_all(procs, deadline, seconds):
    """Waits for every process; once one fails, the others get GRACE seconds; at the deadline
    everything left is killed. Returns {name: note} for the killed ones."""
    failed_at, notes = None, {}
    while True:
        running = {n: p for n, p in procs.items() if p.poll() is None}
        if not running:
            return notes
        now = time.monotonic()
        if failed_at is None and any(p.returncode not in (None, 0) for p in procs.values()):
            failed_at = now
        if now > deadline or (failed_at is not None and now - failed_at > GRACE):
            why = (f"[killed: still running {GRACE} s after another process failed]" if now <= deadline
                   else f"[killed at the case's {seconds:.0f} s deadline: a hang]")
            for name, p in running.items():
                p.kill()
                p.wait()
                notes[name] = why
            return notes
        time.sleep(0.2)


def tail(out, name, lines=40):
    try:
        with open(os.path.join(out, name + ".log"), errors="replace") as f:
            text = f.read().splitlines()
    except OSError as e:
        return [f"    (no log: {e})"]
    return ["    " + line for line in text[-lines:]]


def check_report(report, spec, trainers, engines, lines):
    """The coordinator's report: committed versions, nothing gathered or sent twice, the byte sums."""
    ok = True
    versions = [r.get("version") for r in report.get("refits", [])]
    expected_bytes = sum(
        torch_dtype(s["dtype"]).itemsize * _numel(engine_shard_shape(s["shape"], s["rule"], e, engines))
        for s in spec for e in range(engines))
    trainer_bytes = [t.get("bytes") for t in report.get("trainer_ranks", [])]
    problems = []
    if "error" in report:
        problems.append(f"error: {report['error']}")
    if versions != VERSIONS:
        problems.append(f"committed versions {versions}, not {VERSIONS}")
    for key in ("gathered_bytes", "duplicate_bytes"):
        if key not in report:
            problems.append(f"the report has no {key!r}")
        elif report[key] != 0:
            problems.append(f"{key} = {report[key]}, not 0")
    if report.get("bytes_per_refit") != expected_bytes:
        problems.append(f"bytes_per_refit {report.get('bytes_per_refit')}, the engines' shards hold {expected_bytes}")
    if len(trainer_bytes) != trainers or None in trainer_bytes or sum(trainer_bytes) != report.get("bytes_per_refit"):
        problems.append(f"trainer ranks' bytes {trainer_bytes} do not sum to bytes_per_refit "
                        f"{report.get('bytes_per_refit')}")
    paths = {k: v for k, v in report.items() if "path" in k}
    lines.append(f"  report: transport={report.get('transport')} mode={report.get('mode')} "
                 f"device={report.get('device')} {paths} bytes/refit={report.get('bytes_per_refit')} "
                 f"trainer bytes={trainer_bytes} gathered_bytes={report.get('gathered_bytes')} "
                 f"duplicate_bytes={report.get('duplicate_bytes')} committed={versions}: "
                 + ("ok" if not problems else "MISMATCH"))
    for p in problems:
        ok = False
        lines.append(f"    {p}")
    return ok


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def prove(kind, trainers, engines, out, reference, seconds):
    """Runs one case, its processes given `seconds`; returns (ok, lines)."""
    import torch
    import refit
    lines = []
    spec = reference["spec"]
    with open(os.path.join(out, "spec.json"), "w") as f:
        json.dump(spec, f)
    rules = {}
    for s in spec:
        rules[s["rule"]] = rules.get(s["rule"], 0) + 1
    lines.append(f"  {len(spec)} tensors, engine rules {rules}; stacked experts: "
                 f"{[s['name'] for s in spec if '.experts.' in s['name']][:2] or 'none'}")

    coordinator = refit.Coordinator(trainer_ranks=trainers, engine_ranks=engines, refits=0, setup_timeout=120,
                                    refit_timeout=120)
    COORDINATORS.append(coordinator)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    common = ["--model", kind, "--out", out, "--address", coordinator.address, "--trainers", str(trainers),
              "--engines", str(engines), "--dist-port", str(free_port())]
    procs = {}
    try:
        for role, count in (("engine", engines), ("trainer", trainers)):
            for r in range(count):
                name = f"{role}{r}"
                with open(os.path.join(out, name + ".log"), "w") as log:  # a file, never a pipe that could fill
                    procs[name] = subprocess.Popen(
                        [sys.executable, os.path.abspath(__file__), "--role", role, "--rank", str(r)] + common,
                        env=env, stdout=log, stderr=subprocess.STDOUT)
        notes = wait_all(procs, time.monotonic() + seconds, seconds)
    finally:
        for p in procs.values():  # the driver itself failed or was interrupted: no orphans
            if p.poll() is None:
                p.kill()
                p.wait()
    ok = True
    for name, p in procs.items():
        if p.returncode != 0 or name in notes:
            ok = False
            lines.append(f"  {name} exited {p.returncode}{' ' + notes[name] if name in notes else ''}; its log's tail:")
            lines.extend(tail(out, name))
    wait = 60 if ok else 15  # after a failure: enough for the coordinator to lose the ranks (heartbeats, 10 s)
    try:
        report = coordinator.wait(wait)
    except refit.DeadlineExceededError as e:
        report = {"error": f"the job did not end within {wait} s of its processes: {e}"}
    if not ok:
        if "error" in report:
            lines.append(f"  coordinator: {report['error']}")
        return False, lines
    ok = check_report(report, spec, trainers, engines, lines) and ok

    load = lambda name: torch.load(os.path.join(out, name), weights_only=True)  # noqa: E731
    for e in range(engines):
        result = load(f"engine{e}.pt")
        if result["versions"] != VERSIONS or result["weight_version"] != VERSIONS[-1] or not result["complete"] \
                or not result["seeded"]:
            ok = False
            lines.append(f"  engine rank {e}: versions {result['versions']}, weight_version "
                         f"{result['weight_version']}, weights_complete {result['complete']}, arena seeded with "
                         f"0xEE {result['seeded']}: MISMATCH")

    # Control: FSDP2's pieces are torch.chunk of the unsharded seed-1 model (what (a) assumes).
    v0 = [load(f"trainer{r}_v0.pt") for r in range(trainers)]
    layouts = [f["layouts"] for f in v0]
    try:
        initial = gather_trainers(spec, {"layouts": layouts, "shards": [f["shards"] for f in v0]}, trainers)
        wrong = [line for s in spec if (line := describe(s["name"], initial[s["name"]],
                                                         reference["runs"][0]["params"][s["name"]],
                                                         "trainers' gathered shards", "the unsharded model's"))]
    except ProofError as e:
        wrong = [str(e)]
    placements = sorted({layouts[0][s["name"]]["placements"] for s in spec})
    lines.append(f"  gather check: the trainers' initial shards ({', '.join(placements)}) concatenate to the "
                 f"unsharded seed-1 model: " + ("bit-exact" if not wrong else "MISMATCH"))
    for line in wrong[:4]:
        ok = False
        lines.append(f"    {line}")

    model_engine, model_trainer = base.build_model(kind, seed=2), base.build_model(kind, seed=2)
    seed2_logits = base.probe_logits(model_engine)
    previous = reference["runs"][0]["logits"]  # the seed-1 model before any step
    for v in VERSIONS:
        t = [load(f"trainer{r}_v{v}.pt") for r in range(trainers)]
        shards = [load(f"engine{e}_v{v}.pt")["shards"] for e in range(engines)]
        problems = []
        try:
            gathered = gather_trainers(spec, {"layouts": layouts, "shards": [f["shards"] for f in t]}, trainers)
            assembled = assemble_engines(spec, shards, engines)
        except ProofError as e:
            ok = False
            lines.append(f"  v{v}: MISMATCH: {e}")
            continue
        for s in spec:  # (c)
            name = s["name"]
            dim = layouts[0][name]["dim"]
            line = describe(name, assembled[name], gathered[name], "engines", "trainers",
                            where=lambda index, s=s, dim=dim: holders(s, index, dim, trainers, engines))
            if line:
                problems.append(line)
        equal_tensors = len(spec) - len(problems)
        logits_engine = base.probe_logits(_loaded(model_engine, assembled))  # (d)
        again = base.probe_logits(model_engine)
        logits_trainer = base.probe_logits(_loaded(model_trainer, gathered))
        logits_equal = base.same_bits(logits_engine, logits_trainer)
        deterministic = base.same_bits(logits_engine, again)
        not_seed2 = not base.same_bits(logits_engine, seed2_logits)
        moved = not base.same_bits(logits_engine, previous)
        previous = logits_engine
        run = reference["runs"][v]
        if base.same_bits(logits_engine, run["logits"]):
            ref = "reference: bit-exact"
        else:
            differing = [n for n in gathered if not base.same_bits(gathered[n], run["params"][n])]
            weight_diff = max((max_abs_diff(gathered[n], run["params"][n]) for n in differing), default=0.0)
            ref = (f"reference: differs by {max_abs_diff(logits_engine, run['logits']):.3g} in logits, "
                   f"{len(differing)}/{len(spec)} tensors by up to {weight_diff:.3g} (FSDP2's reduction, not refit)")
        status = "ok" if not problems and logits_equal and deterministic and not_seed2 and moved else "MISMATCH"
        ok = ok and status == "ok"
        refit_seconds = max(f["refit"]["seconds"] for f in t)
        lines.append(f"  v{v}: tensors bit-exact {equal_tensors}/{len(spec)}, logits engines==trainers "
                     f"{logits_equal} (max |diff| {max_abs_diff(logits_engine, logits_trainer):.3g}), forward "
                     f"deterministic {deterministic}, differs from seed 2 {not_seed2}, moved from v{v - 1} {moved}, "
                     f"loss {t[0]['loss']:.4f} (reference {run['loss']:.4f}), refit {refit_seconds * 1e3:.1f} ms: "
                     f"{status}; {ref}")
        for line in problems[:8]:
            lines.append(f"    {line}")
        if len(problems) > 8:
            lines.append(f"    ... and {len(problems) - 8} more tensors")
    moved_storage = sorted({n for r in range(trainers) for n in load(f"trainer{r}_v1.pt")["moved_at_first_step"]})
    lines.append(f"  FSDP2 storage: {len(moved_storage)} local shards moved during the first step (lazy init, "
                 f"before registration){': ' + ', '.join(moved_storage[:4]) if moved_storage else ''}; none after "
                 "(checked by every trainer rank)")
    return ok, lines


def _loaded(model, weights):
    load_into(model, weights)
    return model


def keep_logs(out, case):
    """A failed case's process logs, copied to $OUT/fsdp-<case>/ where $OUT is a directory (the device
    tool's): the lines saying where."""
    keep = os.environ.get("OUT")
    if not keep or not os.path.isdir(keep):
        return []
    target = os.path.join(keep, f"fsdp-{case}")
    os.makedirs(target, exist_ok=True)
    logs = sorted(n for n in os.listdir(out) if n.endswith(".log"))
    for name in logs:
        shutil.copy(os.path.join(out, name), target)
    return [f"  logs of every process: {target}/ ({', '.join(logs)})"] if logs else []


def parse_cases(text):
    cases = []
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) != 3 or parts[0] not in ("llama", "qwen3_moe") or not parts[1].isdigit() \
                or not parts[2].isdigit() or int(parts[1]) < 1 or int(parts[2]) < 1:
            raise SystemExit(f"--cases: {item!r} is not model:M:N (model llama or qwen3_moe, M and N >= 1)")
        cases.append((parts[0], int(parts[1]), int(parts[2])))
    return cases


def _terminated(signum, frame):
    raise SystemExit(f"terminated by signal {signum}")  # unwinds prove(), which kills the children


def drive(args):
    cases = parse_cases(args.cases)
    check_requirements()
    import torch
    import transformers
    import refit
    signal.signal(signal.SIGTERM, _terminated)
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, refit {refit.__version__}, "
          f"{torch.cuda.get_device_name(0)}", flush=True)
    started_all = time.monotonic()
    budget_end = started_all + args.budget
    references, results = {}, []
    for kind, trainers, engines in cases:
        label = f"{kind} M={trainers} -> N={engines}"
        started = time.monotonic()
        seconds = min(CASE_DEADLINE, budget_end - started - 30)  # 30 s kept for the checks and the coordinator
        try:
            if seconds < 30:
                ok, lines = False, [f"  not run: the --budget of {args.budget} s is spent"]
            else:
                if kind not in references:
                    references[kind] = reference_run(kind)
                with tempfile.TemporaryDirectory(prefix="refit-fsdp-proof-") as out:
                    ok, lines = prove(kind, trainers, engines, out, references[kind], seconds)
                    if not ok:
                        lines.extend(keep_logs(out, f"{kind}-{trainers}-{engines}"))
        except Exception:
            ok, lines = False, ["  the driver raised:"] + ["    " + l for l in traceback.format_exc().splitlines()]
        print(f"{'PASS' if ok else 'FAIL'} {label}: FSDP2 over {trainers} gloo ranks into TP={engines} engine ranks, "
              f"cuda_ipc direct ({time.monotonic() - started:.0f} s)", flush=True)
        for line in lines:
            print(line, flush=True)
        results.append((kind, trainers, engines, ok))
    failed = [f"{k}:{m}:{n}" for k, m, n, ok in results if not ok]
    print(json.dumps({"proof": "gpu_fsdp", "seconds": round(time.monotonic() - started_all, 1),
                      "cases": [{"model": k, "trainers": m, "engines": n, "pass": ok} for k, m, n, ok in results]}))
    print(f"SUMMARY: {'PASS' if not failed else 'FAIL'}: {len(results) - len(failed)}/{len(results)} FSDP2 cases "
          f"refit bit-exactly" + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    return 0 if not failed else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["trainer", "engine"])
    parser.add_argument("--model", default="llama")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--trainers", type=int, default=2)
    parser.add_argument("--engines", type=int, default=1)
    parser.add_argument("--dist-port", type=int)
    parser.add_argument("--out")
    parser.add_argument("--address")
    parser.add_argument("--cases", default=DEFAULT_CASES, help="model:M:N,... (default %(default)s)")
    parser.add_argument("--budget", type=float, default=540,
                        help="seconds for every case together; a case that would run past it fails as not run "
                             "(default %(default)s, under bench/python_gpu.sh's 600 s timeout)")
    args = parser.parse_args()
    if args.role == "trainer":
        return run_trainer(args)
    if args.role == "engine":
        return run_engine(args)
    try:
        status = drive(args)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):  # 77: skipped, the reason printed
            raise
        print(e.code, flush=True)  # a bad --cases, or SIGTERM (the children were killed on the way out)
        print(f"SUMMARY: FAIL: {e.code}", flush=True)
        status = 1
    except BaseException:
        traceback.print_exc()
        print("SUMMARY: FAIL: the driver raised (see the traceback above)", flush=True)
        status = 1
    if any(not c.done for c in COORDINATORS):  # a failed case's job ends on its own; don't wait for it
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


if __name__ == "__main__":
    sys.exit(main() or 0)
