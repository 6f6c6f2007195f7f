"""The shape of the code: imports point down, private names stay home (issue 8).

Every module under kernel/ (package ``durkv``), backends/ (``durkv.backends``)
and cli/ (``durkv.cli``) is parsed with :mod:`ast` -- nothing is imported -- and
each import of a durkv module is checked against three rules:

1. **Imports point down.** The layers, top to bottom, are
   cli -> langgraph -> runtime -> store -> backends -> log -> errors (README's
   order, checked by :func:`test_the_ranks_follow_the_documented_layers`), and every
   module has a rank in :data:`RANKS`; a module imports only modules of a lower
   rank. That holds for imports inside functions and under ``TYPE_CHECKING`` too,
   so the import graph has no cycle at all: a lazy import may load an optional or
   costly module on use, but never hides a cycle.
2. **No private name crosses a module line:** no ``from durkv.x import _name``.
   The compiled modules ``durkv._seglog``, ``durkv._listprefix``,
   ``durkv._journalscan``, ``durkv._recpack``, ``durkv._commitframe``,
   ``durkv._msgunpack``, ``durkv._chanenc``, ``durkv._commitpath``, ``durkv._lgcommit``,
   ``durkv._msgfields``, ``durkv._heldcall`` and ``durkv._zstdheld`` are imported by
   the one module that wraps each (:data:`WRAPPERS`).
3. **Every module has a rank:** a new module (``kernel/runtime/``, ``backends/s3/``)
   fails this test until it is placed in :data:`RANKS`, in the layer it belongs to.

:data:`KNOWN_VIOLATIONS` lists exceptions one by one; the store restructuring of
issue 8 (item 1) left it empty, and anything in it must say why.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"kernel": "durkv", "backends": "durkv.backends", "cli": "durkv.cli"}  # setup.py

# Rank of every module: a module may import only modules of a lower rank. Layers are
# decades; inside a layer, a module ranks above the modules it uses.
RANKS = {
    # errors: the foundation; imports no durkv module
    "durkv.errors": 0,
    "durkv.durability": 1,          # the policy names (sync, async, exit)
    "durkv.fsync": 1,               # fsync of a file or a directory by path
    # log: the C segment log and the commit-payload format it frames
    "durkv._seglog": 10,            # compiled (cffi)
    "durkv._commitframe": 10.5,     # compiled (CPython extension): COMMIT payload layout
    "durkv._zstdheld": 10.5,        # compiled (CPython extension): zstd, the GIL held
    "durkv._heldcall": 10.5,        # compiled (CPython extension): log calls, the GIL held
    "durkv.payload": 11,            # commit-payload codec, shared by the log and the store
    "durkv.repairnotes": 11.5,      # repairs/<id>.json: a cut's durable witness (FORMAT 6a)
    "durkv.log": 12,
    # backends: append/read/scan of commit payloads
    "durkv.backends.base": 20,
    "durkv.backends.memory": 21,
    "durkv.backends.local": 21,
    "durkv.backends.s3.manifest": 20,   # S3: archive layout, archive/restore, live s3://
    "durkv.backends.s3.segfile": 20,
    "durkv.backends.s3.client": 20,
    "durkv.backends.s3.livefmt": 20,
    "durkv.backends.s3.archiver": 21,
    "durkv.backends.s3.livecache": 21,
    "durkv.backends.s3.livemerge": 21,
    "durkv.backends.s3.live": 22,
    "durkv.backends.s3.decisions": 22,  # decision objects (FORMAT.md 13)
    "durkv.backends.s3.restorer": 22,
    "durkv.backends.s3.liverestore": 23,
    "durkv.backends.s3.livearchive": 23,
    "durkv.backends.s3": 24,
    "durkv.backends": 24,           # open_backend(url)
    # store (kernel/store/, durkv.store): checkpoints, channels, history, compaction
    "durkv._listprefix": 30,        # compiled (CPython extension)
    "durkv.serde": 30,
    "durkv.store.stepids": 29.5,    # compact step ids in journal heads (FORMAT.md 5a)
    "durkv.store.index": 30,        # the in-memory index
    "durkv.store.records": 30,      # frame heads (typed), result types
    "durkv.store.ckpthead": 30.5,   # checkpoint heads: keyframes and zstd deltas
    "durkv.store.appender": 31,     # frames to the backend
    "durkv.store.drivers": 30,      # one driver per run/thread across processes (flock)
    "durkv.store.replay": 32,       # the index as the log builds it, snapshots
    "durkv._chanenc": 32.5,         # compiled (CPython extension): a put's channels in C
    "durkv.store.delta": 33,        # channel encoding, a lane's newest state
    "durkv._commitpath": 33.6,      # compiled (CPython extension): put/put_writes' checks, writes
    "durkv._recpack": 33.5,         # compiled (CPython extension): a journal record's payload
    "durkv.store.reads": 34,        # get
    "durkv.store.writer": 34,       # put, put_writes, journal records
    "durkv.store.history": 35,      # newest-first streams
    "durkv.store.edits": 35,        # delete, copy, prune
    "durkv.store.compact": 35,      # compaction
    "durkv.store.stats": 35,        # what a store holds, bytes by record kind
    "durkv.store.repair": 35,       # what a cut removed: the runs/threads in its bytes
    "durkv.store.store": 36,        # Store: the facade composing them
    "durkv.store": 37,              # the package: re-exports the public names
    # runtime (kernel/runtime/): the run journal, over the store's public API
    "durkv._journalscan": 59,       # compiled (CPython extension): journal heads read for a replay
    "durkv.runtime.records": 59.5,  # journal records: one type per event (FORMAT.md 5a)
    "durkv.runtime.inputs": 59.7,   # a call's inputs as items, recorded once, by reference
    "durkv.runtime.journal": 60,
    "durkv.runtime.tools": 60,
    "durkv.runtime.values": 60,     # recorded values, canonical fingerprints, exceptions
    "durkv.runtime.plan": 61,
    "durkv.runtime.view": 61,
    "durkv.runtime.aio": 62,
    "durkv.runtime.repair": 62,     # the repair guard: touched runs, damage, acknowledge
    "durkv.runtime.run": 63,
    "durkv.runtime.remote": 63.5,   # decide/resolve through S3 decision objects
    "durkv.runtime.control": 64,
    "durkv.runtime.langgraph_steps": 64,
    "durkv.runtime.graph_spec": 64,     # durkv.Graph: channels, reducers, Send, routing
    "durkv.runtime.graph_ctx": 64,      # a node's ctx: the journal scoped to a task
    "durkv.runtime.graph_exec": 64.5,   # one execution: barrier, commit, pause
    "durkv.runtime.graph": 64.7,        # Graph (builder, checks) and App (run, resume, ...)
    "durkv.runtime": 65,            # RuntimeStore: the store with run/decide/resolve/runs
    # the package facade (durkv.open, durkv.tool, the errors): the runtime's door
    "durkv": 66,
    # langgraph: the checkpointer (DurkvSaver) over the store, and the runtime's step/tool
    # re-exported for LangGraph nodes: so it ranks above the runtime
    "durkv._msgunpack": 66.2,       # compiled (CPython extension): list items decoded in C
    "durkv._lgcommit": 66.3,        # compiled (CPython extension): LangGraphSerde.dumps, metadata
    "durkv._msgfields": 66.4,       # compiled (CPython extension): a history checked by value
    "durkv.langgraph_messages": 66.5,   # LangChain messages encoded from their fields
    "durkv.langgraph_serde": 67,
    "durkv.langgraph_claim": 67,    # one driver per thread: the bracket of an invocation
    "durkv.langgraph": 68,
    # cli: the durkv command
    "durkv.cli.strict_json": 70,
    "durkv.cli.output": 71,
    "durkv.cli.stores": 71,
    "durkv.cli.reports": 72,
    "durkv.cli.browse": 73,
    "durkv.cli.archive": 73,
    "durkv.cli.demo_agent": 72,     # the demo's agent and its child processes' entry points
    "durkv.cli.demo_report": 72.5,  # the demo's figures, read from the store and the files
    "durkv.cli.demo": 73,
    "durkv.cli.benchwork": 71,      # durkv bench: the agent-loop workloads, the runner
    "durkv.cli.benchgraph": 72,     # durkv bench: the loop as a LangGraph graph, NullSaver
    "durkv.cli.bench": 73,
    "durkv.cli.maint": 73,          # compact, stats
    "durkv.cli.journal_view": 74,
    "durkv.cli.operate": 74.5,      # runs, journal, approve, reject, resolve
    "durkv.cli.main": 75,
    "durkv.cli": 76,
    "durkv.cli.__main__": 77,
}

# compiled module -> the one module that wraps it
WRAPPERS = {"durkv._seglog": "durkv.log", "durkv._listprefix": "durkv.store.delta",
            "durkv._journalscan": "durkv.runtime.journal",
            "durkv._recpack": "durkv.store.writer", "durkv._commitframe": "durkv.payload",
            "durkv._msgunpack": "durkv.langgraph_serde", "durkv._chanenc": "durkv.store.delta",
            "durkv._commitpath": "durkv.store.writer", "durkv._lgcommit": "durkv.langgraph_serde",
            "durkv._msgfields": "durkv.langgraph_messages", "durkv._heldcall": "durkv.log",
            "durkv._zstdheld": "durkv.payload"}

# Known violations: (importer, imported module, name) triples allowed one by one, each
# with the reason it must stay. The store restructuring (issue 8 item 1) removed the last
# ones (compact <-> store, and the store's private _Chan/_Head shared across modules).
KNOWN_VIOLATIONS: set[tuple[str, str, str]] = set()


class Import(NamedTuple):
    importer: str   # module doing the import
    module: str     # durkv module imported
    name: str       # the name taken from it ("" for a whole module)
    where: str      # "module", "function" or "TYPE_CHECKING"
    line: int

    def __str__(self) -> str:
        what = f"{self.module}.{self.name}" if self.name else self.module
        return f"{self.importer}:{self.line} imports {what} ({self.where} level)"


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


MODULES = _modules()


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _base(importer: str, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` names."""
    if not node.level:
        return node.module or ""
    parts = importer.split(".")
    if not _is_package(importer):
        parts.pop()                        # a module's imports are relative to its package
    parts = parts[:len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def _durkv(module: str) -> bool:
    return module == "durkv" or module.startswith("durkv.")


def _imports(importer: str, path: Path) -> Iterator[Import]:
    tree = ast.parse(path.read_text(), str(path))

    def visit(node: ast.AST, where: str) -> Iterator[Import]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _durkv(alias.name):
                    yield Import(importer, alias.name, "", where, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = _base(importer, node)
            if _durkv(base):
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in MODULES or sub in WRAPPERS:    # `from . import log`: a module
                        yield Import(importer, sub, "", where, node.lineno)
                    else:
                        yield Import(importer, base, alias.name, where, node.lineno)
        inner = where
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inner = "function"
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                yield from visit(child, "TYPE_CHECKING")
            for child in node.orelse:
                yield from visit(child, where)
            return
        for child in ast.iter_child_nodes(node):
            yield from visit(child, inner)

    yield from visit(tree, "module")


ALL_IMPORTS = [imp for module, path in MODULES.items() for imp in _imports(module, path)]


def _known(imp: Import) -> bool:
    return (imp.importer, imp.module, imp.name) in KNOWN_VIOLATIONS


def test_every_module_has_a_rank():
    missing = sorted(set(MODULES) - set(RANKS))
    assert not missing, f"place these modules in a layer of RANKS in {__file__}: {missing}"
    imported = {imp.module for imp in ALL_IMPORTS}
    unknown = sorted(imported - set(RANKS))
    assert not unknown, f"imports of modules that do not exist: {unknown}"


def test_imports_point_down():
    """Module level, inside functions and under TYPE_CHECKING alike: so no lazy import
    can hide a cycle (a cycle needs one import that does not point down)."""
    bad = [str(imp) for imp in ALL_IMPORTS
           if RANKS[imp.module] >= RANKS[imp.importer] and not _known(imp)]
    assert not bad, ("imports that do not point down (cli -> langgraph -> runtime -> store -> "
                     "backends -> log -> errors; RANKS in tests/test_layers.py):\n"
                     + "\n".join(bad))


def test_no_private_name_crosses_a_module_line():
    bad = []
    for imp in ALL_IMPORTS:
        if imp.module in WRAPPERS:
            if WRAPPERS[imp.module] != imp.importer:
                bad.append(f"{imp}: only {WRAPPERS[imp.module]} wraps {imp.module}")
        elif any(p.startswith("_") and not p.startswith("__") for p in imp.module.split(".")):
            bad.append(f"{imp}: a private module")
        elif imp.name.startswith("_") and not imp.name.startswith("__") and not _known(imp):
            bad.append(f"{imp}: a private name")
    assert not bad, "\n".join(bad)


def test_the_import_graph_has_no_cycle():
    """Follows from the ranks, and is what a reader needs: checked on its own so that a
    cycle is named, whatever the ranks say (known violations are left out)."""
    edges: dict[str, set[str]] = {}
    for imp in ALL_IMPORTS:
        if not _known(imp):
            edges.setdefault(imp.importer, set()).add(imp.module)
    done: set[str] = set()

    def walk(module: str, path: list[str]) -> None:
        if module in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(module):]
                                                                 + [module]))
        if module in done:
            return
        for target in sorted(edges.get(module, ())):
            walk(target, path + [module])
        done.add(module)

    for module in sorted(edges):
        walk(module, [])


