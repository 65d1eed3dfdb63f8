"""Forked workers after Ray in the same process: a Ray epoch on a local cluster, then process-worker
epochs (``fork``) while the cluster runs and after it is shut down, then torch's own DataLoader.

On Python 3.13 a forked child of ``multiprocessing`` clears the ``atexit`` hooks it inherited, and
``ray.cluster_utils.Cluster``'s hooks were the last references to its nodes: the child freed a
node's GCS client and died with SIGSEGV at start (``seqloader.testing.ray_cluster``'s docstring).
It runs in a child process, so that a segfault cannot take pytest with it, and the cluster is its
own.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("ray")

_ROOT = pathlib.Path(__file__).resolve().parents[2]
_RUN = textwrap.dedent("""
    import gc, json
    import torch.utils.data
    import seqloader as sl
    from seqloader.testing import LocalRayCluster

    def epoch(**kw):
        with sl.prefetch(range(8), 2, **kw) as p:
            return list(p)

    out = {}
    cluster = LocalRayCluster(data_nodes=1, cpus=2)
    out["ray"] = epoch(method="ray")
    out["fork, connected"] = epoch(multiprocessing_context="fork")
    cluster.remove_node(cluster.data_nodes[0].node_id)
    out["fork, a node removed"] = epoch(multiprocessing_context="fork")
    cluster.shutdown()
    del cluster
    gc.collect()  # the cluster's own gRPC clients go: only the nodes' atexit hooks are left
    out["fork, after shutdown"] = epoch(multiprocessing_context="fork")
    out["torch"] = [b.tolist() for b in torch.utils.data.DataLoader(range(8), batch_size=4, num_workers=2,
                                                                    multiprocessing_context="fork")]
    print(json.dumps(out))
""")


def test_forked_workers_start_after_a_ray_epoch_and_after_the_cluster_is_gone():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", _RUN], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out.pop("torch") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert out == {k: list(range(8)) for k in ("ray", "fork, connected", "fork, a node removed",
                                                "fork, after shutdown")}, out
