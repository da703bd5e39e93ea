"""Stopping and failing out loud: a worker's Ctrl-C (once, twice), a failing handler, the broker's own logs."""

from __future__ import annotations

import asyncio
import signal

import cronoq
from tests.support import run_command, start_worker_process, until, wait_for_line

WAIT = 60.0
POOLS = '[[pools]]\nname = "default"\n[[pools]]\nname = "slow"\n[[pools]]\nname = "failing"\n'
INFO = ["--log-level", "INFO"]


async def running(client: cronoq.Client, task_id: str, worker, log) -> None:
    """Until the worker process runs the task: the broker says `running` once it has sent it, and a Ctrl-C
    that came between the two would find the worker with nothing to finish."""
    async def started() -> bool:
        return (await client.status(task_id)).state == "running"
    await until(started, f"task {task_id} runs")
    await asyncio.to_thread(wait_for_line, worker, log, "sleepy: started")


async def test_a_first_ctrl_c_finishes_the_running_task_and_says_so(broker_factory, tmp_path):
    broker = broker_factory(POOLS, args=INFO)
    log = tmp_path / "worker.log"
    worker = start_worker_process(broker.workers, "tests.apps.echo:pools", log)
    try:
        async with cronoq.connect(broker.clients) as client:
            task = await client.submit(1.5, pool="slow")
            await running(client, task.id, worker, log)
            worker.send_signal(signal.SIGINT)
            said = "Ctrl-C: finishing 1 running task (Ctrl-C again to stop now)"
            await asyncio.to_thread(wait_for_line, worker, log, said)
            assert await task.result(timeout=WAIT) == worker.pid
            assert await asyncio.to_thread(worker.wait, WAIT) == 0
        text = log.read_text()
        assert "worker stopped: 1 task finished, 0 abandoned" in text
        broker_log = broker.log.read_text()
        assert "leaving: it takes no more tasks and finishes its 1 running task" in broker_log
        assert broker_log.count(" left") == 1 and "unfinished" not in broker_log
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


async def test_a_second_ctrl_c_stops_at_once_and_the_broker_requeues_the_task(broker_factory, tmp_path):
    broker = broker_factory(POOLS, args=INFO)
    log = tmp_path / "worker.log"
    worker = start_worker_process(broker.workers, "tests.apps.echo:pools", log)
    try:
        async with cronoq.connect(broker.clients) as client:
            task = await client.submit(600, pool="slow")  # a plain `def` handler: its thread cannot be stopped
            await running(client, task.id, worker, log)
            worker.send_signal(signal.SIGINT)
            await asyncio.to_thread(wait_for_line, worker, log, "Ctrl-C again to stop now")
            worker.send_signal(signal.SIGINT)
            assert await asyncio.to_thread(worker.wait, WAIT) == 128 + signal.SIGINT

            async def requeued() -> bool:
                return (await client.status(task.id)).state == "queued"
            await until(requeued, "the broker put the abandoned task back in its queue")
        text = log.read_text()
        assert "Ctrl-C again: stopping now; the broker runs the 1 running task again elsewhere" in text
        assert "worker stopped: 0 tasks finished, 1 abandoned" in text
        assert "Traceback" not in text
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


async def test_a_failing_handler_is_logged_on_the_worker(broker_factory, tmp_path):
    broker = broker_factory(POOLS)
    log = tmp_path / "worker.log"
    worker = start_worker_process(broker.workers, "tests.apps.echo:failing", log)
    try:
        async with cronoq.connect(broker.clients) as client:
            task = await client.submit({"n": 42}, pool="failing")
            try:
                await task.result(timeout=WAIT)
            except cronoq.TaskFailed:
                pass
        line = await asyncio.to_thread(wait_for_line, worker, log, f"task {task.id}")
        assert "level=warning" in line
        assert f"task {task.id} (pool failing, attempt 1) failed: ValueError: cannot take {{'n': 42}}" in line
        assert "Traceback" not in log.read_text(), "the traceback goes with the outcome; the log has it at DEBUG"
    finally:
        worker.terminate()
        worker.wait(WAIT)


async def test_the_broker_logs_its_stop_with_what_it_holds(broker_factory):
    broker = broker_factory(POOLS, args=INFO)
    async with cronoq.connect(broker.clients) as client:
        await client.submit(1)
        await client.submit(2, delay=3600)
    assert broker.stop(signal.SIGTERM) == 0
    text = broker.log.read_text()
    assert ("stopping: SIGTERM; 1 task queued, 0 running, 1 delayed; journal flushed to "
            f"{broker.config_path.parent / 'cronoq-data'}") in text
    assert text.rstrip().endswith('msg=stopped'), text


async def test_the_reload_line_reads_as_text_and_names_changed_weights(broker_factory):
    weighted = '[[pools]]\nname = "llm"\n[pools.tenant_weights]\nacme = {acme}\nglobex = 1\n'
    broker = broker_factory(weighted.format(acme=1), args=INFO)
    text = broker.config_path.read_text()
    broker.config_path.write_text(text.replace("acme = 1", "acme = 3") + '\n[[pools]]\nname = "batch"\n')
    async with cronoq.connect(broker.clients) as client:
        changes = await client.reload()
    assert changes["weights_changed"] == [{"pool": "llm", "tenant": "acme", "old": 1.0, "new": 3.0}]
    line = next(line for line in broker.log.read_text().splitlines() if "reloaded" in line)
    assert ("pools added: batch; pools draining: none; weights changed: llm acme 1 -> 3; "
            "kept until a restart: none") in line
    assert "{" not in line

    broker.config_path.write_text(broker.config_path.read_text().replace("acme = 3", "acme = 2"))
    shown = await asyncio.to_thread(run_command, ["-m", "cronoq.client.cli", "reload", "--broker", broker.clients])
    assert shown.returncode == 0 and "weights changed: llm acme 3 -> 2" in shown.stdout