def test_the_checker_sees_what_it_must():
    """The parser finds the imports these rules are about (so a passing run means something)."""
    by = {(imp.importer, imp.module, imp.name, imp.where) for imp in ALL_IMPORTS}
    assert ("durkv.log", "durkv._seglog", "ffi", "module") in by
    assert ("durkv.store.compact", "durkv.store.replay", "LogIndex", "module") in by
    assert ("durkv.store.store", "durkv.backends", "open_backend", "function") in by
    assert ("durkv.store.records", "durkv.payload", "decode_head", "module") in by  # `..payload`
    assert ("durkv.cli.stores", "durkv.log", "", "function") in by       # `from .. import log`
    assert ("durkv.cli.main", "durkv", "__version__", "module") in by    # `from .. import x`
    assert ("durkv.backends", "durkv.backends.base", "Backend", "module") in by


def test_the_durability_names_are_defined_once():
    """sync/async/exit are listed in durkv.durability alone (issue 8 item 5: they were
    defined six times); everyone else imports them."""
    names = {"sync", "async", "exit"}
    # LangGraph's own durability= modes happen to share the names: a fact LangGraph owns
    # (langgraph.types.Durability), mapped to durkv policies in this one table.
    elsewhere = {("durkv.langgraph", "POLICY_FOR_MODE")}
    found = []
    for module, path in MODULES.items():
        if module == "durkv.durability":
            continue
        tree = ast.parse(path.read_text(), str(path))
        exempt = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                  and any(isinstance(t, ast.Name) and (module, t.id) in elsewhere
                          for t in node.targets)}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Dict, ast.Tuple, ast.List, ast.Set)) or id(node) in exempt:
                continue
            items = node.keys if isinstance(node, ast.Dict) else node.elts
            consts = {i.value for i in items if isinstance(i, ast.Constant)}
            if names <= consts:
                found.append(f"{module}:{node.lineno}")
    assert not found, f"durability names listed outside durkv.durability: {found}"


