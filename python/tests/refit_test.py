"""Refits across processes through the Python binding, verified byte for byte.

A coordinator, the trainer ranks and the engine ranks are separate Python
processes (job.py). Trainers hold numpy arrays (the full tensors) and
overwrite them in place before every version; engines save what they hold
after each committed version; this process compares the engines' arrays with
the matching shard of the trainers' arrays of the same version, byte for
byte. Each test names the mutations it catches.
"""
import os
import tempfile
import unittest

try:
    import numpy as np
except ImportError:
    np = None

import job


def _bytes(array):
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


@unittest.skipIf(np is None, "numpy is not installed for this python (Debian: python3-numpy)")
class RefitAcrossProcesses(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="refit-py-")
        self.out = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def run_job(self, trainer_ranks, engine_ranks, versions, **config):
        j = job.Job(self.out, trainer_ranks=trainer_ranks, engine_ranks=engine_ranks, versions=versions, **config)
        for e in range(engine_ranks):
            j.start("engine", e)
        for t in range(trainer_ranks):
            j.start("trainer", t)
        exits = j.wait()
        for name, (code, err) in exits.items():
            self.assertEqual(code, 0, f"{name} exited {code}:\n{err}")
            result = j.result(name)
            self.assertIsNotNone(result, f"{name} wrote no result:\n{err}")
            self.assertNotIn("error_class", result, f"{name} failed: {result.get('message')}")
        return j

    def check_bytes(self, j, trainer_ranks, engine_ranks, versions, model=job.MODEL, engine_experts=None):
        """Every engine rank holds exactly its shard of every trainer array, each version."""
        for v in versions:
            # Trainers feeding different engine ranks hold the same full tensors (gathered weights).
            full = np.load(os.path.join(self.out, f"trainer0_v{v}.npz"))
            for t in range(1, trainer_ranks):
                other = np.load(os.path.join(self.out, f"trainer{t}_v{v}.npz"))
                for spec in model:
                    np.testing.assert_array_equal(_bytes(other[spec["name"]]), _bytes(full[spec["name"]]))
            for e in range(engine_ranks):
                got = np.load(os.path.join(self.out, f"engine{e}_v{v}.npz"))
                for spec in model:
                    rule = job.engine_rule(model, spec, e, engine_ranks, engine_experts)
                    want = job.shard(full[spec["name"]], rule, e, engine_ranks)
                    self.assertEqual(got[spec["name"]].shape, want.shape, spec["name"])
                    self.assertEqual(got[spec["name"]].dtype, want.dtype, spec["name"])
                    self.assertTrue(np.array_equal(_bytes(got[spec["name"]]), _bytes(want)),
                                    f"engine rank {e}, version {v}: '{spec['name']}' differs from the trainer's")

    def check_loader_calls(self, engine, versions):
        """One load_fn call per dtype group (rule 5); every tensor exactly once per version."""
        calls = engine["calls"]
        names = [n for call in calls for n in call["names"]]
        self.assertEqual(sorted(names), sorted([t["name"] for t in job.MODEL] * len(versions)))
        for call in calls:
            self.assertEqual(len(call["dtypes"]), 1, f"a load_fn call mixed dtypes: {call}")
        self.assertEqual(engine["posts"], len(calls))

    # Mutations caught: a view of the wrong slot, offset or reassembly buffer (bytes differ); the
    # arrays read once at registration instead of at each refit (versions 2 and 3 differ); a
    # load_fn call per tensor or per batch instead of per dtype group; views that stay valid after
    # load_fn (the kept view must refuse export); next() not returning None at shutdown (the engine
    # process would hang and be killed at the deadline).
    def test_tp1_loader_three_versions_bit_exact(self):
        versions = [1, 2, 3]
        j = self.run_job(1, 1, versions)
        self.check_bytes(j, 1, 1, versions)
        engine = j.result("engine0")
        self.assertEqual(engine["versions"], versions)
        self.assertEqual(engine["weight_version"], 3)
        # Rule 9: on_commit (the cache flush) exactly once per committed refit, with its version.
        # Tried once: the on_commit call left out of next() in engine_binding.cc failed here.
        self.assertEqual(engine["flushes"], versions)
        self.assertEqual(engine["cache_flushes"], len(versions))
        self.check_loader_calls(engine, versions)
        self.assertTrue(engine["expired"], "a staging view was still exportable after its load_fn call")
        self.assertEqual(j.result("trainer0")["committed"], 3)
        report = j.result("coordinator")
        self.assertNotIn("error", report)
        self.assertEqual([r["version"] for r in report["refits"]], versions)

    # `verified` means every byte was compared and matched: a job that ends before its first refit
    # compared nothing, so its report says false. Mutation caught (tried): the coordinator's
    # `!report_["refits"].empty()` left out of the report's `verified`.
    def test_a_job_without_a_refit_is_not_verified(self):
        j = self.run_job(1, 1, [])
        report = j.result("coordinator")
        self.assertNotIn("error", report)
        self.assertEqual(report["refits"], [])
        self.assertFalse(report["verified"], report)

    # Mutations caught: payload[r] taken from another rank (rule 8: rank 1 would hold rank 0's
    # shards); the row rule sliced along dim 0; uneven splits cut evenly (the 7- and 11-row tensors);
    # a loader that only works over shm.
    def test_tp2_column_row_vocab_over_tcp(self):
        versions = [1, 2]
        j = self.run_job(2, 2, versions, transport="tcp")
        self.check_bytes(j, 2, 2, versions)
        for e in range(2):
            engine = j.result(f"engine{e}")
            self.assertEqual(engine["versions"], versions)
            self.check_loader_calls(engine, versions)

    # Partial refits (issue 22): refit(v, only=[...]) from version 2 on. The report says what moved,
    # load_fn sees only the selected tensors from version 2 on (every tensor at version 1, which moves
    # every tensor: the engines hold nothing yet), and each engine rank holds the selected tensors at v
    # and the others as version 1 left them, byte for byte. Mutations caught: the binding dropping
    # `only` (load_fn sees every tensor; tried), the report's `only` not filled.
    # With shadow=True (refit.Engine's ShadowEngine) each partial refit lands in the arena not served
    # after the other tensors were copied in from the served one: the flip serves a whole version.
    # Mutation caught (tried): no catch-up (the shadow engine serves zeros beside the moved tensors).
    def test_partial_refits_move_only_the_selected_tensors(self):
        for shadow in (False, True):
            with self.subTest(shadow=shadow):
                self._partial_refits(shadow)

    # A glob that selects none of the stream's tensors is refused by refit() itself, naming the glob,
    # before it asks the coordinator for anything: no aborted refit. Mutation caught (tried): the
    # trainer's select_tensors check left out (the refit was asked for, then failed at its start).
    def test_a_partial_refit_of_a_glob_that_selects_nothing_is_refused_before_it_is_asked(self):
        j = job.Job(self.out, trainer_ranks=1, engine_ranks=1, versions=[1, 2], only=["*nothing*"])
        j.start("engine", 0)
        j.start("trainer", 0)
        j.wait()
        trainer = j.result("trainer0")
        self.assertEqual(trainer["versions"], [1], trainer)
        self.assertEqual(trainer.get("error_class"), "InvalidArgumentError", trainer)
        self.assertIn("glob '*nothing*' selects none", trainer["message"])
        self.assertEqual(j.result("coordinator")["failures"], [], "the refit was never asked for")

    def _partial_refits(self, shadow):
        versions, only = [1, 2, 3], ["*.q_proj.*", "*layernorm*"]
        self.out = tempfile.mkdtemp(prefix="partial-", dir=self._tmp.name)
        j = self.run_job(2, 2, versions, only=only, shadow=shadow)
        selected = {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.bias",
                    "model.layers.0.input_layernorm.weight"}
        for t in range(2):
            self.assertEqual(j.result(f"trainer{t}")["only"], [[], sorted(only), sorted(only)])
        first = np.load(os.path.join(self.out, "trainer0_v1.npz"))
        for e in range(2):
            engine = j.result(f"engine{e}")
            self.assertEqual(engine["versions"], versions)
            self.assertEqual(engine["last_only"], [[], sorted(only), sorted(only)])  # Engine.last_only
            for call in engine["calls"]:
                if call["version"] > 1:
                    self.assertLessEqual(set(call["names"]), selected, call)
            if not shadow:
                moved = {n for c in engine["calls"] if c["version"] == 3 for n in c["names"]}
                self.assertEqual(moved, selected)
            for v in versions:
                full = np.load(os.path.join(self.out, f"trainer0_v{v}.npz"))
                got = np.load(os.path.join(self.out, f"engine{e}_v{v}.npz"))
                for spec in job.MODEL:
                    source = full if spec["name"] in selected else first
                    want = job.shard(source[spec["name"]], job.engine_rule(job.MODEL, spec, e, 2, None), e, 2)
                    self.assertTrue(np.array_equal(_bytes(got[spec["name"]]), _bytes(want)),
                                    f"engine rank {e}, version {v}: '{spec['name']}'")

    # Expert-parallel engines (engine_experts="ep"): each engine rank holds whole experts (2 and 1 of
    # 3 over 2 ranks), declaring the others with 0 rows; the router keeps its rule. Mutations caught:
    # the binding not passing engine_experts (the trainer splits the experts by their TP rules: the
    # streams differ and setup refuses the job, naming the first expert tensor; tried).
    def test_expert_parallel_engines_hold_whole_experts(self):
        versions = [1, 2]
        j = self.run_job(2, 2, versions, model=job.MOE_MODEL, engine_experts="ep")
        self.check_bytes(j, 2, 2, versions, model=job.MOE_MODEL, engine_experts="ep")

    # Sharded trainers (issue 19): each trainer process registers only its own torch.chunk pieces
    # (explicit (name, local, full_shape, dim, index, count) entries; Shard(1) for row weights,
    # Shard(0) otherwise, the scalar a full replicated entry) and never holds the rest; the engines'
    # bytes must equal the shards of the full arrays. 4 trainers over [6]-long tensors leave the
    # last rank an empty piece. Mutations caught: the binding dropping the layouts, so each local
    # piece is sent as if it were the full tensor (tried: engine rank 0's o_proj differs in both
    # cases); a trainer registering another rank's piece (bytes differ).
    def test_sharded_trainers_register_only_their_own_chunks(self):
        versions = [1, 2]
        for trainers, engines, transport in ((3, 2, "shm"), (4, 3, "tcp")):
            with self.subTest(trainers=trainers, engines=engines, transport=transport):
                j = self.run_job(trainers, engines, versions, transport=transport, sharded=True)
                self.check_bytes(j, trainers, engines, versions)
                report = j.result("coordinator")  # verified here by check_bytes: a load_fn engine has no check
                self.assertEqual(report["refits"][-1]["version"], versions[-1], report)
                self.assertEqual(report["gathered_bytes"], 0)
                self.assertEqual(report["duplicate_bytes"], 0)
                for name in os.listdir(self.out):
                    os.remove(os.path.join(self.out, name))

    # Mutations caught: a local piece of the wrong shape accepted (it would be read past its end).
    def test_a_piece_of_the_wrong_shape_is_refused_naming_the_tensor(self):
        import refit
        with self.assertRaises(refit.InvalidArgumentError) as caught:
            refit.Trainer("127.0.0.1:1", [("w", np.zeros((3, 3), dtype=np.float32), (5, 3), 0, 1, 2)], rank=1,
                          trainer_ranks=2, engine_ranks=1)
        self.assertIn("tensor 'w': rank 1 of 2 holds", str(caught.exception))
        self.assertIn("gives it", str(caught.exception))

    # Mutations caught: copy mode writing to the wrong registered tensor or not at all (the 0xEE
    # fill would remain); the copy done on a slot after it was recycled (poisoned bytes).
    def test_copy_into_registered_numpy_arrays(self):
        versions = [1, 2]
        j = self.run_job(1, 1, versions, params="tensors")
        self.check_bytes(j, 1, 1, versions)
        engine = j.result("engine0")
        self.assertEqual(engine["versions"], versions)
        self.assertEqual(engine["calls"], [])

    # Shadow weights (issue 21): each version reaches on_flip with weights() already that version's
    # and weight_version already bumped (the flip as the server sees it), the arenas alternate and
    # cost twice the weights. Mutations caught (each tried once): weights() handing out the landing
    # arena (store would hold the version before); the binding's weight_version bumped after
    # on_flip; ShadowEngine::begin copying into the served arena.
    def test_shadow_weights_flip_at_on_flip(self):
        versions = [1, 2, 3]
        j = self.run_job(2, 2, versions, shadow=True)
        self.check_bytes(j, 2, 2, versions)
        for e in range(2):
            engine = j.result(f"engine{e}")
            self.assertEqual(engine["flips"], [[v, v, v - 1] for v in versions])
            self.assertTrue(engine["complete"])
            nbytes = sum(np.load(os.path.join(self.out, f"engine{e}_v1.npz"))[t["name"]].nbytes for t in job.MODEL)
            self.assertGreaterEqual(engine["weight_memory_bytes"], 2 * nbytes)

    # Direct mode over ucx: the engine exposes both arenas as one region and the trainers write
    # the arena each start names. Mutations caught: the binding exposing one arena (the trainers'
    # writes to arena 1 fall outside the region: every refit fails), weights() reading the landing
    # arena (the bytes saved at each flip would be the version before). Tried once: the binding
    # exposing the served arena's bytes only failed at setup (direct mode needs both arenas).
    def test_shadow_weights_in_direct_mode_flip_at_on_flip(self):
        import refit
        if not any(t.name == "ucx" and t.available for t in refit.transports()):
            self.skipTest("this build has no ucx (the transport here that exposes an engine's weights on the CPU)")
        versions = [1, 2, 3]
        j = self.run_job(2, 2, versions, shadow=True, mode="direct", transport="ucx")
        self.check_bytes(j, 2, 2, versions)
        for e in range(2):
            engine = j.result(f"engine{e}")
            self.assertEqual(engine["flips"], [[v, v, v - 1] for v in versions])
            self.assertTrue(engine["complete"])

    # Release between refits (colocated jobs): when Trainer.refit() and Engine.next() return, no
    # process maps a receive pool any more (shm: the pool's memfd, in /proc/self/maps), every
    # version still arrives whole, and the report gives each engine rank's returned bytes. The
    # same job without release keeps the pools mapped: the check sees them. Mutations caught: a
    # trainer that keeps its target (its mapping stays), an engine that keeps its pool, an acquire
    # that does not open the new pool (the next refit fails). Tried once: the trainer's
    # target_.reset() left out kept 1 mapping per trainer rank after every refit.
    # With shadow weights (staged) each engine rank also returns its arena not served: more bytes.
    def test_release_between_refits_unmaps_every_pool_between_refits(self):
        versions = [1, 2, 3]
        returned = {}
        for release, shadow in ((True, False), (True, True), (False, False)):
            j = self.run_job(2, 2, versions, release=release, shadow=shadow)
            self.check_bytes(j, 2, 2, versions)
            for name in ("trainer0", "trainer1", "engine0", "engine1"):
                maps = j.result(name)["pool_maps"]
                self.assertEqual(len(maps), len(versions), name)
                if release:
                    self.assertEqual(maps, [0] * len(versions), f"{name} still maps a receive pool after a refit")
                else:
                    self.assertTrue(all(m > 0 for m in maps), f"{name}: without release the pool stays mapped")
            refits = j.result("coordinator")["refits"]
            if release:
                self.assertEqual([len(r["released_bytes"]) for r in refits], [2] * len(versions))
                self.assertTrue(all(b > 0 for r in refits for b in r["released_bytes"]))
                returned[shadow] = refits[-1]["released_bytes"]
            else:
                self.assertTrue(all("released_bytes" not in r for r in refits))
        for e in range(2):
            self.assertGreater(returned[True][e], returned[False][e], "the shadow arena not served was kept")

    # Mutations caught (set_targets, for refit.adapters' LoaderCapture): set_targets keeping the old
    # targets or writing none (versions 2 and 3 would stay 0xEE in the fused slices: tried once by
    # leaving engine_->set_targets out of engine_binding.cc); next() without load_fn still calling
    # a loader (calls would hold versions 2 and 3).
    def test_set_targets_turns_a_loader_engine_into_copy_mode(self):
        versions = [1, 2, 3]
        j = self.run_job(1, 1, versions, params="retarget")
        self.check_bytes(j, 1, 1, versions)
        engine = j.result("engine0")
        self.assertEqual(engine["versions"], versions)
        self.assertEqual(sorted(n for call in engine["calls"] for n in call["names"]),
                         sorted(t["name"] for t in job.MODEL), "the loader runs for version 1 only")


