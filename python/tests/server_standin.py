"""Stand-ins for vLLM's and SGLang's weight-update hooks, for refit.adapters' proof and
speed bench (gpu_adapters_proof.py, gpu_adapters_bench.py). Small on purpose; what each
piece stands in for:

  FusedModel       a served model whose load_weights(weights) behaves as vLLM's
                   LlamaForCausalLM / Qwen3MoeForCausalLM (and SGLang's) at TP 1:
                   checkpoint q_proj/k_proj/v_proj rows go into one fused
                   self_attn.qkv_proj.weight (q, k, v), gate_proj/up_proj into
                   mlp.gate_up_proj.weight (gate, up), expert e's gate/up into rows
                   [e, :I] / [e, I:] of mlp.experts.w13_weight [E, 2I, H] and its
                   down_proj into mlp.experts.w2_weight[e] [H, I], everything else by
                   name; each through param.data[...].narrow(...).copy_(loaded) after a
                   shape check, with the parameter dict looked up per call. from_hf()
                   wraps a Hugging Face model whose parameters become views into these
                   fused parameters, so its own forward serves the loaded weights.
  VllmWorker       a vLLM GPU worker: model_runner.model, device, rank, with the
                   worker_extension_cls mixed in as WorkerWrapperBase.init_worker does
                   (non-dunder name-conflict check, then appended to __bases__);
                   collective_rpc(worker, method, args, kwargs) runs
                   getattr(worker, method)(*args, **kwargs) as each worker does.
  SglangEngine     sglang.Engine.update_weights_from_tensor(named_tensors, load_format,
                   flush_cache) -> (success, message), dispatching on load_format as
                   ModelRunner.update_weights_from_tensor does (a registered custom
                   loader by dotted path as fn(model, named_tensors), None ->
                   model.load_weights), then a cache flush (a counter) when asked.

Left out: processes (one worker, TP 1, all in one process: no msgpack, no
ForkingPickler/CUDA-IPC serialization of the pairs, no scheduler or tokenizer
manager), KV caches, CUDA graphs and torch.compile, quantization and
process_weights_after_loading, TP sharding inside weight loaders, vLLM's
name remapping of kv scales and rotary buffers, and vLLM's cost of string
matching per tensor (routes are computed once here). The model's forward is
the Hugging Face one, not vLLM's fused kernels.
"""
import importlib
import re

import torch
from torch import nn

# (checkpoint part, fused part, shard index): vLLM's stacked_params_mapping, by rows.
_STACKED = ((".q_proj.", ".qkv_proj.", 0), (".k_proj.", ".qkv_proj.", 1), (".v_proj.", ".qkv_proj.", 2),
            (".gate_proj.", ".gate_up_proj.", 0), (".up_proj.", ".gate_up_proj.", 1))
_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def checkpoint_tensors(model):
    """[(checkpoint name, tensor)] of a Hugging Face model, as its checkpoint names them:
    transformers 5's stacked experts (experts.gate_up_proj [E, 2I, H], experts.down_proj
    [E, H, I]) as per-expert views experts.{e}.gate_proj/up_proj/down_proj.weight."""
    out = []
    for name, p in model.named_parameters():
        if name.endswith(".experts.gate_up_proj") and p.dim() == 3:
            prefix, rows = name[:-len(".gate_up_proj")], p.shape[1] // 2
            for e in range(p.shape[0]):
                out += [(f"{prefix}.{e}.gate_proj.weight", p.data[e, :rows]),
                        (f"{prefix}.{e}.up_proj.weight", p.data[e, rows:])]
        elif name.endswith(".experts.down_proj") and p.dim() == 3:
            prefix = name[:-len(".down_proj")]
            out += [(f"{prefix}.{e}.down_proj.weight", p.data[e]) for e in range(p.shape[0])]
        else:
            out.append((name, p.data))
    return out


def _route(name):
    """(fused parameter name, expert or None, shard index or None) of a checkpoint name."""
    m = _EXPERT.match(name)
    if m:
        prefix, e, part = m.group(1), int(m.group(2)), m.group(3)
        if part == "down_proj":
            return prefix + ".w2_weight", e, None
        return prefix + ".w13_weight", e, 0 if part == "gate_proj" else 1
    for ckpt, fused, shard in _STACKED:
        if ckpt in name:
            return name.replace(ckpt, fused), None, shard
    return name, None, None


