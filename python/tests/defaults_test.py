"""The package's defaults are the C++ options structs' defaults.

RankOptions, EngineOptions (src/runtime/roles.h) and CoordinatorOptions
(src/control/coordinator.h) hold every default once; the `refit` command
shows them in --help (tests/cli_defaults_test.cc checks it) and this package
takes them through None. Each test names the mutations it catches.
"""
import inspect
import threading
import unittest

try:
    import numpy as np
except ImportError:
    np = None

import refit
from refit import _options, _refit

# Keyword of the Python API -> field of the options struct.
RANK_FIELDS = {
    "rank": "rank", "trainer_ranks": "trainer_ranks", "engine_ranks": "engine_ranks", "bucket_size": "bucket_size",
    "transport": "transport", "mode": "mode", "setup_timeout": "setup_timeout_s", "refit_timeout": "refit_timeout_s",
    "bucket_timeout": "bucket_timeout_s", "heartbeat_interval": "heartbeat_interval_s",
    "heartbeat_timeout": "heartbeat_timeout_s",
}
ENGINE_FIELDS = dict(RANK_FIELDS, base_gpu_id="base_gpu_id", pool_slots="pool_slots", memory_limit="memory_limit",
                     listen_host="listen_host", poison_recycled="poison_recycled")
# refits and log_joins are Coordinator's own defaults (on demand, quiet): see its __init__.
COORDINATOR_FIELDS = {
    "trainer_ranks": "trainer_ranks", "engine_ranks": "engine_ranks", "listen": "listen", "seed": "seed",
    "setup_timeout": "setup_timeout_s", "refit_timeout": "refit_timeout_s", "progress": "progress",
    "heartbeat_interval": "heartbeat_interval_s", "heartbeat_timeout": "heartbeat_timeout_s",
}


class DefaultsComeFromTheStructs(unittest.TestCase):
    def check_signature(self, cls, struct, fields):
        params = inspect.signature(cls.__init__).parameters
        for name, field in fields.items():
            default = params[name].default
            if default is None:
                continue  # None: the struct's default
            value = refit.parse_bytes(default) if name in ("bucket_size", "memory_limit") else default
            self.assertEqual(value, getattr(struct, field),
                             f"{cls.__name__}({name}={default!r}) differs from the struct's {field}")

    # Catches: a literal default in a signature that differs from the struct's
    # (Trainer/Engine(bucket_size=64 << 20) beside RankOptions' 4 MiB, a
    # timeout or pool size copied wrong).
    def test_signature_defaults_equal_the_structs(self):
        self.check_signature(refit.Trainer, _refit.RankOptions(), RANK_FIELDS)
        self.check_signature(refit.Engine, _refit.EngineOptions(), ENGINE_FIELDS)
        self.check_signature(refit.Coordinator, _refit.CoordinatorOptions(), COORDINATOR_FIELDS)

    # Catches: None overwriting the struct's value (a _set that assigns None
    # or 0), and the bucket size drifting from the one documented default.
    def test_none_keeps_the_structs_value(self):
        options = _options._rank_options(_refit.EngineOptions(), "127.0.0.1:1", None, None, None, None, None, None,
                                         None, None, None, None, None, None)
        expected = _refit.EngineOptions()
        for field in set(RANK_FIELDS.values()) | {"device"}:
            self.assertEqual(getattr(options, field), getattr(expected, field), field)
        self.assertEqual(options.bucket_size, 0)  # auto: each rank resolves it by transport
        self.assertEqual(options.pool_slots, 0)  # auto
        self.assertEqual(options.gpu, -1)  # None: base_gpu_id + rank (engines)

    # Catches: a heartbeat keyword that does not reach its field (dropped in
    # _rank_options, or set on the other field: interval and timeout swapped).
    def test_heartbeat_keywords_reach_the_options(self):
        options = _options._rank_options(_refit.RankOptions(), "127.0.0.1:1", None, None, None, None, None, None, None,
                                         None, None, None, None, None, heartbeat_interval=0.25, heartbeat_timeout=3)
        self.assertEqual(options.heartbeat_interval_s, 0.25)
        self.assertEqual(options.heartbeat_timeout_s, 3.0)
        defaults = _refit.RankOptions()
        self.assertEqual((defaults.heartbeat_interval_s, defaults.heartbeat_timeout_s), (1.0, 10.0),
                         "the docstrings of Trainer, Engine and Coordinator say 1 s and 10 s")
        coordinator = _refit.CoordinatorOptions()
        self.assertEqual((coordinator.heartbeat_interval_s, coordinator.heartbeat_timeout_s), (1.0, 10.0),
                         "Coordinator's docstring says 1 s and 10 s")

    # Catches: "auto" refused by Python while the CLI takes it, or mapped to
    # something other than the structs' auto value.
    def test_auto_is_spelt_as_in_the_cli(self):
        options = _options._rank_options(_refit.EngineOptions(), "127.0.0.1:1", None, None, None, "auto", None, None,
                                         None, None, None, None, None, None)
        self.assertEqual(options.bucket_size, 0)
        self.assertEqual(_options._slot_count("auto"), 0)
        self.assertEqual(_options._bucket_bytes("64MiB"), 64 << 20)


@unittest.skipIf(np is None, "numpy is not installed for this python (Debian: python3-numpy)")
class DefaultsAsAJobResolvesThem(unittest.TestCase):
    # Catches: auto sent to the coordinator unresolved (the job's report says
    # bucket_size 0), shm given the GPU size (1 GiB) or the old 4 MiB, and auto pool slots other than 3
    # without a memory limit.
    def test_a_job_with_every_default_uses_64MiB_buckets_and_3_slots(self):
        model = {"w": np.arange(50000, dtype=np.float32), "b": np.ones(77, np.int16)}
        coordinator = refit.Coordinator(1, 1, setup_timeout=20, refit_timeout=20)
        errors = []

        def trainer():
            try:
                with refit.Trainer(coordinator, model) as t:
                    t.refit(1)
            except refit.Error as e:
                errors.append(e)

        thread = threading.Thread(target=trainer)
        thread.start()
        received = {}
        with refit.Engine(coordinator, [(n, a.dtype, a.shape) for n, a in model.items()]) as engine:
            def load(items):
                for name, array in items:
                    received[name] = np.array(np.from_dlpack(array), copy=True)
            while engine.next(load) is not None:
                pass
        thread.join(30)
        self.assertEqual(errors, [])
        report = coordinator.wait(10)
        self.assertNotIn("error", report)
        self.assertEqual(report["bucket_size"], 64 << 20)  # shm, the default transport
        self.assertEqual(report["pool_slots"], 3)
        for name, array in model.items():
            self.assertTrue(np.array_equal(received[name], array), name)


if __name__ == "__main__":
    unittest.main()
