"""Whether a run's commit had the policy_lag_confirm suite commit's code path: the files that decide a run's
trajectory compared as syntax trees (`code_path_check`), read by the confirmation report's provenance."""

from __future__ import annotations

import ast
import functools
import os
import subprocess
from typing import NamedTuple

from rgpo_lab.mujoco_grid import ROOT

SUITE_COMMIT = "393cfc0"  # the commit the suite was fixed at; its runs are launched from a worktree of it
# What decides a run's trajectory, compared file by file as syntax trees: the scripts (what the old scripts
# and the lab runner import from rgpo_trl: the package, rgpo_trl.core, rgpo_trl.core.kl_control and
# rgpo_trl.cli), the loss, the gates, the controllers, the registry they are made through, and the command
# line wrapper (run_main).
CODE_PATH = (
    "mujoco_baselines",
    "rgpo_trl/cli.py",
    "rgpo_trl/core/gates.py",
    "rgpo_trl/core/objective.py",
    "rgpo_trl/core/kl_control.py",
    "rgpo_trl/core/registry.py",
)
# The packages the scripts take names from (``rgpo_trl.rgpo_loss``, ``from rgpo_trl.core import
# PAPER_KL_DEFAULTS``): compared by those names, each followed to the module it is re-exported from, so a new
# export beside them (issue 47's rgpo_trl.core.corrections) is not a different code path. A submodule such a
# package imports only at the compared commit is run on import: it must take none of the runner's names and
# touch none of the code path's registries and constants (`_inert`), else the commit is not checked.
PACKAGES = {"rgpo_trl": "rgpo_trl/__init__.py", "rgpo_trl.core": "rgpo_trl/core/__init__.py"}
# From issue 48 on, the code the suite's runs execute (mujoco_baselines/ at the suite commit) is the lab
# runner, moved here with its code unchanged but for import paths; mujoco_baselines/ then holds the product's
# single-file scripts, which the grid does not run. At such a commit the suite commit's
# mujoco_baselines/<file> is compared with RUNNER/<file>, and the runner's file list with the suite commit's:
# its one new file, the entry point ``python -m rgpo_lab.mujoco_runner <method>`` (it calls the method
# module's main with its Args and SCRIPT_ERRORS, as each script's ``if __name__ == "__main__"`` line does), is
# compared with its version of RUNNER_ENTRY's commit; any other new file leaves the commit not checked.
# Every file is read at a run's recorded commit (git show), never from the working tree: RUNNER is in the
# tree from issue 48 to 6944b5d (its last commit), deleted in issue 59 (the grid now drives the scripts).
RUNNER = "rgpo_lab/mujoco_runner"
RUNNER_ENTRY = ("__main__.py", "a3d1242")
OLD_PACKAGE, RUNNER_PACKAGE = "mujoco_baselines", "rgpo_lab.mujoco_runner"


@functools.cache
def _git_show(commit: str, path: str) -> str | None:
    shown = subprocess.run(["git", "-C", ROOT, "show", f"{commit}:{path}"], capture_output=True, text=True)
    return shown.stdout if shown.returncode == 0 else None


def _git_ls(commit: str, *paths: str) -> list[str] | None:
    """The files under ``paths`` at ``commit``; None where git cannot tell."""
    listed = subprocess.run(
        ["git", "-C", ROOT, "ls-tree", "-r", "--name-only", commit, "--", *paths],
        capture_output=True,
        text=True,
    )
    return listed.stdout.split() if listed.returncode == 0 else None


def _code_without_finish(commit: str, path: str) -> str | None:
    """``path`` at ``commit`` as an AST dump without TrainingRun.finish (it only prints the closing line) and
    without docstrings (help texts), imports of the old package ``mujoco_baselines`` written as the runner's
    ``rgpo_lab.mujoco_runner`` (its location from issue 48 on)."""
    source = _git_show(commit, path)
    if source is None:
        return None
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "TrainingRun":
            node.body = [n for n in node.body if not (isinstance(n, ast.FunctionDef) and n.name == "finish")]
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == OLD_PACKAGE:
            node.module = RUNNER_PACKAGE + node.module[len(OLD_PACKAGE) :]
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == OLD_PACKAGE:
                    alias.name = RUNNER_PACKAGE + alias.name[len(OLD_PACKAGE) :]
    return ast.dump(tree)