@unittest.skipIf(np is None, "numpy is not installed for this python (Debian: python3-numpy)")
class OneProcess(unittest.TestCase):
    """Coordinator, trainer (a thread) and engine (this thread) in one interpreter."""

    # Mutations caught: the GIL held during Trainer.refit or Engine.next (the engine's load_fn
    # needs it while the trainer waits inside refit: a deadlock until the 10 s bucket deadline,
    # so the job fails instead of finishing in time); a Coordinator whose wait() holds the GIL.
    def test_trainer_and_engine_threads_share_the_gil(self):
        import threading
        import time
        import refit
        coordinator = refit.Coordinator(1, 1, setup_timeout=20, refit_timeout=20)
        full = {"w": np.zeros((64, 33), np.float32), "b": np.zeros(70, np.int16)}
        got = {name: np.zeros_like(a) for name, a in full.items()}
        errors = []

        def trainer():
            try:
                with refit.Trainer(coordinator, full, bucket_size=4096, bucket_timeout=10, refit_timeout=20) as t:
                    for v in (1, 2):
                        for a in full.values():
                            a[...] = np.arange(a.size).reshape(a.shape) * (v + 1)
                        t.refit(v)
            except refit.Error as e:
                errors.append(e)

        def load(items):
            for name, view in items:
                time.sleep(0.01)  # Python work with the GIL while the trainer thread waits
                np.copyto(got[name], np.from_dlpack(view))

        started = time.monotonic()
        thread = threading.Thread(target=trainer)
        thread.start()
        versions = []
        with refit.Engine(coordinator, [(n, a.dtype, a.shape) for n, a in full.items()], bucket_size=4096,
                          bucket_timeout=10, refit_timeout=20) as engine:
            while (v := engine.next(load)) is not None:
                versions.append(v)
                for name, a in full.items():
                    self.assertTrue(np.array_equal(got[name], np.arange(a.size).reshape(a.shape) * (v + 1)), name)
            self.assertIsNone(engine.next(load))  # after the end, next() keeps saying so
        thread.join(30)
        self.assertEqual(errors, [])
        self.assertEqual(versions, [1, 2])
        self.assertNotIn("error", coordinator.wait(10))
        self.assertLess(time.monotonic() - started, 10)

    # set_targets errors name the engine rank and the tensor, and a refused call keeps the old
    # targets. Mutations caught: a missing, doubled, unknown or mistyped target accepted (each
    # would copy out of bounds or leave a tensor unwritten).
    def test_set_targets_refuses_a_wrong_target_naming_it(self):
        import threading
        import refit
        coordinator = refit.Coordinator(1, 1, setup_timeout=20, refit_timeout=20)
        full = {"a": np.zeros((2, 3), np.float32), "b": np.zeros(4, np.float16)}
        thread = threading.Thread(target=lambda: _one_refit(coordinator, full))
        thread.start()
        errors = {}
        with refit.Engine(coordinator, [(n, a.dtype, a.shape) for n, a in full.items()], refit_timeout=20) as engine:
            a, b = np.zeros((2, 3), np.float32), np.zeros(4, np.float16)
            for pairs, want in (([("a", a)], "no target for 'b'"),
                                ([("a", a), ("b", np.zeros(4, np.float32))], "'b' is float32 of 16 bytes"),
                                ([("a", a), ("c", b)], "'c' is not a tensor"),
                                ([("a", a), ("a", a)], "'a' given twice")):
                try:
                    engine.set_targets(pairs)
                    errors[want] = "accepted"
                except refit.InvalidArgumentError as e:
                    errors[want] = str(e)
            engine.set_targets([("b", b), ("a", a)])  # any order
            self.assertEqual(engine.next(), 1)
            self.assertIsNone(engine.next())
        thread.join(30)
        for want, got in errors.items():
            self.assertIn(want, got)
            self.assertIn("engine rank 0", got)
        self.assertTrue(np.array_equal(a, full["a"] + 1) and np.array_equal(b, full["b"] + 1))

    # bf16/fp32 trainers into FP8 engines (quantize="fp8-block128"): the engine declares the codes
    # and scales, and holds after each version exactly what an independent numpy quantization
    # from the format gives (amax per 128x128 block, s = max(amax, 1e-12) / 448 in fp32, codes by
    # nearest-even search over every finite e4m3 value, saturating at 448); the norm is copied.
    # Mutations caught: the binding not passing quantize (the trainer's stream keeps float32: setup
    # refuses the job naming the tensor; tried), codes or scales of another version or block.
    def test_a_quantizing_trainer_feeds_an_fp8_engine(self):
        import ctypes
        import threading
        import refit
        coordinator = refit.Coordinator(1, 1, setup_timeout=20, refit_timeout=20)
        full = {"layers.0.q_proj.weight": np.zeros((256, 200), np.float32),
                "layers.0.input_layernorm.weight": np.zeros(200, np.float32)}
        errors, sent = [], {}

        def trainer():
            try:
                with refit.Trainer(coordinator, full, quantize="fp8-block128", bucket_size=8192) as t:
                    for v in (1, 2):
                        rng = np.random.default_rng(v)
                        for a in full.values():
                            a[...] = rng.standard_normal(a.shape, np.float32) * (v * 3)
                        full["layers.0.q_proj.weight"][5, 7] = 0.0 if v == 1 else -0.0
                        sent[v] = {name: a.copy() for name, a in full.items()}  # the engine compares after
                        t.refit(v)
            except refit.Error as e:
                errors.append(e)

        got = {}

        def load(items):
            for name, view in items:
                got[name] = ctypes.string_at(view.data_ptr, view.nbytes)

        thread = threading.Thread(target=trainer)
        thread.start()
        specs = [("layers.0.q_proj.weight", "float8_e4m3fn", (256, 200)),
                 ("layers.0.q_proj.weight_scale_inv", "float32", (2, 2)),
                 ("layers.0.input_layernorm.weight", "float32", (200,))]
        self.assertEqual(refit.quantized_specs([(n, a.dtype, a.shape) for n, a in full.items()], "fp8-block128"),
                         specs)
        versions = []
        with refit.Engine(coordinator, specs, bucket_size=8192) as engine:
            while (v := engine.next(load)) is not None:
                versions.append(v)
                codes, scales = _quantize_fp8_block128(sent[v]["layers.0.q_proj.weight"])
                self.assertEqual(got["layers.0.q_proj.weight"], codes.tobytes(), f"codes of version {v}")
                self.assertEqual(got["layers.0.q_proj.weight_scale_inv"], scales.tobytes(), f"scales of {v}")
                self.assertEqual(got["layers.0.input_layernorm.weight"],
                                 sent[v]["layers.0.input_layernorm.weight"].tobytes())
        thread.join(30)
        self.assertEqual(errors, [])
        self.assertEqual(versions, [1, 2])
        report = coordinator.wait(10)
        self.assertEqual(report["quantized_tensors"], 0)  # a Python engine declares; the count is the CLI's
        self.assertEqual(report["bytes_per_refit"], 256 * 200 + 16 + 800)


    # Sharded trainers into an FP8 engine: two trainer threads each hold torch.chunk half of a
    # [300, 200] weight (150 rows: 128-block row 1 spans both), exchange the cut block's amax
    # through the coordinator, and the engine holds exactly the numpy quantization of the whole
    # weight. Mutations caught: a trainer quantizing the cut block with its own amax (the scales
    # of block row 1 differ; the C++ tests try it), the binding not passing quantize for shards.
    def test_sharded_quantizing_trainers_feed_an_fp8_engine(self):
        import ctypes
        import threading
        import refit
        coordinator = refit.Coordinator(2, 1, setup_timeout=20, refit_timeout=20)
        name = "layers.0.down_proj.weight"
        full = np.random.default_rng(7).standard_normal((300, 200), np.float32)
        full[20, 3] = 9.0  # rank 0's half of block row 1 has no share of this; rank 1's gets the max below
        full[140, 9] = -11.0  # in block (1, 0), held by rank 0 only
        errors = []

        def trainer(rank):
            try:
                local = np.ascontiguousarray(full[150 * rank:150 * rank + 150])
                with refit.Trainer(coordinator, [(name, local, (300, 200), 0, rank, 2)], rank=rank, trainer_ranks=2,
                                   quantize="fp8-block128:*", bucket_size=8192) as t:
                    t.refit(1)
            except refit.Error as e:
                errors.append(e)

        got = {}

        def load(items):
            for n, view in items:
                got[n] = ctypes.string_at(view.data_ptr, view.nbytes)

        threads = [threading.Thread(target=trainer, args=(r,)) for r in (0, 1)]
        for t in threads:
            t.start()
        specs = [(name, "float8_e4m3fn", (300, 200)), (name + "_scale_inv", "float32", (3, 2))]
        versions = []
        with refit.Engine(coordinator, specs, bucket_size=8192, trainer_ranks=2) as engine:
            while (v := engine.next(load)) is not None:
                versions.append(v)
        for t in threads:
            t.join(30)
        self.assertEqual(errors, [])
        self.assertEqual(versions, [1])
        codes, scales = _quantize_fp8_block128(full)
        self.assertEqual(got[name], codes.tobytes())
        self.assertEqual(got[name + "_scale_inv"], scales.tobytes())
        self.assertNotIn("error", coordinator.wait(10))