# -- private attributes: a module reads only its own (issue 16 item 6) -----------------------

def _own_private_names(tree: ast.AST) -> set[str]:
    """The private names a module defines: its functions, classes and class attributes,
    the ``self._x``/``cls._x`` it assigns, and its module-level names."""
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Name):
                        own.add(sub.id)
                    elif isinstance(sub, ast.Attribute):
                        own.add(sub.attr)
    return {n for n in own if n.startswith("_") and not n.startswith("__")}


def private_attribute_uses(folder: str) -> list[str]:
    """``obj._name`` in the modules under ``folder`` where ``_name`` is not defined by the
    module itself: a private member of another module's object, read or written across
    the module line (the fix is a public, narrow interface on that object)."""
    return [use for module, path in sorted(MODULES.items())
            if path.is_relative_to(ROOT / folder)
            for use in _foreign_private_attributes(module, path.read_text())]


def _foreign_private_attributes(module: str, source: str) -> list[str]:
    tree = ast.parse(source)
    own = _own_private_names(tree)
    return [f"{module}:{node.lineno} uses {ast.unparse(node)}" for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr.startswith("_")
            and not node.attr.startswith("__") and node.attr not in own]


def test_no_private_attribute_crosses_a_module_in_backends_s3():
    """livemerge drove S3Backend through 11 of its private attributes; it now goes
    through the backend's narrow public interface (epoch, writing, merge_due,
    durable_batches, batches_paused, adopt_manifest)."""
    bad = private_attribute_uses("backends/s3")
    assert not bad, "\n".join(bad)


