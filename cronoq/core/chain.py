"""A FIFO of tasks linked through the tasks themselves.

A fair pool holds one FIFO per tenant and class; with many tenants, a
container per FIFO would cost more than the tasks in it (an empty deque is
~600 bytes). A `Chain` is just a head, a tail and two counts; the links live
in `Task._next`. Deletion is lazy: a cancelled task stays linked, recognised
by its state, until it reaches the front or the chain is compacted.
"""

from __future__ import annotations

from typing import Iterator

from cronoq.core.task import QUEUED, Task


class Chain:
    """A FIFO of tasks linked through `Task._next`: O(1) append and pop, no container.

    `live` counts the queued tasks linked; `stale` the cancelled ones still
    linked (skipped when they reach the front, dropped by `compact`).
    """

    __slots__ = ("head", "tail", "live", "stale")

    def __init__(self) -> None:
        self.head: Task | None = None
        self.tail: Task | None = None
        self.live = 0
        self.stale = 0

    def append(self, task: Task) -> None:
        """Link a queued task at the back."""
        task._next = None
        tail = self.tail
        if tail is None:
            self.head = task
        else:
            tail._next = task
        self.tail = task
        self.live += 1

    def skip_stale(self) -> None:
        """Unlink the cancelled tasks at the front, so that `head` is live (or None)."""
        head = self.head
        while head is not None and head.state is not QUEUED:
            self.head, head._next = head._next, None
            head = self.head
            self.stale -= 1
        if head is None:
            self.tail = None

    def compact(self) -> None:
        """Unlink every cancelled task (O(linked)); called before they outnumber the live ones."""
        task = self.head
        self.head = self.tail = None
        self.live = self.stale = 0
        while task is not None:
            nxt = task._next
            task._next = None  # an ended task must not keep its successors alive
            if task.state is QUEUED:
                self.append(task)
            task = nxt

    def __iter__(self) -> Iterator[Task]:
        """The queued tasks linked, front first."""
        task = self.head
        while task is not None:
            nxt = task._next
            if task.state is QUEUED:
                yield task
            task = nxt