def _names_taken(source: str) -> set[tuple[str, str]]:
    """(package, name) for every name a script takes from PACKAGES: ``from rgpo_trl.core import X`` and
    ``rgpo_trl.X`` after ``import rgpo_trl``."""
    tree = ast.parse(source)
    aliases = {}
    taken = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in PACKAGES:
            taken |= {(node.module, a.name) for a in node.names}
        if isinstance(node, ast.Import):
            aliases.update({a.asname or a.name: a.name for a in node.names if a.name in PACKAGES})
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            taken.add((aliases[node.value.id], node.attr))
    return taken


def _top_level(tree: ast.Module) -> list[ast.stmt]:
    """A module's statements that run on import (``if TYPE_CHECKING:`` blocks left out)."""
    return [
        n
        for n in tree.body
        if not (isinstance(n, ast.If) and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING")
    ]


def _submodule(init_path: str, module: str | None) -> str:
    """The file of ``from .<module> import ...`` in the package of ``init_path`` (a package: its
    __init__.py)."""
    return f"{os.path.dirname(init_path)}/{(module or '').replace('.', '/')}"


def _binding(commit: str, init_path: str, name: str) -> tuple | None:
    """Where the package ``init_path`` at ``commit`` takes ``name`` from: (module file, name there), followed
    through ``from .sub import *`` and re-exports of subpackages; (init_path, statement) for a name bound in
    the package itself; None if unbound or unreadable."""
    source = _git_show(commit, init_path)
    if source is None:
        return None
    found = None
    for node in _top_level(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            target = _submodule(init_path, node.module)
            is_package = _git_show(commit, f"{target}/__init__.py") is not None
            for a in node.names:
                if a.name == "*" and is_package:
                    found = _binding(commit, f"{target}/__init__.py", name) or found
                elif (a.asname or a.name) == name:
                    found = (
                        _binding(commit, f"{target}/__init__.py", a.name)
                        if is_package
                        else (f"{target}.py", a.name)
                    )
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.FunctionDef | ast.ClassDef):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", node)]
            bound = {getattr(t, "id", getattr(t, "name", None)) for t in targets}
            if name in bound:
                found = (init_path, ast.dump(node))
    return found


def _submodules_imported(commit: str, init_path: str) -> set[str]:
    source = _git_show(commit, init_path)
    if source is None:
        return set()
    return {
        _submodule(init_path, n.module)
        for n in _top_level(ast.parse(source))
        if isinstance(n, ast.ImportFrom) and n.level == 1
    }


def _inert(commit: str, module: str, protected: set[str], compared: set[str]) -> str | None:
    """Why importing ``module`` (a file path without .py) at ``commit`` could change the code path, or None:
    it names one of the code path's registries, registration functions or constants (``protected``), or
    imports a module of the library that is not compared."""
    source = _git_show(commit, f"{module}.py")
    if source is None:
        return f"{module}.py is not readable"
    tree = ast.parse(source)
    named = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    named |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    named |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    if named & protected:
        return f"{module}.py names {', '.join(sorted(named & protected))}"
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.level >= 1:
            base = module
            for _ in range(n.level):
                base = os.path.dirname(base)
            path = f"{base}/{(n.module or '').replace('.', '/')}.py"
        elif isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] in ("rgpo_trl", "rgpo_lab"):
            path = n.module.replace(".", "/") + ".py"
        else:
            continue
        if path not in compared:
            return f"{module}.py imports {path}, which is not compared"
    return None


class CodePathCheck(NamedTuple):
    same: bool | None  # True: the suite commit's code path; False: different; None: not checked
    notes: tuple[str, ...]  # what differs or was not checked, and what was accepted beside the code path


