"""The cronoq worker: runs handlers for the pools it serves."""

from cronoq.worker.worker import Worker

__all__ = ["Worker"]
