"""The cronoq client: submit tasks to a broker and await their results."""

from cronoq.client.client import Client, connect
from cronoq.client.sync import SyncClient, SyncTaskHandle, connect_sync

__all__ = ["Client", "SyncClient", "SyncTaskHandle", "connect", "connect_sync"]
