"""Registration and setup errors of the Python binding: the right refit.Error
subclass, with a message that names the tensor and what was wrong.

Registration errors are raised before the rank contacts the coordinator: the
tests pass an address nobody listens on, so a check that moved after joining
would surface as an UnavailableError instead and fail the test. Setup errors
(the two sides disagree) run a coordinator in this process, the trainer on a
thread and the engine on this one (the GIL is released while they join).
Each test names the mutation of the binding it catches.
"""
import threading
import unittest

try:
    import numpy as np
except ImportError:  # pyenv's python3 has no numpy; Debian's python3-numpy does
    np = None

import refit

NOBODY = "127.0.0.1:1"  # no coordinator: reaching it would be an UnavailableError


def _trainer(tensors, **options):
    options.setdefault("setup_timeout", 2)  # under a mutation, fail in 2 s, not 60
    return refit.Trainer(NOBODY, tensors, **options)


def _engine(params, **options):
    options.setdefault("setup_timeout", 2)
    return refit.Engine(NOBODY, params, **options)


@unittest.skipIf(np is None, "numpy is not installed for this python (Debian: python3-numpy)")
class TrainerRegistration(unittest.TestCase):
    def assertRaisesNaming(self, cls, *words):
        return _Raises(self, cls, words)

    # Mutation caught: a dtype table that maps complex (or any unknown code) to a refit dtype.
    def test_wrong_dtype_names_tensor_and_dtype(self):
        with self.assertRaisesNaming(refit.InvalidArgumentError, "'w'", "complex64"):
            _trainer({"w": np.zeros(4, dtype=np.complex64)})

    # Mutation caught: dropping the stride check (a transposed or sliced array would send wrong bytes).
    def test_non_contiguous_names_tensor_and_strides(self):
        base = np.zeros((4, 6), dtype=np.float32)
        for bad in (base.T, base[:, ::2]):
            with self.assertRaisesNaming(refit.InvalidArgumentError, "'w'", "not contiguous", "strides"):
                _trainer({"w": bad})

    # Mutation caught: accepting None (a missing tensor) as an empty tensor.
    def test_missing_tensor(self):
        with self.assertRaisesNaming(refit.InvalidArgumentError, "'b'", "missing"):
            _trainer({"a": np.zeros(2, np.float32), "b": None})

    # Mutation caught: ignoring rules for names that were never registered (a typo would silently replicate).
    def test_rule_for_unregistered_tensor(self):
        with self.assertRaisesNaming(refit.InvalidArgumentError, "q_prj"):
            _trainer({"q_proj": np.zeros((2, 2), np.float32)}, rules={"q_prj": "column"})

    # Mutation caught: check_rule removed (a row split of a 1-D tensor would index a missing dimension).
    def test_rule_that_splits_a_missing_dimension(self):
        with self.assertRaisesNaming(refit.InvalidArgumentError, "'norm'", "row", "float32[6]"):
            _trainer([("norm", np.zeros(6, np.float32), "row")])

    # Mutation caught: parse_shard_rule bypassed (an unknown rule would default to replicated).
    def test_unknown_rule(self):
        with self.assertRaisesNaming(refit.InvalidArgumentError, "'w'", "diagonal"):
            _trainer([("w", np.zeros((2, 2), np.float32), "diagonal")])

    # Mutation caught: the binding's refusal of 'expert' removed (a full trainer would split the tensor as a
    # column under another name; a sharded one would fail later with a layout error naming no rule).
    def test_expert_is_not_a_per_tensor_rule(self):
        w = np.zeros((4, 2), np.float32)
        for tensors, options, words in (([("w", w, "expert")], {}, ("'w'", "expert")),
                                        ({"w": w}, {"rules": {"w": "expert"}}, ("'w'", "expert")),
                                        ({"w": w}, {"rules": "expert"}, ("rules='expert'",))):
            with self.subTest(options=options), self.assertRaisesNaming(refit.InvalidArgumentError, *words):
                _trainer(tensors, **options)

    # Mutation caught: a duplicate name accepted (the second would shadow the first on the engine).
    def test_duplicate_name(self):
        with self.assertRaisesNaming(refit.InvalidArgumentError, "'w'", "twice"):
            _trainer([("w", np.zeros(2, np.float32)), ("w", np.zeros(2, np.float32))])

    # Mutation caught: registering an object without __dlpack__ by some other path (or crashing).
    def test_not_a_tensor(self):
        with self.assertRaisesNaming(refit.InvalidArgumentError, "'w'", "list", "__dlpack__"):
            _trainer({"w": [1.0, 2.0]})

    # Mutation caught: registration moved after joining (the error would be UnavailableError).
    def test_valid_tensors_then_reach_for_the_coordinator(self):
        with self.assertRaises(refit.UnavailableError):
            _trainer({"w": np.zeros(2, np.float32)}, setup_timeout=0.5)


@unittest.skipIf(np is None, "numpy is not installed for this python (Debian: python3-numpy)")
class EngineRegistration(unittest.TestCase):
    def assertRaisesNaming(self, cls, *words):
        return _Raises(self, cls, words)

    # Mutation caught: parse_dtype skipped for specs (an unknown dtype would become uint8).
    def test_unknown_dtype_in_spec(self):
        with self.assertRaisesNaming(refit.InvalidArgumentError, "'w'", "float128"):
            _engine([("w", "float128", (2, 2))])

    # Mutation caught: negative dimensions accepted by the spec path.
    def test_negative_dimension(self):
        with self.assertRaisesNaming(refit.InvalidArgumentError, "'w'"):
            _engine([("w", "float32", (2, -1))])

    # Mutation caught: mixing specs and tensors accepted (copy mode would lack targets).
    def test_mixed_params(self):
        with self.assertRaisesNaming(refit.InvalidArgumentError, "mix"):
            _engine([("a", "float32", (2,)), ("b", np.zeros(2, np.float32))])

    # Mutation caught: a read-only destination accepted in staged copy mode.
    def test_read_only_destination(self):
        ro = np.zeros(4, np.float32)
        ro.flags.writeable = False
        with self.assertRaises(refit.InvalidArgumentError) as caught:
            _engine({"w": ro})
        self.assertIn("'w'", str(caught.exception))

    # Mutation caught: the device check dropped (a cuda engine over host tensors).
    def test_device_disagrees_with_tensors(self):
        with self.assertRaisesNaming(refit.InvalidArgumentError, "device='cuda'", "cpu"):
            _engine({"w": np.zeros(4, np.float32)}, device="cuda")