def _e4m3_values():
    """The 127 non-negative finite e4m3fn values, by code 0..126."""
    codes = np.arange(127)
    e, m = codes >> 3, (codes & 7).astype(np.float64)
    return np.where(e == 0, m * 2.0 ** -9, (1 + m / 8) * 2.0 ** (e - 7.0))


def _quantize_fp8_block128(w):
    """The format (docs/DESIGN.md), in numpy: codes (uint8, w's shape) and fp32 scales per block."""
    rows, cols = w.shape
    values = _e4m3_values()
    codes = np.zeros((rows, cols), np.uint8)
    scales = np.zeros((-(-rows // 128), -(-cols // 128)), np.float32)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            block = w[128 * i:128 * i + 128, 128 * j:128 * j + 128].astype(np.float32)
            amax = np.float32(np.abs(block).max())
            s = np.float32(max(amax, np.float32(1e-12))) / np.float32(448.0)
            scales[i, j] = s
            q = (block / s).astype(np.float32)
            mag = np.abs(q).astype(np.float64)
            idx = np.clip(np.searchsorted(values, mag), 1, 126)
            lo, hi = values[idx - 1], values[idx]
            pick = np.where(mag - lo < hi - mag, idx - 1, idx)
            tie = (mag - lo) == (hi - mag)
            pick = np.where(tie, np.where((idx - 1) % 2 == 0, idx - 1, idx), pick)
            pick = np.where(mag >= 448.0, 126, pick)
            pick = np.where(mag == 0, 0, pick)
            codes[128 * i:128 * i + 128, 128 * j:128 * j + 128] = pick | np.where(np.signbit(q), 0x80, 0)
    return codes, scales


def _one_refit(coordinator, full):
    """A trainer thread: version 1 holds every array plus one."""
    import refit
    with refit.Trainer(coordinator, {n: a + 1 for n, a in full.items()}, refit_timeout=20) as trainer:
        trainer.refit(1)


if __name__ == "__main__":
    unittest.main()
