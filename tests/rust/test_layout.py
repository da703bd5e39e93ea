"""The Rust crate's modules (rust/src) form layers: no module uses one that uses it back.

The module map at the top of rust/src/lib.rs names the layers. This reads every module's references to
others (`use crate::…`, `use super::…`, `crate::…` in code, a child module used by name) — comments and
`#[cfg(test)]` modules left out — and checks that the graph they make has no cycle, and that the few
arrows the map promises not to have are absent. It needs no Rust toolchain: it reads the source.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "rust" / "src"


def module_of(path: Path) -> str:
    """`client::connection` for src/client/connection.rs, `core` for src/core/mod.rs, `crate` for lib.rs."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] in ("mod", "lib"):
        parts.pop()
    return "::".join(parts) or "crate"


def without_comments_and_tests(text: str) -> str:
    # One pass, so that whichever starts first wins: a `//` inside a string, a quote inside a comment.
    text = re.sub(
        r"""//[^\n]*|/\*.*?\*/|"(?:[^"\\]|\\.)*"|'(?:[^'\\\n]|\\.)'""",
        lambda m: "" if m.group(0).startswith("/") else m.group(0)[0] * 2,
        text,
        flags=re.S,
    )
    # A test module (`#[cfg(test)] mod tests { … }`) uses what it tests; its `super` is the file's module.
    while (m := re.search(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", text)):
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        text = text[: m.start()] + text[i:]
    return text


def use_paths(text: str) -> list[str]:
    """Every path a `use` names, its braces expanded (`use crate::{a, b::c}` gives crate::a, crate::b::c)."""

    def expand(prefix: str, tree: str) -> list[str]:
        tree = tree.strip()
        if not tree:
            return []
        brace = tree.find("{")
        if brace < 0:
            return [prefix + tree.split(" as ")[0].strip()]
        head, body = tree[:brace], tree[brace + 1 : tree.rindex("}")]
        items, depth, start = [], 0, 0
        for i, ch in enumerate(body + ","):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                items.append(body[start:i])
                start = i + 1
        return [path for item in items for path in expand(prefix + head, item)]

    return [path for tree in re.findall(r"\buse\s+([^;]+);", text) for path in expand("", tree)]


def resolve(path: str, here: str, modules: set[str], children: set[str]) -> str | None:
    """The module a path points into (its longest prefix that is a module), or None outside the crate."""
    parts = [p for p in path.split("::") if p]
    if not parts:
        return None
    base = [] if here == "crate" else here.split("::")
    if parts[0] == "crate":
        names = parts[1:]
    elif parts[0] == "self":
        names = base + parts[1:]
    elif parts[0] == "super":
        up = base
        while parts and parts[0] == "super":
            up, parts = up[:-1], parts[1:]
        names = up + parts
    elif parts[0] in children:  # a child module named directly (`queues::ClassQueue`)
        names = base + parts
    else:
        return None  # std, a dependency, or a name in scope
    for n in range(len(names), 0, -1):
        candidate = "::".join(names[:n])
        if candidate in modules:
            return candidate
    return "crate"  # a name lib.rs re-exports (`crate::Client`): resolved below


def reexports(lib: str) -> dict[str, str]:
    """Names lib.rs re-exports, by the module that defines them (`Client` -> `client`)."""
    out = {}
    for path in use_paths(without_comments_and_tests(lib)):
        module, _, name = path.rpartition("::")
        if module and not module.startswith(("std", "rmpv")):
            out[name] = module
    return out


def module_graph(files: dict[str, str]) -> dict[str, set[str]]:
    """The modules each module uses, from `{module: source}` (lib.rs as `crate`)."""
    modules = set(files)
    exported = reexports(files.get("crate", ""))
    graph: dict[str, set[str]] = {m: set() for m in modules if m != "crate"}
    for here, source in files.items():
        if here == "crate":
            continue  # the root declares and re-exports everything: it is above all of it
        text = without_comments_and_tests(source)
        children = {m.rsplit("::", 1)[-1] for m in modules if m.startswith(here + "::") and m.count("::") == here.count("::") + 1}
        paths = use_paths(text) + re.findall(r"(?<![\w:])((?:crate|super|self)(?:::\w+)+)", text)
        paths += [m.group(0) for child in children for m in re.finditer(rf"(?<![\w:]){child}::\w+", text)]
        for path in paths:
            target = resolve(path, here, modules, children)
            if target == "crate":
                target = exported.get(path.rsplit("::", 1)[-1])
            if target and target != here:
                graph[here].add(target)
    return graph


def a_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """Some cycle of the graph, as the modules along it (first repeated last), or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def crate_files() -> dict[str, str]:
    return {module_of(p): p.read_text() for p in sorted(SRC.rglob("*.rs"))}


def test_the_reader_finds_a_cycle_where_there_is_one():
    """The check below can fail: a module that uses, through another, one that uses it is a cycle."""
    files = {
        "crate": "mod client;\nmod handle;\npub use client::Client;\n",
        "client": "use crate::handle::TaskHandle;\n// use crate::worker: a comment is no use\n",
        "handle": "pub struct TaskHandle;\nenum Source { Client(crate::Client) }\n",
    }
    graph = module_graph(files)
    assert graph == {"client": {"handle"}, "handle": {"client"}}
    assert a_cycle(graph) == ["client", "handle", "client"]
    files["handle"] = "pub struct TaskHandle;\n#[cfg(test)]\nmod tests {\n    use crate::client::x;\n}\n"
    assert a_cycle(module_graph(files)) is None


def test_a_child_named_directly_and_super_are_edges():
    files = {
        "crate": "pub mod core;\n",
        "core": "pub mod queues;\nuse queues::{ClassQueue};\npub struct Slot;\n",
        "core::queues": "use super::{Slot};\npub struct ClassQueue;\n",
    }
    assert a_cycle(module_graph(files)) == ["core", "core::queues", "core"]


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return module_graph(crate_files())


def test_the_crate_is_read(graph):
    """The reader sees the crate as it is: a check that reads nothing would pass anything."""
    assert {"client", "client::connection", "client::cluster", "worker", "worker::session", "handle"} <= set(graph)
    assert "client::connection" in graph["client"]
    assert "transport" in graph["channel"]


def test_the_modules_of_the_crate_form_no_cycle(graph):
    cycle = a_cycle(graph)
    assert cycle is None, "rust/src modules use each other in a cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize(
    "module, must_not_use",
    [
        # A handle asks whoever made it through a trait: it names neither a client nor the scheduler.
        ("handle", {"client", "client::connection", "client::cluster", "embedded"}),
        # One broker's connection knows nothing of clusters or of the client over it.
        ("client::connection", {"client", "client::cluster"}),
        ("worker::session", {"worker", "worker::cluster"}),
        # The routers sit under the public types, and the client and worker apart.
        ("client::cluster", {"client", "worker", "worker::cluster", "worker::session"}),
        ("worker::cluster", {"worker", "client", "client::cluster", "client::connection"}),
        # The socket is set up in one place (channel.rs) for both: the public types do not touch it.
        ("client", {"transport", "link", "libzmq"}),
        ("worker", {"transport", "link", "libzmq"}),
        # The wire and the scheduling core use nothing that does I/O above them.
        ("wire", {"transport", "channel", "client", "worker", "embedded", "libzmq"}),
        ("core", {"transport", "channel", "client", "worker", "embedded", "wire", "libzmq"}),
    ],
)
def test_lower_layers_do_not_reach_up(graph, module, must_not_use):
    assert not graph[module] & must_not_use, f"{module} uses {sorted(graph[module] & must_not_use)}"
