"""The package's layout, held: which process loads what, who may import whom, no import cycles, one error tree.

cronoq is layered, lowest first. A module may import modules of its own layer and of the layers its row
names, and nothing else of cronoq — whether at the top of the file, inside a function, or only for the type
checker (`if TYPE_CHECKING:`): a type named from a layer above is a dependency upward all the same.

    layer       modules                              may import
    errors      cronoq.errors                        (nothing of cronoq)
    answers     cronoq.answers                       errors
    core        cronoq.core                          errors, answers
    wire        cronoq.wire                          errors
    vocabulary  cronoq.pool, cronoq.handles          errors, answers, core, wire
    client      cronoq.client                        errors, answers, wire, vocabulary
    worker      cronoq.worker                        errors, answers, wire, vocabulary
    book        cronoq.book                          errors, answers, core, wire
    embedded    cronoq.embedded                      errors, answers, core, wire, vocabulary, book
    store       cronoq.store (its helpers' lifeline) errors
    journal     cronoq.store.journal                 errors, answers, core, book, store
    results     cronoq.store.results                 errors, answers, core, book, store
    broker      cronoq.broker, its dashboard too     errors, answers, core, wire, vocabulary, book, store,
                                                     journal, results
    package     cronoq (its __init__)                errors, answers, vocabulary, client, worker, embedded

The store's two halves, the journal (what the broker must not lose) and the results store (finished tasks,
kept by a helper process), know nothing of each other: only the broker drives both.

Read as processes: a program that submits tasks or serves a pool (client, worker, and the public vocabulary
they share: Pool, TaskHandle, the answers and the errors) stands on the wire and never loads the task book,
the store or the broker; the embedded Scheduler and the broker both drive the task book over the core; only
the broker has a store and a dashboard. The core, the task book and the answers do no I/O and read no clock:
time and randomness are parameters.

No module imports another that (directly or through others) imports it back. Here only the imports that run
count: one under `if TYPE_CHECKING:` names a type for the checker and never runs (the core's Task and its
pool know each other's types: that is their data structure, not an order of loading). An import inside a
function runs when the function does, and counts.

Every exception a user can catch derives from `cronoq.errors.CronoqError` and is defined in cronoq/errors.py;
the few that never leave the part of the broker that raises them are listed in INTERNAL_EXCEPTIONS, with why.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "cronoq"

LAYERS: dict[str, tuple[str, ...]] = {
    "errors": ("cronoq.errors",),
    "answers": ("cronoq.answers",),
    "core": ("cronoq.core",),
    "wire": ("cronoq.wire",),
    "vocabulary": ("cronoq.pool", "cronoq.handles"),
    "client": ("cronoq.client",),
    "worker": ("cronoq.worker",),
    "book": ("cronoq.book",),
    "embedded": ("cronoq.embedded",),
    "store": ("cronoq.store",),
    "journal": ("cronoq.store.journal",),
    "results": ("cronoq.store.results",),
    "broker": ("cronoq.broker",),
    "package": ("cronoq",),
}
"""Each layer's modules: a name here covers its submodules (the longest name that covers a module wins)."""

MAY_IMPORT: dict[str, frozenset[str]] = {
    "errors": frozenset(),
    "answers": frozenset({"errors"}),
    "core": frozenset({"errors", "answers"}),
    "wire": frozenset({"errors"}),
    "vocabulary": frozenset({"errors", "answers", "core", "wire"}),
    "client": frozenset({"errors", "answers", "wire", "vocabulary"}),
    "worker": frozenset({"errors", "answers", "wire", "vocabulary"}),
    "book": frozenset({"errors", "answers", "core", "wire"}),
    "embedded": frozenset({"errors", "answers", "core", "wire", "vocabulary", "book"}),
    "store": frozenset({"errors"}),
    "journal": frozenset({"errors", "answers", "core", "book", "store"}),
    "results": frozenset({"errors", "answers", "core", "book", "store"}),
    "broker": frozenset({"errors", "answers", "core", "wire", "vocabulary", "book", "store", "journal", "results"}),
    "package": frozenset({"errors", "answers", "vocabulary", "client", "worker", "embedded"}),
}
"""The layers each layer may import besides its own: the table of this module's docstring."""

NO_IO_LAYERS = ("core", "book", "answers")
"""Layers that do no I/O, read no clock and draw no random numbers: the time and an rng come in as parameters."""
NO_IO_MODULES = frozenset({"asyncio", "os", "selectors", "socket", "sqlite3", "subprocess", "threading", "time",
                           "uvloop", "zmq", "random"})
"""What those layers may not import (`random` only for its type, under TYPE_CHECKING: the rng is injected)."""
CLOCK_CALLS = frozenset({"now", "utcnow", "today", "time", "monotonic", "perf_counter"})
"""Calls that read a clock, whatever module they are reached through."""