def code_path_check(commit: str) -> CodePathCheck:
    """Whether ``commit`` has the suite commit's code path (CODE_PATH, compared as syntax trees,
    TrainingRun.finish (the closing console line) and docstrings left out; at a commit with the lab runner
    (issue 48 on) the suite commit's mujoco_baselines/ is compared with the runner (RUNNER) and the runner's
    file list with the suite commit's), and the names the scripts take from PACKAGES bound to the same
    modules. False where a compared file or name differs; None where git cannot tell (an unknown commit, a
    file missing at ``commit``, a file of the runner or a submodule of a package that is not compared)."""
    mine_files = _git_ls(SUITE_COMMIT, *CODE_PATH)
    if mine_files is None or commit == "unknown":
        return CodePathCheck(None, ("the commit is unknown",))
    suite_py = [p for p in mine_files if p.endswith(".py")]
    has_runner = _git_show(commit, f"{RUNNER}/common.py") is not None

    def theirs(path: str) -> str:
        return (
            RUNNER + path[len(OLD_PACKAGE) :] if has_runner and path.startswith(OLD_PACKAGE + "/") else path
        )

    different, unchecked, accepted = [], [], []
    for path in suite_py:
        code = _code_without_finish(commit, theirs(path))
        if code is None:
            unchecked.append(f"{theirs(path)} is missing")
        elif code != _code_without_finish(SUITE_COMMIT, path):
            different.append(f"{theirs(path)} differs")
    if has_runner:
        listed = _git_ls(commit, RUNNER)
        entry = f"{RUNNER}/{RUNNER_ENTRY[0]}"
        for path in sorted(set(listed or ()) - {theirs(p) for p in suite_py}):
            if not path.endswith(".py"):
                continue
            if path != entry:
                unchecked.append(f"{path} is a runner file the suite commit lacks")
            elif _code_without_finish(commit, path) != _code_without_finish(RUNNER_ENTRY[1], path):
                different.append(f"{path} (the entry point) differs from its version at {RUNNER_ENTRY[1]}")
            else:
                accepted.append(f"{path} is the runner's entry point as at {RUNNER_ENTRY[1]}")
        if listed is None:
            unchecked.append(f"{RUNNER}/ is not listed")
    taken = set()
    for path in suite_py:
        taken |= _names_taken(_git_show(SUITE_COMMIT, path) or "")
        taken |= _names_taken(_git_show(commit, theirs(path)) or "")
    for package, name in sorted(taken):
        ours, at_commit = (
            _binding(SUITE_COMMIT, PACKAGES[package], name),
            _binding(commit, PACKAGES[package], name),
        )
        if at_commit is None:
            unchecked.append(f"{package}.{name} is not found")
        elif at_commit != ours:
            different.append(
                f"{package}.{name} is bound to {at_commit[0]}, at {SUITE_COMMIT} to {ours and ours[0]}"
            )
    protected = set()  # the registries, registration functions and constants the packages export
    for init in PACKAGES.values():
        for n in _top_level(ast.parse(_git_show(SUITE_COMMIT, init) or "")):
            if isinstance(n, ast.ImportFrom):
                protected |= {a.name for a in n.names if a.name.isupper() or a.name.startswith("register_")}
    compared = {p for p in suite_py if not p.startswith(OLD_PACKAGE + "/")}
    for init in PACKAGES.values():
        for module in sorted(_submodules_imported(commit, init) - _submodules_imported(SUITE_COMMIT, init)):
            why = _inert(commit, module, protected, compared)
            if why:
                unchecked.append(f"{init} imports {module}.py: {why}")
            else:
                accepted.append(
                    f"{init} also imports {module}.py, which none of the scripts' names come from and which "
                    "names none of the code path's registries or constants"
                )
    same = False if different else None if unchecked else True
    return CodePathCheck(same, tuple(different + unchecked + accepted))


def same_code_path(commit: str) -> bool | None:
    """`code_path_check`'s answer alone."""
    return code_path_check(commit).same
