"""Every mistake gets a clear, prompt answer: the wrong address, endpoint or key, through the real commands.

"Prompt" is checked without timing anything: each command or request is given a timeout far longer than
the test waits for it (`LONG`), so only an answer that names its cause, given early, lets the test pass.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import cronoq
from tests.support import free_port, run_command, start_worker_process, until, wait_for_line

LONG = "600"  # seconds: the --timeout of commands that must answer long before it
WAIT = 60.0  # seconds the test waits for that answer (an old client would sit out its timeout)

OPEN = '[[pools]]\nname = "default"\n'
TOKENS = {"T_CLIENT": "client-secret", "T_WORKER": "worker-secret"}
WITH_TOKENS = OPEN + ('\n[[auth.tokens]]\ntoken_env = "T_CLIENT"\nrole = "client"\n'
                      '\n[[auth.tokens]]\ntoken_env = "T_WORKER"\nrole = "worker"\n')


def cronoq_cli(*args: str, env: dict[str, str] | None = None):
    return run_command(["-m", "cronoq.client.cli", *args, "--timeout", LONG], env=env, timeout=WAIT)


def worker_cli(broker: str, *args: str, env: dict[str, str] | None = None):
    return run_command(["-m", "cronoq.worker.cli", "--broker", broker, "--heartbeat-interval", "0.2", *args,
                        "tests.apps.echo:default"], env=env, timeout=WAIT)


def one_line(result) -> str:
    """The command's error, checked to be one line without a traceback."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines, f"no message; exit {result.returncode}"
    return lines[-1]


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The broker's key pair, and the public key of another broker."""
    public, secret = cronoq.wire.curve.keygen(tmp_path / "keys")
    other, _ = cronoq.wire.curve.keygen(tmp_path / "other")
    return public, secret, other


# ----------------------------------------------------------------- nobody there

def test_the_cli_says_the_connection_was_refused():
    nowhere = f"tcp://127.0.0.1:{free_port()}"
    for command in (["status"], ["submit", "1"], ["inspect", "some-id"]):
        result = cronoq_cli(*command, "--broker", nowhere)
        assert result.returncode == 1
        assert one_line(result) == (f"cronoq {command[0]}: UNAVAILABLE: connection refused at {nowhere}: "
                                    "is a broker running there?")


async def test_a_client_that_never_reached_a_broker_fails_promptly_and_sends_nothing_later(broker_factory):
    address = f"tcp://127.0.0.1:{free_port()}"
    async with cronoq.connect(address, request_timeout=float(LONG)) as client:
        with pytest.raises(cronoq.Unavailable, match=f"connection refused at {address}: is a broker running there"):
            await asyncio.wait_for(client.submit("never sent"), WAIT)
        with pytest.raises(cronoq.Unavailable, match="connection refused"):
            await client.ping()  # at once, while nobody is there

        # A broker comes up there: the client connects by itself, and the submit it was told had failed
        # never arrives.
        broker = broker_factory(f'[broker]\nclients = "{address}"\nworkers = "tcp://127.0.0.1:{free_port()}"\n'
                                f'durability = "none"\n' + OPEN)

        async def answers() -> bool:
            try:
                await client.ping()
            except cronoq.Unavailable:
                return False
            return True

        await until(answers, "the client reached the broker that came up")
        assert (await client.stats())["pools"]["default"]["queued"] == 0


# ----------------------------------------------------------------- a handler module that cannot be imported

@pytest.mark.parametrize("source, problem", [
    ("def handle(payload:\n    return payload\n", "cannot import module 'brokenapp': '(' was never closed (FILE, line 1)"),
    ("import json\nraise RuntimeError('no GPU here')\n",
     "cannot import module 'brokenapp': importing it raised RuntimeError: no GPU here (FILE, line 2)"),
])
def test_a_handler_module_that_fails_to_import_gets_one_line_and_exit_2(tmp_path, source, problem):
    module = tmp_path / "brokenapp.py"
    module.write_text(source)
    result = run_command(["-m", "cronoq.worker.cli", "--broker", f"tcp://127.0.0.1:{free_port()}", "brokenapp:pool"],
                         timeout=WAIT, cwd=tmp_path)
    assert result.returncode == 2
    assert one_line(result) == "cronoq-worker: usage: " + problem.replace("FILE", str(module))


# ----------------------------------------------------------------- the wrong endpoint

def test_the_cli_on_the_worker_endpoint_is_told_where_to_go(broker_factory):
    broker = broker_factory(OPEN)
    for command in (["status"], ["submit", "1"]):
        result = cronoq_cli(*command, "--broker", broker.workers)
        assert result.returncode == 1
        assert one_line(result) == (f"cronoq {command[0]}: INVALID_ARGUMENT: this is the broker's worker endpoint; "
                                    f"clients (and the cronoq command) connect to its client endpoint "
                                    f"({broker.clients})")


def test_the_wrong_endpoint_is_named_before_any_token_trouble(broker_factory):
    broker = broker_factory(WITH_TOKENS, env=TOKENS)
    for token in ("T_CLIENT", "NOT_SET"):
        result = cronoq_cli("status", "--broker", broker.workers, "--token-env", token, env=TOKENS)
        assert "this is the broker's worker endpoint" in one_line(result)
    worker = worker_cli(broker.clients, "--token-env", "T_WORKER", env=TOKENS)
    assert worker.returncode == 2
    assert one_line(worker) == (f"cronoq-worker: INVALID_ARGUMENT: this is the broker's client endpoint; "
                                f"workers connect to its worker endpoint ({broker.workers})")