class FusedModel(nn.Module):
    """Fused parameters for checkpoint specs [(name, dtype, shape)]; see the module doc.
    computing=True: load_weights casts each tensor through float32 before its copy
    (the same values, but a loader that computes: LoaderCapture must refuse it)."""

    def __init__(self, specs, device="cuda", computing=False):
        super().__init__()
        self.computing = computing
        self.load_calls = 0
        shapes, self._routes = {}, {}
        for name, dtype, shape in specs:
            fused, expert, shard = _route(name)
            shapes.setdefault(fused, {"dtype": dtype, "parts": {}})["parts"][(expert, shard)] = tuple(shape)
            self._routes[name] = (fused, expert, shard)
        self._offsets = {}
        for fused, info in shapes.items():
            parts = info["parts"]
            experts = sorted({e for e, _ in parts if e is not None})
            shards = sorted({s for _, s in parts if s is not None})
            one = parts[next(iter(parts))]
            rows = {s: next(shape for (e, sh), shape in parts.items() if sh == s)[0] for s in shards}
            starts = {s: sum(rows[t] for t in shards if t < s) for s in shards}
            self._offsets[fused] = (starts, rows)
            shape = ((sum(rows.values()),) + one[1:]) if shards else one
            if experts:
                shape = (len(experts),) + shape
            self._register(fused, torch.empty(shape, dtype=info["dtype"], device=device))

    def _register(self, name, tensor):
        module_name, _, leaf = name.rpartition(".")
        module = self
        for part in module_name.split(".") if module_name else []:
            if not hasattr(module, part):
                module.add_module(part, nn.Module())
            module = getattr(module, part)
        setattr(module, leaf, nn.Parameter(tensor, requires_grad=False))

    def target(self, name, params=None):
        """The piece of a fused parameter that checkpoint tensor `name` loads into."""
        fused, expert, shard = self._routes[name]
        dst = (params or dict(self.named_parameters()))[fused].data
        if expert is not None:
            dst = dst[expert]
        if shard is not None:
            starts, rows = self._offsets[fused]
            dst = dst.narrow(0, starts[shard], rows[shard])
        return dst

    def checkpoint_targets(self):
        """[(checkpoint name, target)] for refit's copy mode (Engine with tensors)."""
        params = dict(self.named_parameters())
        return [(name, self.target(name, params)) for name in self._routes]

    def load_weights(self, weights):
        """vLLM's model.load_weights(weights): weights is an iterable of (name, tensor)."""
        self.load_calls += 1
        params = dict(self.named_parameters())  # as vLLM's loaders do, on each call
        loaded = set()
        for name, loaded_weight in weights:
            dst = self.target(name, params)  # KeyError: a name this model does not have
            if dst.shape != loaded_weight.shape:
                raise ValueError(f"{name}: loaded {tuple(loaded_weight.shape)} into {tuple(dst.shape)}")
            dst.copy_(loaded_weight.float() if self.computing else loaded_weight)
            loaded.add(self._routes[name][0])
        return loaded

    @classmethod
    def from_hf(cls, hf, computing=False):
        """Wraps a Hugging Face model (as self.hf): fused parameters with its current
        values, and its parameters replaced by views of them."""
        tensors = checkpoint_tensors(hf)
        model = cls([(n, t.dtype, tuple(t.shape)) for n, t in tensors], device=tensors[0][1].device,
                    computing=computing)
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, t in tensors:
                model.target(name, params).copy_(t)
            for name, p in list(hf.named_parameters()):
                if name.endswith(".experts.gate_up_proj") and p.dim() == 3:
                    view = params[name[:-len(".gate_up_proj")] + ".w13_weight"].data
                elif name.endswith(".experts.down_proj") and p.dim() == 3:
                    view = params[name[:-len(".down_proj")] + ".w2_weight"].data
                else:
                    view = model.target(name, params)
                owner, _, leaf = name.rpartition(".")
                setattr(hf.get_submodule(owner), leaf, nn.Parameter(view, requires_grad=False))
        model.hf = hf.eval()
        return model

    def reallocate(self, name):
        """A server re-allocating one by-name parameter (new memory, same values), its
        Hugging Face view included: the layout change LoaderCapture must notice."""
        owner, _, leaf = name.rpartition(".")
        fresh = nn.Parameter(self.get_parameter(name).detach().clone(), requires_grad=False)
        setattr(self.get_submodule(owner), leaf, fresh)
        if hasattr(self, "hf"):
            setattr(self.hf.get_submodule(owner), leaf, nn.Parameter(fresh.data, requires_grad=False))


class VllmWorkerBase:
    """What a vLLM GPU worker offers an extension (WorkerBase's attributes)."""

    def __init__(self, model, rank=0):
        self.rank, self.local_rank = rank, 0
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
        self.model_runner = type("ModelRunner", (), {})()
        self.model_runner.model = model


def make_vllm_worker(model, extension_cls, rank=0):
    """A worker with extension_cls mixed in as vLLM does (a fresh class per call)."""
    worker_class = type("VllmWorker", (VllmWorkerBase,), {})
    for attr in dir(extension_cls):
        if not attr.startswith("__"):
            assert not hasattr(worker_class, attr), f"worker already has {attr}, which the extension defines"
    worker_class.__bases__ = worker_class.__bases__ + (extension_cls,)
    return worker_class(model, rank)


def collective_rpc(worker, method, args=(), kwargs=None):
    """LLM.collective_rpc for one worker: [result]."""
    return [getattr(worker, method)(*args, **(kwargs or {}))]


class SglangEngine:
    """sglang.Engine's update_weights_from_tensor, in process."""

    def __init__(self, model, custom_weight_loader=()):
        self.model = model
        self.custom_weight_loader = list(custom_weight_loader)
        self.flushes = 0

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
        named_tensors = [(name, t.to(device)) for name, t in named_tensors]  # _unwrap_tensor
        try:
            if load_format in self.custom_weight_loader:
                module, _, fn = load_format.rpartition(".")
                getattr(importlib.import_module(module), fn)(self.model, named_tensors)
            elif load_format is None:
                self.model.load_weights(named_tensors)
            else:
                raise NotImplementedError(f"Unknown load_format={load_format}")
        except Exception as e:  # the scheduler reports a failed update and skips the flush
            return False, f"{type(e).__name__}: {e}"
        if flush_cache:
            self.flushes += 1
        return True, "Success"
