"""refit.transports() says what can run here; Trainer.refit() returns a report.

Coordinator, trainers (threads) and engine (this thread) run in one
interpreter, as in refit_test.OneProcess. Each test names the mutations it
catches.
"""
import threading
import time
import unittest

try:
    import numpy as np
except ImportError:
    np = None

import refit

KNOWN = ["shm", "tcp", "cuda_ipc", "ucx", "nccl"]
BUCKET = 4096


class Transports(unittest.TestCase):
    # Catches: transports() returning bare names again, a known transport left
    # out, a reason given for an available one (or none for an unavailable one).
    def test_every_known_transport_with_whether_it_runs(self):
        listed = refit.transports()
        self.assertEqual([t.name for t in listed], KNOWN)
        for t in listed:
            self.assertIsInstance(t, refit.TransportAvailability)
            self.assertIsInstance(t.available, bool)
            self.assertEqual(t.reason == "", t.available, t)
        by_name = {t.name: t for t in listed}
        self.assertTrue(by_name["shm"].available)
        self.assertTrue(by_name["tcp"].available)

    # Catches: cuda_ipc or nccl listed as runnable by a refit built without
    # CUDA (availability taken from the names refit knows instead of the build),
    # and a reason that does not say the build lacks them.
    @unittest.skipIf(refit.cuda_built(), "refit was built with CUDA (the C++ test covers a missing device)")
    def test_gpu_transports_of_a_cpu_build_say_why_not(self):
        by_name = {t.name: t for t in refit.transports()}
        self.assertFalse(by_name["cuda_ipc"].available)
        self.assertIn("built without CUDA", by_name["cuda_ipc"].reason)
        self.assertFalse(by_name["nccl"].available)
        self.assertIn("built without NCCL", by_name["nccl"].reason)


