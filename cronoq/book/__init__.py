"""The task book: every task's record around the scheduling core, shared by the broker and the embedded Scheduler.

- records.py: `TaskRecord`, what the book keeps of a task and the form the store keeps it in;
- submission.py: the rules a submission must pass;
- taskbook.py: `TaskBook`, records, keys, retries and retention around one `SchedulerCore`;
- retention.py: how long finished tasks stay answerable, and where they wait meanwhile;
- rates.py: the dispatch and arrival rates `explain` estimates with.

None of them does I/O or reads a clock: the shell (broker or Scheduler) passes the time.
"""
