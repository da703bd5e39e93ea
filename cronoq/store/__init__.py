"""What the broker keeps on disk, in two halves that never import each other.

- journal/: the durable state of live tasks — an append-only journal with snapshots, read back at start-up;
- results/: finished tasks, in a SQLite file written by a child process, until retention ends;
- lifeline.py: how either half's helper process dies with the broker.

Both store `cronoq.book.records.TaskRecord`s; the broker (cronoq.broker.durable) drives them.
"""
