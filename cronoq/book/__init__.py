"""The task book: every task's record around the scheduling core, shared by the broker and the embedded Scheduler.

- records.py: `TaskRecord`, what the book keeps of a task and the form the store keeps it in;
- submission.py: the rules a submission must pass;
- taskbook.py: `TaskBook`, records, keys, retries and retention around one `SchedulerCore`;
- retention.py: how long finished tasks stay answerable, and where they wait meanwhile;
- rates.py: the dispatch and arrival rates `explain` estimates with.

None of them does I/O, reads a clock or draws a random number: the shell (the
broker or the embedded Scheduler) passes `now` to every change, and gives the
TaskBook the rng its retries draw their jitter from and the monotonic clock it
paces long work by. The book stands on the core, the wire's bounds, the answers
and the errors; the store and the broker stand on it, and a client or a worker
never loads it (tests/test_layout.py holds both).
"""
