"""The cronoq worker: runs handlers for the pools it serves.

- `worker.py`: the public `Worker`: one broker's runner, or a cluster's.
- `runner.py`: `Runner`, serving pools for ONE broker (its primary and standbys) over one socket.
- `cluster.py`: `ClusterWorker`, a runner per member of a cluster, following its map.
- `cli.py`: the `cronoq-worker` command.
"""

from cronoq.worker.worker import Worker

__all__ = ["Worker"]
