"""Liveness through the binding (issue 16): heartbeats find a stalled
(SIGSTOP) process within the heartbeat deadline, idle or not, and the
Python calls waiting on it raise instead of hanging.

The reported hang: a coordinator that stalls between on-demand refits left
the trainer's next Trainer.refit(2) waiting for 'start' for ever (the refit
deadline does not cover that wait: a trainer step may take hours). Here the
coordinator (refit.Coordinator) and the engine (refit.Engine) run as
processes (job.py) and the trainer in this process, as a training loop's
would. Every deadline is 60 s and the heartbeat deadline HEARTBEAT_TIMEOUT,
so only liveness can end the waits as soon as these tests demand; the
library's default heartbeat deadline (10 s) is beyond WITHIN, so a wrapper
that drops the heartbeat keywords fails them too. Synchronised on calls
returning, process exits and files, never on sleeps.
"""
import os
import signal
import tempfile
import threading
import time
import unittest

try:
    import numpy as np
except ImportError:
    np = None

import job

HEARTBEAT_INTERVAL = 1
HEARTBEAT_TIMEOUT = 3
# "About the heartbeat deadline": the deadline plus room for a loaded
# machine; below the library's default deadline (10 s) and far below 60 s.
WITHIN = HEARTBEAT_TIMEOUT + 5
# A call still waiting after this long is a hang: the test frees it by
# killing the stalled process, then fails.
HANG_S = 60