INTERNAL_EXCEPTIONS: dict[str, str] = {
    "cronoq.broker.held.HoldError":
        "a standby cannot hold an address yet: an OSError (a failed bind), caught in held.py and reported as a "
        "problem the standby logs and retries",
    "cronoq.broker.held.Unholdable":
        "an address only ZeroMQ can bind: a HoldError caught in held.py; the broker binds it at the takeover",
    "cronoq.store.journal.fence.Fenced":
        "a later broker took data_dir over: an OSError on purpose, so that a fenced broker's write fails as any "
        "failed write does and the broker stops writing",
}
"""Exceptions defined outside cronoq/errors.py that never reach a program or a command line, with why.
Private ones (a leading underscore) are signals inside one module and need no entry."""


# ------------------------------------------------------------------------------------------ the module graph


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    runs: bool
    """False for an import under `if TYPE_CHECKING:`, which never runs."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _absolute(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    """Every cronoq module `name` imports, wherever the import statement is."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found: list[Import] = []

    def visit(node: ast.AST, runs: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, False)
            for child in node.orelse:
                visit(child, runs)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "cronoq" or alias.name.startswith("cronoq."):
                    found.append(Import(name, alias.name, node.lineno, runs))
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(name, is_package, node)
            if module == "cronoq" or module.startswith("cronoq."):
                for alias in node.names:
                    # `from cronoq.store.journal import frames` imports the module cronoq.store.journal.frames.
                    submodule = f"{module}.{alias.name}"
                    found.append(Import(name, submodule if submodule in modules else module, node.lineno, runs))
        for child in ast.iter_child_nodes(node):
            visit(child, runs)

    visit(tree, True)
    return found


def layer_of(module: str) -> str:
    best, best_len = None, -1
    for layer, prefixes in LAYERS.items():
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = layer, len(prefix)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best


@pytest.fixture(scope="module")
def graph() -> list[Import]:
    modules = all_modules()
    return [imp for name, path in modules.items() for imp in imports_of(name, path, modules)]


# ------------------------------------------------------------------------------------------------ the layers


def test_the_table_names_every_layer_once():
    assert set(LAYERS) == set(MAY_IMPORT)
    for layer, allowed in MAY_IMPORT.items():
        assert layer not in allowed and allowed <= set(LAYERS), layer
    for name in all_modules():
        layer_of(name)  # every module has a layer


def test_nothing_imports_upward(graph):
    wrong = []
    for imp in graph:
        mine, theirs = layer_of(imp.importer), layer_of(imp.imported)
        if theirs != mine and theirs not in MAY_IMPORT[mine]:
            wrong.append(f"{imp.importer} ({mine}) imports {imp.imported} ({theirs}), line {imp.line}")
    assert not wrong, "imports against the layers (see this file's docstring):\n" + "\n".join(wrong)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, or of one that imports itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in edges.get(node, ()):
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            connect(node)
    return found


def test_no_import_cycles(graph):
    edges: dict[str, set[str]] = {}
    for imp in graph:
        if imp.runs and imp.imported != imp.importer:
            edges.setdefault(imp.importer, set()).add(imp.imported)
    cycles = _cycles(edges)
    assert not cycles, "modules that import each other (move what they share into a module both import):\n" + \
        "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


# --------------------------------------------------------------------------------- what each process loads