def test_no_private_attribute_crosses_a_module_in_the_runtime():
    """The async verbs were a mixin (runtime/aio.py) calling ~27 private members of Run;
    they are Run's own now, and aio.py offers public functions (deferred, settled,
    adrive, scope_tasks...) that take what they need."""
    bad = private_attribute_uses("kernel/runtime")
    assert not bad, "\n".join(bad)


def test_the_rule_finds_a_private_attribute_of_another_module():
    """The check above can fail: a module reading ``b._seq`` it never defines is named,
    its own ``self._own`` is not."""
    src = "class M:\n    def __init__(self, b):\n        self._own = b._seq\n"
    assert _foreign_private_attributes("m", src) == ["m:3 uses b._seq"]


# -- the ranks follow the layers README documents (issue 16 item 5) --------------------------

LAYER_OF = (  # module prefix -> layer (first match); README names the layers top to bottom
    ("durkv.cli", "cli"), ("durkv.langgraph", "langgraph"), ("durkv.runtime", "runtime"),
    ("durkv.store", "store"), ("durkv.serde", "store"), ("durkv._listprefix", "store"),
    ("durkv.backends", "backends"), ("durkv.log", "log"), ("durkv.payload", "log"),
    ("durkv.repairnotes", "log"), ("durkv._seglog", "log"), ("durkv.errors", "errors"),
    ("durkv._journalscan", "runtime"), ("durkv._recpack", "store"), ("durkv._commitframe", "log"),
    ("durkv._msgunpack", "langgraph"), ("durkv.durability", "errors"), ("durkv.fsync", "errors"),
    ("durkv._chanenc", "store"), ("durkv._commitpath", "store"), ("durkv._lgcommit", "langgraph"),
    ("durkv._msgfields", "langgraph"), ("durkv._heldcall", "log"), ("durkv._zstdheld", "log"),
)


