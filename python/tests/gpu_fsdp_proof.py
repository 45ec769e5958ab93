"""GPU proof of sharded trainers (issue 19 item 5): FSDP2 into engines of another TP size.

Hugging Face transformers models built from small configs in code (random
init, no downloads; gpu_transformers_proof.build_model: a Llama-style dense
model and a Qwen3-MoE model, bfloat16), sharded with FSDP2
(torch.distributed.fsdp.fully_shard: every decoder layer, then the root) over
M trainer processes of a gloo process group that share CUDA device 0, refit
into N engine processes (tensor parallel by refit's rules), M != N, every
process on GPU 0; or (issue 23 item 2, placement same or own) the M trainers
an NCCL group, one per GPU, into engines on the trainers' GPUs (same: engine
rank e on GPU e % G) or on GPUs of their own (own: GPU (M + e) % G), G the
visible GPUs; where there are fewer GPUs than trainer ranks each trainer
process gets its own NCCL_HOSTID so that NCCL lets them share a GPU. Each
case (model, M, N, placement):

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
       (each case model:M:N[:shared|same|own], shared by default; on the GPU machine:
       bash bench/python_gpu.sh fsdp, and across GPUs e.g. --cases llama:2:1:same,qwen3_moe:2:3:own)
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
from fsdp_proof_checks import (VERSIONS, ProofError, check_engine_files, check_initial_shards,  # noqa: E402
                               check_report, check_versions, engine_rule, engine_shard_shape, load_saved,
                               torch_dtype)

SKIPPED = 77
LR = 1e-2               # large enough that bf16 weights (norms at 1.0 too) move every step
BUCKET = 256 << 10      # small: the embeddings and stacked experts span several buckets
CASE_DEADLINE = 240     # seconds for one case's processes (less when --budget runs short)
GRACE = 20              # seconds the others get to stop once one process failed
DEFAULT_CASES = "llama:2:1,llama:2:3,qwen3_moe:2:3,llama:4:3,qwen3_moe:4:2"
# Every case's coordinator, kept referenced: destroying one waits for its job to end (up to its
# setup timeout after a failed case); the driver exits past those still running.
COORDINATORS = []


# ---- shared by every role ------------------------------------------------------


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


# ---- placement: which GPU each process uses -------------------------------------
# shared: every process on GPU 0, the trainers a gloo group (issue 19 item 5).
# same:   trainer rank r on GPU r % G, engine rank e on GPU e % G (the trainers' GPUs), NCCL group.
# own:    trainer rank r on GPU r % G, engine rank e on GPU (M + e) % G (GPUs of their own when
#         M + N <= G), NCCL group (issue 23 item 2). G: the visible GPUs (--gpus).
PLACEMENTS = ("shared", "same", "own")


def backend_of(placement):
    return "gloo" if placement == "shared" else "nccl"


def placed_gpu(role, rank, args):
    if args.placement == "shared":
        return 0
    if role == "trainer":
        return rank % args.gpus
    return (rank if args.placement == "same" else args.trainers + rank) % args.gpus


def nccl_env(name, trainers, gpus):
    """NCCL ranks of several processes on one GPU (more trainer ranks than GPUs): each its own
    NCCL_HOSTID, so NCCL takes them for hosts of their own (else "Duplicate GPU detected") and talks
    over sockets on loopback (tests/nccl_env.h says why)."""
    if trainers <= gpus:
        return {"NCCL_NVLS_ENABLE": "0"}
    return {"NCCL_NVLS_ENABLE": "0", "NCCL_HOSTID": f"refit-fsdp-proof-{name}-{os.getpid()}",
            "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "lo"}


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
    gpu = placed_gpu("trainer", rank, args)
    torch.cuda.set_device(gpu)
    torch.backends.cuda.matmul.allow_tf32 = False
    dist.init_process_group(backend_of(args.placement), init_method=f"tcp://127.0.0.1:{args.dist_port}", rank=rank,
                            world_size=ranks, timeout=datetime.timedelta(seconds=120))
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
                           gpu=gpu, bucket_size=BUCKET, setup_timeout=120, refit_timeout=120) as trainer:
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
    gpu = placed_gpu("engine", rank, args)
    torch.cuda.set_device(gpu)
    params = {}
    for s in spec:  # this rank's shards, in the model's order; every byte 0xEE until a refit writes it
        shape = engine_shard_shape(s["shape"], s["rule"], rank, ranks)
        dtype = torch_dtype(s["dtype"])
        numel = 1
        for d in shape:
            numel *= d
        raw = torch.full((numel * dtype.itemsize,), 0xEE, dtype=torch.uint8, device="cuda")
        params[s["name"]] = raw.view(dtype).view(shape)
    # gpu: its placement's, else engine rank e would want GPU base_gpu_id + e (DESIGN.md rule 7).
    engine = refit.Engine(args.address, params, rank=rank, trainer_ranks=args.trainers, engine_ranks=ranks,
                          transport="cuda_ipc", mode="direct", device="cuda", gpu=gpu, bucket_size=BUCKET,
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


def check_requirements(placements):
    base.check_requirements()  # torch, transformers, a CUDA device, refit with CUDA, cuda_ipc
    import torch
    import torch.distributed as dist
    if not dist.is_available():
        skip(f"torch {torch.__version__} was built without torch.distributed")
    if "shared" in placements and not dist.is_gloo_available():
        skip(f"torch {torch.__version__} has no gloo backend")
    if set(placements) - {"shared"} and not dist.is_nccl_available():
        skip(f"torch {torch.__version__} has no nccl backend (placements same and own)")
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


def prove(kind, trainers, engines, placement, out, reference, seconds):
    """Runs one case, its processes given `seconds`; returns (ok, lines)."""
    import refit
    spec = reference["spec"]
    with open(os.path.join(out, "spec.json"), "w") as f:
        json.dump(spec, f)
    rules = {}
    for s in spec:
        rules[s["rule"]] = rules.get(s["rule"], 0) + 1
    lines = [f"  {len(spec)} tensors, engine rules {rules}; stacked experts: "
             f"{[s['name'] for s in spec if '.experts.' in s['name']][:2] or 'none'}"]
    coordinator = refit.Coordinator(trainer_ranks=trainers, engine_ranks=engines, refits=0, setup_timeout=120,
                                    refit_timeout=120)
    COORDINATORS.append(coordinator)
    procs, notes = run_case(kind, trainers, engines, placement, out, coordinator.address, seconds)
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
    ok = check_report(report, spec, trainers, engines, lines)
    ok = check_engine_files(out, engines, lines) and ok
    layouts, initial_ok = check_initial_shards(out, spec, trainers, reference, lines)
    ok = initial_ok and ok
    ok = check_versions(kind, out, spec, layouts, trainers, engines, reference, lines) and ok
    moved = sorted({n for r in range(trainers) for n in load_saved(out, f"trainer{r}_v1.pt")["moved_at_first_step"]})
    lines.append(f"  FSDP2 storage: {len(moved)} local shards moved during the first step (lazy init, "
                 f"before registration){': ' + ', '.join(moved[:4]) if moved else ''}; none after "
                 "(checked by every trainer rank)")
    return ok, lines


def run_case(kind, trainers, engines, placement, out, address, seconds):
    """Starts the case's engine and trainer processes (this script, --role) and waits for them;
    returns ({name: process}, {name: note}). No process outlives it."""
    import torch
    gpus = torch.cuda.device_count()
    common = ["--model", kind, "--out", out, "--address", address, "--trainers", str(trainers),
              "--engines", str(engines), "--dist-port", str(free_port()), "--placement", placement,
              "--gpus", str(gpus)]
    procs = {}
    try:
        for role, count in (("engine", engines), ("trainer", trainers)):
            for r in range(count):
                name = f"{role}{r}"
                env = dict(os.environ, PYTHONUNBUFFERED="1", **nccl_env(name, trainers, gpus))
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
    return procs, notes


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
        placement = parts[3] if len(parts) == 4 else "shared"
        if len(parts) not in (3, 4) or parts[0] not in ("llama", "qwen3_moe") or not parts[1].isdigit() \
                or not parts[2].isdigit() or int(parts[1]) < 1 or int(parts[2]) < 1 or placement not in PLACEMENTS:
            raise SystemExit(f"--cases: {item!r} is not model:M:N[:placement] (model llama or qwen3_moe, M and "
                             f"N >= 1, placement one of {', '.join(PLACEMENTS)})")
        cases.append((parts[0], int(parts[1]), int(parts[2]), placement))
    return cases


def placement_text(placement, trainers, engines, gpus):
    """Where the case's processes ran: "trainers on GPUs [0, 1], engines on GPUs [2]"."""
    args = argparse.Namespace(placement=placement, trainers=trainers, gpus=max(gpus, 1))
    t = [placed_gpu("trainer", r, args) for r in range(trainers)]
    e = [placed_gpu("engine", r, args) for r in range(engines)]
    return f"trainers on GPUs {t}, engines on GPUs {e}"