@unittest.skipIf(np is None, "numpy is not installed for this python (Debian: python3-numpy)")
class Liveness(unittest.TestCase):
    def setUp(self):
        import refit
        self.refit = refit
        self.trainer = None
        self._tmp = tempfile.TemporaryDirectory(prefix="refit-py-")
        self.addCleanup(self._tmp.cleanup)
        self.job = job.Job(self._tmp.name, timeout=120, setup_timeout=60, refit_timeout=60, bucket_timeout=60,
                           heartbeat_interval=HEARTBEAT_INTERVAL, heartbeat_timeout=HEARTBEAT_TIMEOUT)
        self.addCleanup(self._end_job)
        self.job.start("engine", 0)
        self.arrays = {t["name"]: np.zeros(t["shape"], dtype=t["dtype"]) for t in job.MODEL}
        self.trainer = refit.Trainer(self.job.config["address"],
                                     [(t["name"], self.arrays[t["name"]], t["rule"]) for t in job.MODEL], rank=0,
                                     trainer_ranks=1, engine_ranks=1, bucket_size=4096, transport="shm",
                                     setup_timeout=60, refit_timeout=60, bucket_timeout=60,
                                     heartbeat_interval=HEARTBEAT_INTERVAL, heartbeat_timeout=HEARTBEAT_TIMEOUT)

    def _end_job(self):
        for process in self.job.processes.values():  # a stopped process ignores everything but SIGKILL
            if process.poll() is None:
                process.kill()
        if self.trainer is not None:
            self.trainer.close()
        self.job.wait()

    def pid(self, name):
        return self.job.processes[name].pid

    def wait_for_engine_version(self, version):
        """Until the engine saved `version`: it does once next() returned it, after it acknowledged the
        commit, so the job is idle from then on."""
        saved = os.path.join(self.job.out, f"engine0_v{version}.npz")
        deadline = time.monotonic() + HANG_S
        while not os.path.exists(saved) and time.monotonic() < deadline:
            time.sleep(0.005)  # polling a file the engine writes, not a synchronisation by time
        self.assertTrue(os.path.exists(saved), self.job.log("engine0"))

    def refit_or_hang(self, version, stalled):
        """(the refit.Error that trainer.refit(version) raised or None, seconds it took); a refit
        still running after HANG_S is freed by SIGKILL of `stalled` and fails the test."""
        outcome = {}

        def run():
            try:
                self.trainer.refit(version)
                outcome["error"] = None
            except self.refit.Error as e:
                outcome["error"] = e

        started = time.monotonic()
        thread = threading.Thread(target=run)
        thread.start()
        thread.join(HANG_S)
        took = time.monotonic() - started
        if thread.is_alive():
            os.kill(self.pid(stalled), signal.SIGKILL)
            thread.join(HANG_S)
            self.fail(f"refit({version}) still waited {HANG_S} s after {stalled} stalled: a hang")
        return outcome.get("error"), took

    # Catches: Trainer(heartbeat_timeout=...) not reaching RankOptions (the
    # library's 10 s deadline: refit(2) takes 10 s, over WITHIN); a trainer
    # wait for 'start' without the heartbeat deadline (refit(2) hangs until
    # the test kills the coordinator at HANG_S); an error that does not name
    # the coordinator; Engine(heartbeat_timeout=...) dropped (the engine
    # rank, waiting for the next refit, outlives WITHIN).
    def test_a_coordinator_stalled_between_refits_ends_the_next_refit(self):
        self.trainer.refit(1)
        # The coordinator sends Commit to every rank; the trainer's refit(1)
        # may return before the engine read its own Commit: a stop before
        # that would leave the engine in doubt about version 1 (CI, loaded,
        # 2026-12-04: versions [] instead of [1]).
        self.wait_for_engine_version(1)
        os.kill(self.pid("coordinator"), signal.SIGSTOP)
        stalled = time.monotonic()
        error, took = self.refit_or_hang(2, "coordinator")
        self.assertIsNotNone(error, "refit(2) committed with the coordinator stopped")
        self.assertIsInstance(error, self.refit.UnavailableError, repr(error))
        self.assertIn("lost the coordinator", str(error))
        self.assertIn("heartbeat deadline", str(error))
        self.assertLess(took, WITHIN, str(error))
        self.assertGreaterEqual(took, HEARTBEAT_TIMEOUT - 0.5, f"gave up before the heartbeat deadline: {error}")
        self.assertEqual(self.trainer.committed_version, 1)
        # The engine, idle in next(), loses the coordinator as soon.
        engine = self.job.processes["engine0"]
        engine.wait(timeout=max(1, stalled + WITHIN - time.monotonic()))
        self.assertLess(time.monotonic() - stalled, WITHIN)
        result = self.job.result("engine0")
        self.assertEqual(result["versions"], [1], result)
        self.assertIn("lost the coordinator", result.get("message", ""), result)

    # Catches: Coordinator(heartbeat_timeout=...) not reaching
    # CoordinatorOptions (the job ends 10 s after the stall, over WITHIN),
    # a coordinator that checks liveness only while a refit runs (an idle
    # on-demand job would wait for ever: the coordinator process outlives
    # HANG_S), and a trainer that does not hear the job's end (refit(2)
    # hangs or does not name the engine rank).
    def test_an_engine_stalled_while_idle_ends_the_job_naming_it(self):
        self.trainer.refit(1)
        self.wait_for_engine_version(1)
        os.kill(self.pid("engine0"), signal.SIGSTOP)
        stalled = time.monotonic()
        coordinator = self.job.processes["coordinator"]
        coordinator.wait(timeout=HANG_S)
        self.assertLess(time.monotonic() - stalled, WITHIN, self.job.log("coordinator"))
        report = self.job.result("coordinator")
        self.assertIsNotNone(report, self.job.log("coordinator"))
        self.assertIn("engine rank 0", report.get("error", ""), report)
        self.assertIn("heartbeat deadline", report.get("error", ""), report)
        self.assertEqual([r["version"] for r in report["refits"]], [1])
        error, took = self.refit_or_hang(2, "engine0")
        self.assertIsNotNone(error, "refit(2) committed with the engine stopped")
        self.assertIn("engine rank 0", str(error))
        self.assertLess(time.monotonic() - stalled, WITHIN, str(error))


if __name__ == "__main__":
    unittest.main()
