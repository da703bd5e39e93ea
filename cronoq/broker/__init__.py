"""The cronoq broker: one process that queues, schedules and routes tasks between clients and workers."""

from cronoq.broker.server import Broker

__all__ = ["Broker"]