def _layer(module: str) -> str:
    if module == "durkv":
        return "runtime"        # the facade: durkv.open returns a RuntimeStore
    return next(layer for prefix, layer in LAYER_OF
                if module == prefix or module.startswith(prefix + ".")
                or module.startswith(prefix + "_"))


def test_the_ranks_follow_the_documented_layers():
    readme = (ROOT / "README.md").read_text()
    order = readme.split("imports point down\n")[1].split("(")[1].split(")")[0]
    layers = [w.strip() for w in order.split("->")]
    assert layers == ["cli", "langgraph", "runtime", "store", "backends", "log", "errors"], layers
    assert {_layer(m) for m in RANKS} == set(layers)
    for upper, lower in zip(layers, layers[1:]):
        low_top = max(r for m, r in RANKS.items() if _layer(m) == lower)
        up_bottom = min(r for m, r in RANKS.items() if _layer(m) == upper)
        assert up_bottom > low_top, f"a {upper} module ranks at or below a {lower} module"


# A NamedTuple's own API is underscored so as not to clash with its fields: public, not
# another module's private member.
NAMEDTUPLE_API = frozenset(("_replace", "_fields", "_asdict", "_make", "_field_defaults"))
# (module, attribute) uses of a private member allowed one by one, each with its reason:
# a forked child re-initializes the store's lock, as CPython's own modules (threading,
# logging) do with theirs after a fork; no public call does that.
ALLOWED_PRIVATE_USES = {("durkv.store.store", "_at_fork_reinit")}


def test_no_private_attribute_crosses_a_module_in_the_store_backends_and_cli():
    """The rule of backends/s3 and the runtime holds for the store, every backend and the
    command line too: the layering enforced is the one documented (issue 16, item 5)."""
    bad = []
    for folder in ("kernel/store", "backends", "cli"):
        for use in private_attribute_uses(folder):
            module, attr = use.split(":")[0], use.rsplit(".", 1)[1]
            if attr not in NAMEDTUPLE_API and (module, attr) not in ALLOWED_PRIVATE_USES:
                bad.append(use)
    assert not bad, "\n".join(bad)