def _terminated(signum, frame):
    raise SystemExit(f"terminated by signal {signum}")  # unwinds prove(), which kills the children


def drive(args):
    cases = parse_cases(args.cases)
    check_requirements({c[3] for c in cases})
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
    gpus = torch.cuda.device_count()
    for kind, trainers, engines, placement in cases:
        label = f"{kind} M={trainers} -> N={engines}" + ("" if placement == "shared" else f" {placement} GPUs")
        started = time.monotonic()
        seconds = min(CASE_DEADLINE, budget_end - started - 30)  # 30 s kept for the checks and the coordinator
        try:
            if seconds < 30:
                ok, lines = False, [f"  not run: the --budget of {args.budget} s is spent"]
            else:
                if kind not in references:
                    references[kind] = reference_run(kind)
                with tempfile.TemporaryDirectory(prefix="refit-fsdp-proof-") as out:
                    ok, lines = prove(kind, trainers, engines, placement, out, references[kind], seconds)
                    if not ok:
                        lines.extend(keep_logs(out, f"{kind}-{trainers}-{engines}-{placement}"))
        except Exception:
            ok, lines = False, ["  the driver raised:"] + ["    " + l for l in traceback.format_exc().splitlines()]
        where = placement_text(placement, trainers, engines, gpus)
        print(f"{'PASS' if ok else 'FAIL'} {label}: FSDP2 over {trainers} {backend_of(placement)} ranks into "
              f"TP={engines} engine ranks, cuda_ipc direct, {where} ({time.monotonic() - started:.0f} s)", flush=True)
        for line in lines:
            print(line, flush=True)
        results.append((kind, trainers, engines, placement, ok))
    failed = [f"{k}:{m}:{n}:{p}" for k, m, n, p, ok in results if not ok]
    print(json.dumps({"proof": "gpu_fsdp", "seconds": round(time.monotonic() - started_all, 1), "gpus": gpus,
                      "cases": [{"model": k, "trainers": m, "engines": n, "placement": p, "pass": ok}
                                for k, m, n, p, ok in results]}))
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
    parser.add_argument("--placement", choices=PLACEMENTS, default="shared")
    parser.add_argument("--gpus", type=int, default=1)
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