def _loaded_after(code: str) -> list[str]:
    """The cronoq modules a fresh interpreter has loaded after running `code`."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    script = code + "\nimport json, sys\nprint(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'cronoq')))"
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


BROKER_SIDE = ("cronoq.broker", "cronoq.store", "cronoq.book", "cronoq.embedded")
"""What a program that only submits tasks or serves a pool never loads."""


@pytest.mark.parametrize("code", [
    "import cronoq; cronoq.connect, cronoq.connect_sync, cronoq.Client, cronoq.Worker, cronoq.Pool, cronoq.TaskHandle",
    "from cronoq import connect, Worker, Pool, CronoqError, TaskInfo, Explanation",
    "import cronoq.client.cli",  # the `cronoq` command
    "import cronoq.worker.cli",  # the `cronoq-worker` command
], ids=["package", "from-import", "cronoq-command", "worker-command"])
def test_a_client_or_a_worker_loads_nothing_of_the_broker(code):
    loaded = _loaded_after(code)
    wrong = [m for m in loaded if m.startswith(BROKER_SIDE)]
    assert not wrong, f"`{code}` loads {wrong}"


def test_the_scheduler_loads_when_asked_for():
    loaded = _loaded_after("import cronoq\nassert 'Scheduler' in cronoq.__all__ and 'Scheduler' in dir(cronoq)\n"
                           "from cronoq import Scheduler\nassert cronoq.Scheduler is Scheduler\n"
                           "assert Scheduler.__module__ == 'cronoq.embedded'")
    assert "cronoq.embedded" in loaded and "cronoq.book.taskbook" in loaded
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        import cronoq
        cronoq.NoSuchName  # noqa: B018 - the package's __getattr__ must not swallow other names


# ----------------------------------------------------------------------------------- no I/O, clock or chance


def _modules_of(layer: str) -> dict[str, Path]:
    return {name: path for name, path in all_modules().items() if layer_of(name) == layer}


@pytest.mark.parametrize("layer", NO_IO_LAYERS)
def test_the_pure_layers_import_no_io_clock_or_randomness(layer):
    wrong = []
    for name, path in _modules_of(layer).items():
        tree = ast.parse(path.read_text(), filename=str(path))
        type_only: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                type_only.update(id(child) for stmt in node.body for child in ast.walk(stmt))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            for imported in names:
                top = imported.split(".")[0]
                if top in NO_IO_MODULES and not (top == "random" and id(node) in type_only):
                    wrong.append(f"{name} imports {imported} (line {node.lineno})")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
                if called in CLOCK_CALLS or called in ("open", "print", "input"):
                    wrong.append(f"{name} calls {called}() (line {node.lineno})")
    assert not wrong, f"the {layer} layer must do no I/O and read no clock (pass the time in):\n" + "\n".join(wrong)


# ------------------------------------------------------------------------------------------- one error tree


def _exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined in a module of cronoq, by qualified name (importing every module)."""
    found = {}
    for name in all_modules():
        if name.endswith("__main__"):
            continue
        module = importlib.import_module(name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == name:
                found[f"{name}.{obj.__qualname__}"] = obj
    return found


def test_every_exception_a_user_can_catch_is_in_the_one_tree():
    from cronoq.errors import CronoqError

    wrong = []
    for qualified, cls in _exception_classes().items():
        if cls.__module__ == "cronoq.errors":
            if not issubclass(cls, CronoqError):
                wrong.append(f"{qualified} is not a CronoqError")
        elif qualified not in INTERNAL_EXCEPTIONS and not cls.__name__.startswith("_"):
            wrong.append(f"{qualified}: define it in cronoq/errors.py under CronoqError, "
                         "or list it in INTERNAL_EXCEPTIONS with why no user meets it")
    assert not wrong, "\n".join(wrong)
    stale = [name for name in INTERNAL_EXCEPTIONS if name not in _exception_classes()]
    assert not stale, f"no longer defined: delete from INTERNAL_EXCEPTIONS: {stale}"


def test_every_public_exception_is_a_cronoq_error_and_documented():
    import cronoq
    import cronoq.errors as errors

    api = (ROOT / "docs" / "api.md").read_text()
    section = api[api.index("\n## Errors\n"):]
    section = section[: section.index("\n## ", 1)]
    public = {name: getattr(cronoq, name) for name in cronoq.__all__}
    public.update({name: obj for name, obj in vars(errors).items() if not name.startswith("_")})
    for name, obj in public.items():
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            assert issubclass(obj, errors.CronoqError), name
            assert f"`cronoq.{name}`" in section or f"`cronoq.errors.{name}`" in section, \
                f"the errors section of docs/api.md does not name {name}"
            if obj is not errors.CronoqError:
                assert f"`{obj.code}`" in section, f"the errors section of docs/api.md does not give {name}'s code"


def test_the_errors_moved_into_the_tree_keep_their_old_names_and_bases():
    import pickle

    from cronoq import errors
    from cronoq.broker import config, schedules
    from cronoq.client import cli as client_cli
    from cronoq.store.journal import journal, reading
    from cronoq.worker import cli as worker_cli

    assert config.ConfigError is errors.ConfigError and schedules.ScheduleError is errors.ScheduleError
    assert reading.StoreError is journal.StoreError is errors.StoreError
    assert reading.DamagedFile is journal.DamagedFile is errors.DamagedFile
    assert client_cli.UsageError is worker_cli.UsageError is errors.UsageError
    assert issubclass(errors.ScheduleError, ValueError) and issubclass(errors.ScheduleError, errors.ConfigError)
    damaged = pickle.loads(pickle.dumps(errors.DamagedFile(Path("/d/journal.00000001"), 7, "a checksum differs")))
    assert (damaged.path, damaged.offset, damaged.what) == (Path("/d/journal.00000001"), 7, "a checksum differs")
    assert str(damaged).startswith("/d/journal.00000001 is damaged at offset 7: a checksum differs; refusing")


def test_every_folder_of_the_package_is_a_regular_package():
    """A folder of modules without __init__.py imports from a checkout (as a namespace package) but is left out
    of the wheel `pip install .` builds (setuptools finds regular packages only): the installed broker would
    fail with ModuleNotFoundError although every test run from the checkout passed."""
    missing = sorted(
        str(folder.relative_to(ROOT)) for folder in PACKAGE.rglob("*")
        if folder.is_dir() and any(folder.glob("*.py")) and not (folder / "__init__.py").exists()
    )
    assert not missing, f"folders of cronoq without __init__.py (left out of the wheel): {missing}"
