"""The README's worked example (examples/llm) runs as the README says: broker, worker, client."""

from __future__ import annotations

import re
import shutil

from tests.support import ROOT, BrokerProcess, free_port, run_command, start_worker_process


def test_the_llm_example_shares_the_pool_3_to_1(tmp_path):
    example = tmp_path / "llm"
    shutil.copytree(ROOT / "examples" / "llm", example)
    config = example / "cronoq.toml"
    clients, workers = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    text = config.read_text().replace("tcp://127.0.0.1:5555", clients).replace("tcp://127.0.0.1:5556", workers)
    config.write_text(text)
    broker = BrokerProcess(config).start()
    worker = start_worker_process(workers, "tasks:llm", tmp_path / "worker.log", cwd=example)
    try:
        result = run_command([str(example / "client.py"), clients], cwd=example, timeout=60)
        assert result.returncode == 0, result.stderr
        order = re.search(r"dispatch order: (.*)", result.stdout).group(1).split()
        assert order[:16] == ["g", "a", "a", "a"] * 4
        assert "first 16: {'acme': 12, 'globex': 4}" in result.stdout
    finally:
        worker.terminate()
        worker.wait(10)
        assert broker.stop() == 0