def _model(tensors=0):
    # 13 full buckets of 4 KiB and then some, in two dtypes (w is chunked); then
    # `tensors` of one bucket each, which the engine loads one batch at a time.
    model = {"w": np.zeros((100, 130), np.float32), "b": np.zeros(3000, np.int16)}
    model.update({f"t{i}": np.zeros(BUCKET // 4, np.float32) for i in range(tensors)})
    return model


def _nbytes(arrays):
    return sum(a.nbytes for a in arrays.values())


@unittest.skipIf(np is None, "numpy is not installed for this python (Debian: python3-numpy)")
class Reports(unittest.TestCase):
    def run_job(self, trainer_ranks, versions, load_delay=0.0, late_rank_delay=0.0, tensors=0):
        """Runs `versions` with trainer_ranks trainers (threads) into one engine
        rank (this thread); returns each trainer rank's reports and last_refit."""
        coordinator = refit.Coordinator(trainer_ranks, 1, setup_timeout=20, refit_timeout=20)
        models = [_model(tensors) for _ in range(trainer_ranks)]
        reports = {r: [] for r in range(trainer_ranks)}
        last = {}
        errors = []
        asking = threading.Event()  # rank 0 is about to ask for the version

        def trainer(rank):
            try:
                with refit.Trainer(coordinator, models[rank], rank=rank, trainer_ranks=trainer_ranks,
                                   bucket_size=BUCKET, bucket_timeout=10, refit_timeout=20) as t:
                    for v in versions:
                        for a in models[rank].values():
                            a[...] = v
                        if rank == 0:
                            asking.set()
                        elif late_rank_delay:
                            asking.wait(10)
                            time.sleep(late_rank_delay)  # the delay the report must show, not a synchronisation
                        reports[rank].append(t.refit(v))
                    last[rank] = t.last_refit
            except refit.Error as e:
                errors.append(e)

        def load(items):
            time.sleep(load_delay)  # a slow engine: the trainer waits for its credits

        threads = [threading.Thread(target=trainer, args=(r,)) for r in range(trainer_ranks)]
        for thread in threads:
            thread.start()
        with refit.Engine(coordinator, [(n, a.dtype, a.shape) for n, a in models[0].items()], bucket_size=BUCKET,
                          trainer_ranks=trainer_ranks, bucket_timeout=10, refit_timeout=20) as engine:
            while engine.next(load) is not None:
                pass
        for thread in threads:
            thread.join(30)
        self.assertEqual(errors, [])
        self.assertNotIn("error", coordinator.wait(10))
        return reports, last

    def check_consistent(self, report, version):
        self.assertEqual(report.version, version)
        self.assertGreater(report.seconds, 0)
        self.assertAlmostEqual(report.gb_per_s, report.bytes / report.seconds / 1e9, delta=1e-9)
        for field in ("send_s", "wait_start_s", "wait_go_s", "wait_credits_s", "wait_commit_s"):
            self.assertGreaterEqual(getattr(report, field), 0, field)
        # The parts are disjoint spans inside the refit's wall time.
        self.assertLessEqual(report.wait_start_s + report.wait_go_s + report.send_s + report.wait_commit_s,
                             report.seconds + 1e-6, report)
        self.assertLessEqual(report.wait_credits_s, report.send_s + 1e-6, report)

    # Catches: the bytes not summed over the rank's buckets (the last bucket's
    # only), a bucket count off, refit() returning None, a report of the
    # previous version, seconds measured from 'go' only (the sum of the parts
    # exceeds it), gb_per_s over another span, last_refit out of step.
    def test_one_rank_reports_every_byte_of_the_plan(self):
        reports, last = self.run_job(1, [1, 2])
        model = _model()
        self.assertEqual([r.version for r in reports[0]], [1, 2])
        for version, report in zip([1, 2], reports[0]):
            self.assertIsInstance(report, refit.RefitReport)
            self.check_consistent(report, version)
            # One trainer into one engine rank: the plan is every byte of every tensor.
            self.assertEqual(report.bytes, _nbytes(model))
            self.assertEqual(report.buckets, -(-model["w"].nbytes // BUCKET) + -(-model["b"].nbytes // BUCKET))
        self.assertEqual(last[0], reports[0][-1])

    # Catches: each rank reporting the whole plan's bytes instead of its share
    # (the ranks' bytes then sum to twice the model), a rank reporting none.
    def test_two_ranks_share_the_plans_bytes(self):
        reports, _ = self.run_job(2, [1])
        shares = [reports[r][0].bytes for r in (0, 1)]
        self.assertEqual(sum(shares), _nbytes(_model()))
        self.assertTrue(all(s > 0 for s in shares), shares)
        for r in (0, 1):
            self.check_consistent(reports[r][0], 1)

    # Catches: wait_start_s measured from the start the coordinator sent (always
    # about 0): rank 0 asks 0.3 s before rank 1, so it waited that long.
    def test_the_rank_that_asked_first_reports_its_wait_for_the_start(self):
        reports, _ = self.run_job(2, [1], late_rank_delay=0.3)
        self.assertGreaterEqual(reports[0][0].wait_start_s, 0.25, reports[0][0])
        self.assertGreaterEqual(reports[0][0].seconds, 0.25)

    # Catches: waits for credits not accumulated (0, or only the last one's):
    # an engine that takes 30 ms per batch (20 batches of one tensor each)
    # keeps the trainer waiting for its two pool slots most of the refit.
    def test_a_slow_engine_shows_as_credit_waits(self):
        reports, _ = self.run_job(1, [1], load_delay=0.03, tensors=20)
        report = reports[0][0]
        self.assertGreaterEqual(report.wait_credits_s, 0.15, report)

    # Catches: a report whose fields a logger cannot take (as_dict missing a
    # field or holding non-numbers: a partial refit's `only` globs stay out of
    # it, tried), an unreadable repr or str.
    def test_the_report_logs_and_prints(self):
        report = refit.RefitReport(version=3, bytes=4096, buckets=1, seconds=0.5, gb_per_s=4096 / 0.5 / 1e9,
                                   send_s=0.25, wait_start_s=0.0, wait_go_s=0.125, wait_credits_s=0.0625,
                                   wait_commit_s=0.1)
        d = report.as_dict()
        self.assertEqual(list(d), ["version", "bytes", "buckets", "seconds", "gb_per_s", "send_s", "wait_start_s",
                                   "wait_go_s", "wait_credits_s", "wait_commit_s"])
        self.assertTrue(all(isinstance(v, (int, float)) for v in d.values()))
        self.assertEqual(report.only, ())  # a full refit's; a partial one's globs are not a logger's number
        self.assertEqual(repr(report).split(", ")[:4], ["RefitReport(version=3", "bytes=4096", "buckets=1",
                                                         "seconds=0.5"])
        self.assertEqual(str(report), "refit 3: 4096 bytes in 0.500 s (8.19e-06 GB/s); waited 0.000 s to start, "
                                      "0.125 s for go, 0.062 s for credits, 0.100 s for the commit")


if __name__ == "__main__":
    unittest.main()
