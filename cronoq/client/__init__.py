"""The cronoq client: submit tasks to a broker and await their results.

- `client.py`: the public `Client` and `connect`: one broker's connection, with a router over it.
- `connection.py`: `Connection`, the requests to ONE broker (its primary and standbys) over one socket.
- `cluster.py`: `Router`, which sends each request to the member of a cluster it concerns.
- `sync.py`: `SyncClient` and `connect_sync`, the same for code that is not async.
- `cli.py` and `text.py`: the `cronoq` command and the text it prints.
"""

from cronoq.client.client import Client, connect
from cronoq.client.sync import SyncClient, SyncTaskHandle, connect_sync

__all__ = ["Client", "SyncClient", "SyncTaskHandle", "connect", "connect_sync"]
