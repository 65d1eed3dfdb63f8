"""Test helpers for code built on seqloader (public, but not part of the loading path).

* :func:`assert_resumes_exactly` checks the resume contract of a loader factory batch by batch
  (:mod:`seqloader.testing.resume`);
* :func:`run_distributed` runs a function in a small, real ``torch.distributed`` (gloo) world of
  local processes (:mod:`seqloader.testing.distributed`);
* :class:`LocalRayCluster` starts a real Ray cluster of several nodes on this machine, whose nodes
  can be removed and added (:mod:`seqloader.testing.ray_cluster`; needs ``seqloader[ray]``).
"""

from seqloader.testing.distributed import run_distributed
from seqloader.testing.ray_cluster import LocalRayCluster
from seqloader.testing.resume import (
    assert_batches_equal,
    assert_resumes_exactly,
    json_round_trip,
    resume_in_spawned_process,
    run_saving_after,
)

__all__ = ["LocalRayCluster", "assert_batches_equal", "assert_resumes_exactly", "json_round_trip",
           "resume_in_spawned_process", "run_distributed", "run_saving_after"]
