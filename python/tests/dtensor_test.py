"""Sharded trainers through torch DTensor (issue 19): trainer processes hold
their weights as DTensors on a 1-D gloo mesh over the CPU (Shard(1) for row
weights, Shard(0) otherwise, Replicate() for the scalar), register them with
refit.Trainer as they are, and update them in place through their local
tensors; the engines' bytes must equal the shards of the full arrays.

Skips where torch (with torch.distributed) is not installed: Debian has no
torch package, so CI skips it; it runs on the GPU machine (bench/python_gpu.sh
dtensor), where torch 2.11 is.
"""
import os
import socket
import unittest

import refit_test

try:
    import torch
    import torch.distributed  # noqa: F401
    from torch.distributed.tensor import DTensor  # noqa: F401
except ImportError:
    torch = None


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@unittest.skipIf(torch is None, "torch with torch.distributed is not installed for this python")
class DTensorTrainers(unittest.TestCase):
    setUp = refit_test.RefitAcrossProcesses.setUp
    tearDown = refit_test.RefitAcrossProcesses.tearDown
    run_job = refit_test.RefitAcrossProcesses.run_job
    check_bytes = refit_test.RefitAcrossProcesses.check_bytes

    # Mutations caught: placements read wrong (Shard(1) taken as Shard(0): the row weights' bytes
    # differ), the mesh coordinate ignored (every rank says index 0: setup refuses the layout), and
    # the local tensor copied at registration instead of shared (version 2 differs).
    def test_dtensor_parameters_refit_without_gathering(self):
        versions = [1, 2]
        for trainers, engines in ((2, 3), (3, 2)):
            with self.subTest(trainers=trainers, engines=engines):
                j = self.run_job(trainers, engines, versions, transport="shm", sharded=True, dtensor=True,
                                 dist_port=_free_port())
                self.check_bytes(j, trainers, engines, versions)
                report = j.result("coordinator")
                self.assertEqual(report["gathered_bytes"], 0)
                self.assertEqual(report["duplicate_bytes"], 0)
                for name in os.listdir(self.out):
                    os.remove(os.path.join(self.out, name))


if __name__ == "__main__":
    unittest.main()
