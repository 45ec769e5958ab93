"""The FSDP2 proof's checks (gpu_fsdp_proof.py, issue 19 item 5): how engine ranks split each
tensor, the trainers' shards gathered (torch.chunk, FSDP2's layout) and the engines' shards
assembled (refit's TP rules) on the CPU, their bit-for-bit comparison naming the first differing
element and the ranks that hold it, and the coordinator report's checks. Pure functions of the
saved shards: no process, no GPU.
"""
import os

import gpu_transformers_proof as base  # the same models, probe and bit views

VERSIONS = [1, 2, 3]
RULE_DIM = {"column": 0, "vocab": 0, "row": 1, "replicated": None}


class ProofError(Exception):
    """A check that failed; the message says what differed."""


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


def load_saved(out, name):
    """A file a role saved under `out` (torch.save of CPU tensors and plain values)."""
    import torch
    return torch.load(os.path.join(out, name), weights_only=True)


def check_engine_files(out, engines, lines):
    """Every engine rank committed every version, holds the last, complete, its arena seeded."""
    ok = True
    for e in range(engines):
        result = load_saved(out, f"engine{e}.pt")
        if result["versions"] != VERSIONS or result["weight_version"] != VERSIONS[-1] or not result["complete"] \
                or not result["seeded"]:
            ok = False
            lines.append(f"  engine rank {e}: versions {result['versions']}, weight_version "
                         f"{result['weight_version']}, weights_complete {result['complete']}, arena seeded with "
                         f"0xEE {result['seeded']}: MISMATCH")
    return ok


def check_initial_shards(out, spec, trainers, reference, lines):
    """Control: FSDP2's pieces are torch.chunk of the unsharded seed-1 model (what (a) assumes).
    Returns (the trainers' layouts, ok)."""
    v0 = [load_saved(out, f"trainer{r}_v0.pt") for r in range(trainers)]
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
    lines.extend(f"    {line}" for line in wrong[:4])
    return layouts, not wrong


def check_versions(kind, out, spec, layouts, trainers, engines, reference, lines):
    """(c) and (d) for every version, one line each; True when every version is ok."""
    ok = True
    model_engine, model_trainer = base.build_model(kind, seed=2), base.build_model(kind, seed=2)
    context = {"seed2": base.probe_logits(model_engine), "previous": reference["runs"][0]["logits"]}
    for v in VERSIONS:
        t = [load_saved(out, f"trainer{r}_v{v}.pt") for r in range(trainers)]
        shards = [load_saved(out, f"engine{e}_v{v}.pt")["shards"] for e in range(engines)]
        try:
            gathered = gather_trainers(spec, {"layouts": layouts, "shards": [f["shards"] for f in t]}, trainers)
            assembled = assemble_engines(spec, shards, engines)
        except ProofError as e:
            ok = False
            lines.append(f"  v{v}: MISMATCH: {e}")
            continue
        problems = []
        for s in spec:  # (c)
            dim = layouts[0][s["name"]]["dim"]
            line = describe(s["name"], assembled[s["name"]], gathered[s["name"]], "engines", "trainers",
                            where=lambda index, s=s, dim=dim: holders(s, index, dim, trainers, engines))
            if line:
                problems.append(line)
        version_ok, line = check_logits(v, (model_engine, model_trainer), (assembled, gathered), context,
                                         reference["runs"][v], t)
        ok = ok and version_ok and not problems
        lines.append(f"  v{v}: tensors bit-exact {len(spec) - len(problems)}/{len(spec)}, " + line +
                     ("" if not problems else " (tensors: MISMATCH)"))
        lines.extend(f"    {p}" for p in problems[:8])
        if len(problems) > 8:
            lines.append(f"    ... and {len(problems) - 8} more tensors")
    return ok


def check_logits(v, models, weights, context, run, trainer_files):
    """(d): the engines' and the trainers' weights give the same logits, bit for bit, and the controls.
    Returns (ok, the rest of the version's line)."""
    (model_engine, model_trainer), (assembled, gathered) = models, weights
    logits_engine = base.probe_logits(_loaded(model_engine, assembled))
    again = base.probe_logits(model_engine)
    logits_trainer = base.probe_logits(_loaded(model_trainer, gathered))
    logits_equal = base.same_bits(logits_engine, logits_trainer)
    deterministic = base.same_bits(logits_engine, again)
    not_seed2 = not base.same_bits(logits_engine, context["seed2"])
    moved = not base.same_bits(logits_engine, context["previous"])
    context["previous"] = logits_engine
    if base.same_bits(logits_engine, run["logits"]):
        ref = "reference: bit-exact"
    else:
        differing = [n for n in gathered if not base.same_bits(gathered[n], run["params"][n])]
        weight_diff = max((max_abs_diff(gathered[n], run["params"][n]) for n in differing), default=0.0)
        ref = (f"reference: differs by {max_abs_diff(logits_engine, run['logits']):.3g} in logits, "
               f"{len(differing)}/{len(gathered)} tensors by up to {weight_diff:.3g} (FSDP2's reduction, not refit)")
    ok = logits_equal and deterministic and not_seed2 and moved
    refit_seconds = max(f["refit"]["seconds"] for f in trainer_files)
    return ok, (f"logits engines==trainers {logits_equal} (max |diff| "
                f"{max_abs_diff(logits_engine, logits_trainer):.3g}), forward deterministic {deterministic}, "
                f"differs from seed 2 {not_seed2}, moved from v{v - 1} {moved}, loss {trainer_files[0]['loss']:.4f} "
                f"(reference {run['loss']:.4f}), refit {refit_seconds * 1e3:.1f} ms: {'ok' if ok else 'MISMATCH'}; "
                f"{ref}")


def _loaded(model, weights):
    load_into(model, weights)
    return model