class Module(unittest.TestCase):
    # Mutation caught: an exception class registered under the wrong base or code.
    def test_exception_hierarchy(self):
        for cls, code in [(refit.InvalidArgumentError, "invalid_argument"),
                          (refit.FailedPreconditionError, "failed_precondition"),
                          (refit.AbortedError, "aborted"), (refit.DeadlineExceededError, "deadline_exceeded"),
                          (refit.UnavailableError, "unavailable"), (refit.DataLossError, "data_loss"),
                          (refit.InternalError, "internal"), (refit.NotFoundError, "not_found"),
                          (refit.ResourceExhaustedError, "resource_exhausted")]:
            self.assertTrue(issubclass(cls, refit.Error), cls)
            self.assertEqual(cls.code, code)
            self.assertEqual(cls.__module__, "refit")
        self.assertTrue(issubclass(refit.InvalidArgumentError, ValueError))

    # Mutation caught: shard_rule reading the wrong table or the wrong match (first row wins).
    def test_shard_rules_by_name(self):
        self.assertEqual(refit.shard_rule("model.layers.0.self_attn.q_proj.weight"), "column")
        self.assertEqual(refit.shard_rule("model.layers.3.mlp.down_proj.weight"), "row")
        self.assertEqual(refit.shard_rule("model.embed_tokens.weight"), "vocab")
        self.assertEqual(refit.shard_rule("model.layers.0.input_layernorm.weight"), "replicated")

    # Mutation caught: byte sizes parsed with the wrong unit.
    def test_parse_bytes(self):
        self.assertEqual(refit.parse_bytes("4MiB"), 4 << 20)
        self.assertEqual(refit.parse_bytes("64MB"), 64 * 10**6)
        self.assertEqual(refit.parse_bytes(4096), 4096)
        with self.assertRaises(refit.InvalidArgumentError):
            refit.parse_bytes("four")

    # Mutation caught: the coordinator's setup error swallowed (a bad topology would hang the ranks).
    # (Fewer trainer ranks than engine ranks is no longer one: sharded
    # trainers may be fewer, so the coordinator refuses full-weight ones at
    # setup, from their joins; a role without ranks it refuses at once.)
    def test_coordinator_rejects_bad_topology(self):
        with self.assertRaises(refit.Error) as caught:
            refit.Coordinator(trainer_ranks=0, engine_ranks=2)
        self.assertIn("trainer_ranks (0) and engine_ranks (2) must be at least 1", str(caught.exception))


@unittest.skipIf(np is None, "numpy is not installed for this python (Debian: python3-numpy)")
class SetupMismatch(unittest.TestCase):
    """Trainer and engine disagree: both sides fail at setup, never mid-refit (DESIGN.md rule 1)."""

    def run_pair(self, trainer_tensors, engine_params):
        coordinator = refit.Coordinator(1, 1, setup_timeout=20)
        errors = {}

        def trainer():
            try:
                refit.Trainer(coordinator, trainer_tensors, bucket_size=4096, setup_timeout=20).close()
            except refit.Error as e:
                errors["trainer"] = e

        thread = threading.Thread(target=trainer)
        thread.start()
        try:
            refit.Engine(coordinator, engine_params, bucket_size=4096, setup_timeout=20).close()
        except refit.Error as e:
            errors["engine"] = e
        thread.join(30)
        self.assertFalse(thread.is_alive(), "the trainer hangs at setup")
        report = coordinator.wait(30)
        return errors, report

    # Mutation caught: the engine's specs sent under other names (or the binding renaming tensors).
    def test_name_mismatch_fails_both_sides_at_setup(self):
        errors, report = self.run_pair({"a": np.zeros(8, np.float32), "b": np.zeros(8, np.float32)},
                                       [("a", "float32", (8,)), ("c", "float32", (8,))])
        for side in ("trainer", "engine"):
            self.assertIsInstance(errors.get(side), refit.FailedPreconditionError, side)
            self.assertIn("plan digest mismatch", str(errors[side]))
        self.assertIn("plan digest mismatch", report["error"])
        self.assertEqual(report["refits"], [])

    # Mutation caught: a dtype converted on either side (rule 5: never promote) instead of refused.
    def test_dtype_mismatch_fails_at_setup(self):
        errors, _ = self.run_pair({"a": np.zeros(8, np.float32)}, [("a", "float16", (8,))])
        self.assertIsInstance(errors.get("engine"), refit.FailedPreconditionError)
        self.assertIsInstance(errors.get("trainer"), refit.FailedPreconditionError)


class _Raises:
    """assertRaises that also checks the message names every word."""

    def __init__(self, test, cls, words):
        self.test, self.cls, self.words = test, cls, words

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is None:
            self.test.fail(f"{self.cls.__name__} not raised")
        if not issubclass(kind, self.cls):
            self.test.fail(f"expected {self.cls.__name__}, got {kind.__name__}: {value}")
        for word in self.words:
            self.test.assertIn(word, str(value))
        return True


if __name__ == "__main__":
    unittest.main()
