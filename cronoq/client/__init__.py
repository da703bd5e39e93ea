"""The cronoq client: submit tasks to a broker and await their results."""

from cronoq.client.connection import Client, connect

__all__ = ["Client", "connect"]
