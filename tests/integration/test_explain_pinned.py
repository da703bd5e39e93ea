"""`explain` for a token pinned to a tenant, through a real broker: it learns nothing of other tenants' tasks.

globex's work stands in front of acme's task (critical tasks, deadline tasks); a token pinned to acme explains its
own tasks and must read neither counts of globex's tasks nor anything that moves with globex's deadlines, while an
admin token (not pinned) sees everything, as before.
"""

from __future__ import annotations

import json

import msgspec

import cronoq
from tests.support import run_command, start_worker_process, until

TOKENS = {"T_ACME": "acme-secret", "T_GLOBEX": "globex-secret", "T_ADMIN": "admin-secret",
          "T_WORKER": "worker-secret"}
CONFIG = """
[[pools]]
name = "default"

[[pools]]
name = "slow"
[pools.tenant_weights]
acme = 3
globex = 1

[[auth.tokens]]
token_env = "T_ACME"
role = "client"
tenant = "acme"

[[auth.tokens]]
token_env = "T_GLOBEX"
role = "client"
tenant = "globex"

[[auth.tokens]]
token_env = "T_ADMIN"
role = "admin"

[[auth.tokens]]
token_env = "T_WORKER"
role = "worker"
"""


def _without_estimate(waiting: dict) -> dict:
    return {k: v for k, v in waiting.items() if k not in ("estimate", "estimate_note")}


async def test_a_pinned_token_reads_no_count_and_no_deadline_of_another_tenant(broker_factory, tmp_path):
    broker = broker_factory(CONFIG, env=TOKENS)
    worker = start_worker_process(broker.workers, "tests.apps.echo:pools", tmp_path / "worker.log", env=TOKENS,
                                  extra=["--token-env", "T_WORKER"])
    try:
        async with cronoq.connect(broker.clients, token=TOKENS["T_GLOBEX"]) as globex, cronoq.connect(
            broker.clients, token=TOKENS["T_ACME"]
        ) as acme, cronoq.connect(broker.clients, token=TOKENS["T_ADMIN"]) as admin:
            held = await globex.submit("60", pool="slow", priority="critical")  # takes the one slot for a minute

            async def running() -> bool:
                return (await globex.status(held.id)).state == "running"

            await until(running, "globex's first task runs")
            for _ in range(4):
                await globex.submit("0", pool="slow", priority="critical")
            for i in range(3):
                await globex.submit("0", pool="slow", deadline=400 + i)
            await globex.submit("0", pool="slow")
            mine = await acme.submit("0", pool="slow")

            shown = (await acme.explain(mine.id)).waiting
            assert (shown.higher_classes_ahead, shown.deadline_ahead, shown.queue_ahead) == (0, 0, 0)
            assert shown.scope == "acme" and shown.dispatch_rate is None and shown.running == 0
            assert shown.nodes[0].name == "acme" and shown.nodes[0].hidden and shown.nodes[0].share == 0.0
            seen = (await admin.explain(mine.id)).waiting  # an unpinned admin sees it all, as before
            assert (seen.higher_classes_ahead, seen.deadline_ahead, seen.running) == (4, 3, 1)
            assert seen.scope is None and seen.nodes[0].share == 0.75

            # Deadline probes on either side of globex's deadlines read alike.
            probes = []
            for deadline in (395, 405):
                probe = await acme.submit("0", pool="slow", deadline=deadline)
                probes.append((await acme.explain(probe.id)).waiting)
                assert await acme.cancel(probe.id)
            before, after = (_without_estimate(msgspec.to_builtins(p)) for p in probes)
            assert before == after
            assert (probes[0].higher_classes_ahead, probes[0].deadline_ahead) == (0, 0)

            # The command shows a pinned token what it may see, and says what it does not.
            result = run_command(["-m", "cronoq.client.cli", "explain", mine.id, "--broker", broker.clients,
                                  "--token-env", "T_ACME"], env=TOKENS)
            assert result.returncode == 0, result.stderr
            assert "globex" not in result.stdout
            assert "other tenants' tasks are not shown to a token pinned to acme" in result.stdout
            assert "share not shown" in result.stdout
            expected = next(line for line in result.stdout.splitlines() if line.startswith("expected to start: "))
            assert "/s" not in expected  # no rate: the pool's and the work ahead's include globex's
            as_json = run_command(["-m", "cronoq.client.cli", "explain", mine.id, "--json", "--broker", broker.clients,
                                   "--token-env", "T_ACME"], env=TOKENS)
            assert "globex" not in as_json.stdout and json.loads(as_json.stdout)["waiting"]["scope"] == "acme"
    finally:
        worker.kill()
        worker.wait()

