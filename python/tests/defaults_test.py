"""The package's defaults are the C++ options structs' defaults.

RankOptions, EngineOptions (src/runtime/roles.h) and CoordinatorOptions
(src/control/coordinator.h) hold every default once; the `refit` command
shows them in --help (tests/cli_defaults_test.cc checks it) and this package
takes them through None. Each test names the mutations it catches.
"""
import inspect
import unittest

import refit
from refit import _refit

# Keyword of the Python API -> field of the options struct.
RANK_FIELDS = {
    "rank": "rank", "trainer_ranks": "trainer_ranks", "engine_ranks": "engine_ranks", "bucket_size": "bucket_size",
    "transport": "transport", "mode": "mode", "setup_timeout": "setup_timeout_s", "refit_timeout": "refit_timeout_s",
    "bucket_timeout": "bucket_timeout_s",
}
ENGINE_FIELDS = dict(RANK_FIELDS, base_gpu_id="base_gpu_id", pool_slots="pool_slots", memory_limit="memory_limit",
                     listen_host="listen_host", poison_recycled="poison_recycled")
# refits and log_joins are Coordinator's own defaults (on demand, quiet): see its __init__.
COORDINATOR_FIELDS = {
    "trainer_ranks": "trainer_ranks", "engine_ranks": "engine_ranks", "listen": "listen", "seed": "seed",
    "setup_timeout": "setup_timeout_s", "refit_timeout": "refit_timeout_s", "progress": "progress",
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
        options = refit._rank_options(_refit.EngineOptions(), "127.0.0.1:1", None, None, None, None, None, None, None,
                                      None, None, None, None, None)
        expected = _refit.EngineOptions()
        for field in set(RANK_FIELDS.values()) | {"device"}:
            self.assertEqual(getattr(options, field), getattr(expected, field), field)
        self.assertEqual(options.bucket_size, 4 << 20)
        self.assertEqual(options.gpu, -1)  # None: base_gpu_id + rank (engines)


if __name__ == "__main__":
    unittest.main()
