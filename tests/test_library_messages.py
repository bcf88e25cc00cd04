"""The library names no CLI flag in its error messages (DESIGN.md, "Layers"; CONTRIBUTING.md): every
message memest raises below ``memest/cli/`` names settings as ``{field}`` placeholders, which the CLI
renders as flags and the Python API as keywords (:class:`memest.errors.MemestError`)."""

from __future__ import annotations

import ast
from pathlib import Path

from memest.errors import InputError, MemestError
from memest.workload.settings import cli_flag

MEMEST = Path(__file__).resolve().parent.parent / "memest"


def _error_classes(trees: dict[Path, ast.Module]) -> set[str]:
    """MemestError and every class of memest derived from it (by name, to a fixed point)."""
    names = {"MemestError"}
    while True:
        more = {node.name for tree in trees.values() for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
                and any(isinstance(b, ast.Name) and b.id in names or isinstance(b, ast.Attribute) and b.attr in names
                        for b in node.bases)}
        if more <= names:
            return names
        names |= more


def flagged_messages(root: Path) -> list[str]:
    """``path:line`` of each call of a MemestError class outside ``cli/`` whose message holds a literal ``--``."""
    trees = {p: ast.parse(p.read_text()) for p in sorted(root.rglob("*.py")) if "cli" not in p.relative_to(root).parts}
    classes = _error_classes(trees)
    out = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if name not in classes:
                continue
            texts = [c.value for arg in node.args for c in ast.walk(arg)
                     if isinstance(c, ast.Constant) and isinstance(c.value, str)]
            if any("--" in text for text in texts):
                out.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return out


def test_no_library_error_message_names_a_cli_flag() -> None:
    assert flagged_messages(MEMEST) == []


def test_the_scan_finds_a_flag(tmp_path: Path) -> None:
    pkg = tmp_path / "memest"
    (pkg / "cli").mkdir(parents=True)
    (pkg / "lib.py").write_text('class LocalError(MemestError):\n    pass\n\n'
                                'def f(x):\n    raise LocalError(f"--seq-len {x} is too long")\n')
    (pkg / "cli" / "app.py").write_text('raise InputError("choose one of --json, --markdown")\n')  # the CLI may
    assert flagged_messages(pkg) == ["memest/lib.py:5"]


def test_a_placeholder_reads_as_a_keyword_and_renders_as_a_flag() -> None:
    exc = InputError("{seq_len} 0: use {seq_len} 1 or more", field="seq_len")
    assert str(exc) == "seq_len 0: use seq_len 1 or more"
    assert exc.render(cli_flag) == "--seq-len 0: use --seq-len 1 or more"
    other = MemestError("{plot} needs matplotlib", field="plot")  # any memest error, not only InputError
    assert (str(other), other.render(cli_flag)) == ("plot needs matplotlib", "--plot needs matplotlib")