async def test_a_client_on_the_worker_endpoint_fails_every_request_with_the_hint(broker_factory):
    broker = broker_factory(OPEN)
    async with cronoq.connect(broker.workers, request_timeout=float(LONG)) as client:
        for request in (client.ping(), client.submit("x"), client.status("some-id")):
            with pytest.raises(cronoq.InvalidArgument, match="this is the broker's worker endpoint"):
                await asyncio.wait_for(request, WAIT)


# ----------------------------------------------------------------- encryption

def test_the_cli_names_each_curve_mistake(broker_factory, keys):
    public, secret, other = keys
    encrypted = broker_factory(OPEN, broker_extra=f'curve_secret_key_file = "{secret}"', name="encrypted.toml")
    plain = broker_factory(OPEN, name="plain.toml")

    # A broker of the other kind sometimes drops the connection before the peer reads why; the mismatch is
    # named once it shows, and should it not show for long, the message still says what to do.
    without_key = cronoq_cli("status", "--broker", encrypted.clients)
    assert one_line(without_key) in (
        f"cronoq status: UNAVAILABLE: the broker at {encrypted.clients} is encrypted (CURVE): give its public key "
        "(curve_public_key, --curve-public-key), the NAME.key file `cronoq keygen` wrote with its secret key",
        f"cronoq status: UNAVAILABLE: the broker at {encrypted.clients} dropped the connection during the "
        "handshake: if it is encrypted (CURVE), give its public key (curve_public_key, --curve-public-key); if "
        "not, is this a cronoq broker's endpoint, with room for another connection (max_connections)?")
    wrong_key = cronoq_cli("status", "--broker", encrypted.clients, "--curve-public-key", str(other))
    assert one_line(wrong_key) == (
        f"cronoq status: UNAVAILABLE: CURVE handshake with {encrypted.clients} failed: the public key given "
        "(curve_public_key, --curve-public-key) is not this broker's; give the NAME.key written with its "
        "curve_secret_key_file (or leave the key out, if the broker is not encrypted)")
    needless_key = cronoq_cli("status", "--broker", plain.clients, "--curve-public-key", str(public))
    assert one_line(needless_key) in (
        f"cronoq status: UNAVAILABLE: the broker at {plain.clients} is not encrypted, but a CURVE public key was "
        "given (curve_public_key, --curve-public-key): leave it out, or give the broker a curve_secret_key_file",
        one_line(wrong_key).replace(encrypted.clients, plain.clients))
    for result in (without_key, wrong_key, needless_key):
        assert result.returncode == 1
    right = cronoq_cli("status", "--broker", encrypted.clients, "--curve-public-key", str(public))
    assert right.returncode == 0, right.stderr


async def test_a_client_without_the_right_key_fails_promptly_naming_it(broker_factory, keys):
    public, secret, other = keys
    broker = broker_factory(OPEN, broker_extra=f'curve_secret_key_file = "{secret}"')
    for key, problem in ((None, "give its public key"), (other, "CURVE handshake")):
        async with cronoq.connect(broker.clients, request_timeout=float(LONG), curve_public_key=key) as client:
            with pytest.raises(cronoq.Unavailable, match=problem):
                await asyncio.wait_for(client.ping(), WAIT)


def test_a_worker_without_the_right_key_stops_and_says_why(broker_factory, keys):
    public, secret, other = keys
    broker = broker_factory(OPEN, broker_extra=f'curve_secret_key_file = "{secret}"')
    without_key = worker_cli(broker.workers)
    assert without_key.returncode == 2
    assert one_line(without_key).startswith(f"cronoq-worker: UNAVAILABLE: the broker at {broker.workers} ")
    assert "give its public key (curve_public_key, --curve-public-key)" in one_line(without_key)
    wrong_key = worker_cli(broker.workers, "--curve-public-key", str(other))
    assert wrong_key.returncode == 2
    assert one_line(wrong_key).startswith(f"cronoq-worker: UNAVAILABLE: CURVE handshake with {broker.workers} failed")
    for result in (without_key, wrong_key):
        assert "send queue is full" not in result.stderr


def test_a_worker_started_before_its_broker_says_why_it_waits_then_serves(broker_factory, tmp_path):
    workers = f"tcp://127.0.0.1:{free_port()}"
    log = tmp_path / "early-worker.log"
    worker = start_worker_process(workers, "tests.apps.echo:default", log, wait=False)
    try:
        wait_for_line(worker, log, f"connection refused at {workers}: is a broker running there?")
        broker_factory(f'[broker]\nclients = "tcp://127.0.0.1:{free_port()}"\nworkers = "{workers}"\n'
                       f'durability = "none"\n' + OPEN)
        wait_for_line(worker, log, "registered with")
        assert log.read_text().count("connection refused") == 1, "said once, not at every attempt"
    finally:
        worker.terminate()
        worker.wait(WAIT)


def test_the_blocking_client_names_a_refused_connection_too():
    nowhere = f"tcp://127.0.0.1:{free_port()}"
    with cronoq.connect_sync(nowhere, request_timeout=WAIT) as client:
        # After request_timeout the message would start "no reply from the broker ...".
        with pytest.raises(cronoq.Unavailable, match=f"^connection refused at {nowhere}"):
            client.submit("x")
