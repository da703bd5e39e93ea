"""cronoq.connect_sync from plain blocking code, against a real broker and a command-line worker."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

import cronoq
from tests.support import start_worker_process


def test_blocking_code_submits_and_waits(broker_factory, tmp_path):
    broker = broker_factory('[[pools]]\nname = "default"\n[[pools]]\nname = "slow"\n')
    worker = start_worker_process(broker.workers, "tests.apps.echo:pools", tmp_path / "worker.log", concurrency=4)
    try:
        with cronoq.connect_sync(broker.clients) as sched:
            handle = sched.submit({"q": 1}, tenant="acme")
            assert handle.result(timeout=10)["echo"] == {"q": 1}
            assert sched.status(handle.id).state == "succeeded"
            # One client shared by many threads.
            with ThreadPoolExecutor(8) as threads:
                values = list(threads.map(lambda i: sched.submit(i).result(timeout=10)["echo"], range(40)))
            assert values == list(range(40))
            assert handle.status().state == "succeeded" and handle.cancel() is False
            sched.pause("slow")
            queued = sched.submit(0, pool="slow")
            assert queued.status().state == "queued"
            assert queued.cancel() is True
            with pytest.raises(cronoq.Cancelled):
                queued.result(timeout=10)
            assert sched.cancel(queued.id) is False
            with pytest.raises(cronoq.NotFound):
                sched.status("missing")
    finally:
        worker.terminate()
        assert worker.wait(10) == 0  # SIGTERM: the worker finishes and leaves cleanly


def test_blocking_code_submits_with_a_cost_and_is_told_a_bad_one(broker_factory):
    broker = broker_factory('[[pools]]\nname = "llm"\nshare_by = "cost"\n')
    with cronoq.connect_sync(broker.clients) as sched:
        with pytest.raises(cronoq.InvalidArgument, match="cost must be a positive number"):
            sched.submit("x", pool="llm", cost=-1)
        handle = sched.submit("x", pool="llm", tenant="acme", cost=12.5)
        assert sched.explain(handle.id).cost == 12.5
