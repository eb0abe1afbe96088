"""The import contracts in `.importlinter` hold: lower layers of the broker import
nothing above them, its cores do not import each other, and the connector and jobs
stay out of the broker's node, cluster and server.

Runs import-linter's `lint-imports` (in this interpreter, so it sees the package as
installed) over the package's import graph; a broken contract fails this test with
import-linter's report, which names the contract and every import that breaks it
(module and line).
"""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = ROOT / ".importlinter"
LINT_IMPORTS = "from importlinter.cli import lint_imports_command; lint_imports_command()"


def test_every_import_contract_is_kept():
    result = subprocess.run(
        [sys.executable, "-c", LINT_IMPORTS, str(CONTRACTS), "--no-cache", "--no-logo"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"})
    broken = [line.removesuffix(" BROKEN") for line in result.stdout.splitlines()
              if line.endswith(" BROKEN")]
    assert result.returncode == 0, (
        f"broken import contracts: {broken or '(none named: see the output)'}\n"
        f"{result.stdout}{result.stderr}")
    contracts = [section for section in read_contracts().sections()
                 if section.startswith("importlinter:contract:")]
    assert f"Contracts: {len(contracts)} kept, 0 broken." in result.stdout, result.stdout


def test_type_only_imports_count_and_no_contract_ignores_an_import():
    """An import under `if TYPE_CHECKING:` is a dependency like any other (a layer
    that must call up names what it calls as a Protocol of its own), and no contract
    has an ignore list: what the contracts say is what the code does."""
    contracts = read_contracts()
    assert contracts["importlinter"]["exclude_type_checking_imports"].strip() == "False"
    ignoring = [section for section in contracts.sections()
                if contracts[section].get("ignore_imports", "").strip()]
    assert not ignoring, ignoring


def test_the_contracts_cover_every_broker_package():
    """A new package under broker/ gets a place in the layers (a contract naming it),
    rather than escaping every contract."""
    contracts = read_contracts()
    named = {module for section in contracts.sections()
             for key in ("source_modules", "modules", "forbidden_modules")
             for module in contracts[section].get(key, "").split()}
    packages = sorted(path.parent.name for path in (ROOT / "broker").glob("*/__init__.py"))
    missing = [name for name in packages if f"quorumqueue.broker.{name}" not in named]
    assert not missing, f"broker packages no contract in .importlinter names: {missing}"


def read_contracts() -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    parser.read(CONTRACTS, encoding="utf-8")
    return parser


def test_the_node_cluster_queues_and_groups_read_no_clock():
    """broker/node/, cluster/, queues/ and groups/ are told the time by the shell
    (`Node.set_clock`, which tells the cluster and the quorum groups; tests drive
    it): none of their modules imports `time` or asks datetime for the current time.
    The cluster's socket code is the server shell's (server/cluster_transport.py)."""
    import ast

    readers = []
    for package in ("node", "cluster", "queues", "groups"):
        for path in sorted((ROOT / "broker" / package).rglob("*.py")):
            where = path.relative_to(ROOT / "broker")
            for found in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(found, ast.Import):
                    names = [alias.name for alias in found.names]
                elif isinstance(found, ast.ImportFrom):
                    names = [found.module or ""]
                else:
                    names = []
                readers += [f"{where}:{found.lineno} imports {name}" for name in names
                            if name.split(".")[0] == "time"]
                if isinstance(found, ast.Attribute) and found.attr in ("now", "utcnow", "today") \
                        and "datetime" in ast.unparse(found.value):
                    readers.append(f"{where}:{found.lineno} reads {ast.unparse(found)}")
                if isinstance(found, ast.Attribute) and found.attr == "time" \
                        and "loop" in ast.unparse(found.value):
                    readers.append(f"{where}:{found.lineno} reads {ast.unparse(found)}")
    assert not readers, readers


def test_only_the_shells_write_files_or_open_sockets():
    """broker/README.md: I/O lives in the shells. Outside server/, storage/,
    raft/storage/ (files) and the listeners of management/, metrics/ and shovel/ no
    module writes, syncs or renames a file or opens a socket."""
    import ast

    shells = ("server", "storage", "raft/storage", "management", "metrics", "shovel")
    writers = {"replace", "rename", "fsync", "fdatasync", "unlink", "remove", "socket",
               "create_server", "create_connection", "open_connection", "start_server"}
    found_io = []
    for path in sorted((ROOT / "broker").rglob("*.py")):
        where = path.relative_to(ROOT / "broker").as_posix()
        if where.startswith(shells):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = ast.unparse(node.func)
            if name.split(".")[-1] in writers and name.split(".")[0] in (
                    "os", "socket", "asyncio", "loop", "self._loop", "shutil"):
                found_io.append(f"{where}:{node.lineno} {name}")
            if name == "open" and len(node.args) > 1 and any(
                    mode in ast.unparse(node.args[1]) for mode in ("w", "a", "x", "+")):
                found_io.append(f"{where}:{node.lineno} open(..., {ast.unparse(node.args[1])})")
    assert not found_io, found_io


def test_only_the_shells_and_the_start_read_files_or_set_socket_options():
    """broker/README.md: files are read by the shells (server/, storage/,
    raft/storage/; management/ its web UI; metrics/ and management/ the free disk),
    and at start by config.py and tls.py (the configuration file, the certificates);
    socket options are set only by the shells and net/ (the HTTP listeners' timers).
    No other module opens, lists or stats a file, or touches a socket."""
    import ast

    shells = ("server", "storage", "raft/storage", "management", "metrics", "shovel", "net")
    at_start = ("config.py", "tls.py")
    readers = {"open", "read_text", "read_bytes", "listdir", "scandir", "disk_usage",
               "stat", "exists", "isfile", "isdir", "setsockopt", "getsockopt",
               "get_extra_info"}
    found_io = []
    for path in sorted((ROOT / "broker").rglob("*.py")):
        where = path.relative_to(ROOT / "broker").as_posix()
        if where.startswith(shells) or where in at_start:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = ast.unparse(node.func)
                if name.split(".")[-1] in readers and (
                        "." not in name or name.split(".")[0] in ("os", "shutil", "Path")
                        or "sock" in name or "transport" in name or "path" in name):
                    found_io.append(f"{where}:{node.lineno} {name}")
    assert not found_io, found_io


def test_every_import_inside_the_broker_resolves():
    """Every `from ... import name` in broker/, function-level ones too (which only a
    call would run), names a module or an attribute that exists: a module moved
    leaves no import behind it."""
    import ast
    import importlib
    import importlib.util

    unresolved = []
    for path in sorted((ROOT / "broker").rglob("*.py")):
        parts = list(path.relative_to(ROOT / "broker").with_suffix("").parts)
        package = ".".join(["quorumqueue", "broker", *parts[:-1]])
        if parts[-1] == "__init__":
            package = ".".join(["quorumqueue", "broker", *parts[:-1]])
        for found in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(found, ast.ImportFrom):
                continue
            base = importlib.util.resolve_name("." * found.level + (found.module or ""),
                                               package) if found.level else found.module
            if not base.startswith("quorumqueue."):
                continue
            module = importlib.import_module(base)
            for alias in found.names:
                if alias.name != "*" and not hasattr(module, alias.name) \
                        and importlib.util.find_spec(f"{base}.{alias.name}") is None:
                    unresolved.append(f"{path.relative_to(ROOT)}:{found.lineno} "
                                      f"{base}.{alias.name}")
    assert not unresolved, unresolved
