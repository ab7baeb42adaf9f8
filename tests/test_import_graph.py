"""The import graph of the checkout's packages (the library ``rgpo_trl``, ``recipes``, the lab ``rgpo_lab``,
``mujoco_baselines`` and ``atari_baselines``), read statically from the source: no cycle anywhere, and the
layering holds.

Every ``import`` / ``from ... import`` statement counts, wherever it is (module level, inside a function,
under ``if TYPE_CHECKING``); relative imports are resolved, and ``from pkg import name`` where ``pkg.name`` is
a module counts as importing that module. A cycle is looked for at every depth of the package tree: between
modules, and between the packages they collapse to (``recipes.hh_rlhf`` -> ``recipes.tiny_hh`` ->
``recipes.hh_rlhf`` is a cycle between the two packages even when no module cycle closes it), up to the
top-level packages themselves. Layers: ``rgpo_trl`` imports none of the other packages; the baselines'
single-file scripts import only the library; ``recipes`` does not import the lab; inside ``recipes``,
`RECIPE_LAYERS` in order (a layer imports only the ones before it); inside the lab, `LAB_LAYERS` likewise
(the lab's floor plan: shared helpers, then the runners and studies, then the reports, then the
benchmarks)."""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rgpo_trl", "recipes", "rgpo_lab", "mujoco_baselines", "atari_baselines")
RECIPE_LAYERS = ("recipes.hh_common", "recipes.tiny_hh", "recipes.hh_rlhf", "recipes.hh_rlhf_qwen")
# The lab's layers, bottom first; a module belongs to the layer of the listed name it is or lies under (a
# module moved into a listed package keeps its layer; a listed name with no module left is no error).
LAB_LAYERS: tuple[tuple[str, ...], ...] = (
    # shared helpers: statistics, the results' per-step logs, the job queue, JSON values
    ("rgpo_lab.statistics", "rgpo_lab.results_data", "rgpo_lab.job_queue", "rgpo_lab.json_values"),
    # what runs and decides the studies: the MuJoCo grid and its driver of the scripts, the RLHF suites and
    # the studies' rules
    (
        "rgpo_lab.mujoco_drive",
        "rgpo_lab.mujoco_grid",
        "rgpo_lab.mujoco_normalisation",
        "rgpo_lab.rlhf_suite",
        "rgpo_lab.rlhf_mismatch",
        "rgpo_lab.rlhf_sync_mismatch",
        "rgpo_lab.rlhf_select",
    ),
    # the reports read the studies' results (rlhf_mismatch_report: the old path of rlhf_report.mismatch)
    (
        "rgpo_lab.mujoco_report",
        "rgpo_lab.mujoco_confirm_report",
        "rgpo_lab.rlhf_report",
        "rgpo_lab.rlhf_mismatch_report",
    ),
    ("rgpo_lab.benchmarks",),
)

Edges = dict[str, dict[str, str]]  # module -> {imported module: "file:line" of the first such import}


def module_files(root: Path, packages) -> dict[str, Path]:
    """Dotted module name -> source file, for every ``.py`` file under the ``packages`` directories of
    ``root`` (a package's ``__init__.py`` is the package itself)."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def import_graph(root: Path, packages) -> Edges:
    """Each module's imports of the other modules found under ``packages`` (see the module docstring)."""
    modules = module_files(root, packages)

    def known(name: str) -> str | None:  # the module a dotted import name lands in: its longest known prefix
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges: Edges = {name: {} for name in modules}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + [node.module or ""]).strip(".")
                else:
                    base = node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in filter(None, map(known, targets)):
                if target != name:
                    edges[name].setdefault(target, f"{path.relative_to(root)}:{node.lineno}")
    return edges


def collapsed(edges: Edges, depth: int) -> Edges:
    """The graph between the names' first ``depth`` components (a package and everything in it as one)."""
    out: Edges = {}
    for source, targets in edges.items():
        a = ".".join(source.split(".")[:depth])
        out.setdefault(a, {})
        for target, where in targets.items():
            b = ".".join(target.split(".")[:depth])
            out.setdefault(b, {})
            if a != b:
                out[a].setdefault(b, f"{where} ({source} -> {target})")
    return out


def cycles(edges: Edges) -> list[list[str]]:
    """One cycle (a closed path of names) for each strongly connected component with more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                components.append(set(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    found = []
    for component in components:  # the shortest way from the component's first name back to it
        start = min(component)
        parent: dict[str, str] = {}
        queue = deque([start])
        while queue:
            v = queue.popleft()
            if start in edges[v]:
                path = [v]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                found.append([*reversed(path), start])
                break
            for w in sorted(edges[v]):
                if w in component and w not in parent and w != start:
                    parent[w] = v
                    queue.append(w)
    return found


def all_cycles(edges: Edges) -> list[str]:
    """Every cycle, at every depth of the package tree (names cut to their first d components, d = 1 the
    top-level packages), written out with the import that makes each step; a cycle of names no cut shortens
    is reported once, at the depth it first appears."""
    out = []
    for d in range(1, max(len(name.split(".")) for name in edges) + 1):
        graph = collapsed(edges, d)
        for cycle in cycles(graph):
            if d > 1 and all(len(name.split(".")) < d for name in cycle):
                continue  # the same cycle as at depth d - 1
            steps = "\n".join(
                f"    {a} -> {b}  [{graph[a][b]}]" for a, b in zip(cycle, cycle[1:], strict=False)
            )
            out.append(f"import cycle at depth {d}:\n{steps}")
    return out


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def imports_of(edges: Edges, source_prefix: str, target_prefixes) -> list[str]:
    """The imports from modules under ``source_prefix`` of modules under any of ``target_prefixes``."""
    return [
        f"{a} -> {b}  [{where}]"
        for a, targets in edges.items()
        if under(a, source_prefix)
        for b, where in targets.items()
        if any(under(b, p) for p in target_prefixes)
    ]


@pytest.fixture(scope="module")
def graph() -> Edges:
    return import_graph(ROOT, [p for p in PACKAGES if (ROOT / p).is_dir()])


def test_the_graph_is_read(graph):
    """The builder sees the checkout (so the tests below cannot pass on an empty graph): function-level,
    relative and ``from pkg import submodule`` imports included."""
    assert "recipes.tiny_hh" in graph["recipes.hh_rlhf.worlds"]  # from ..tiny_hh import build_tiny_assets
    assert "recipes.tiny_hh.build" in graph["recipes.tiny_hh.__main__"]  # from . import build
    assert "recipes.hh_rlhf.methods" in graph["recipes.hh_rlhf.parsing"]  # inside a function
    assert "rgpo_trl.core" in graph["rgpo_trl.trainer.trainer"]  # from ..core import ...


def test_no_import_cycle(graph):
    found = all_cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(found)


def test_the_library_imports_only_itself(graph):
    outside = imports_of(graph, "rgpo_trl", [p for p in PACKAGES if p != "rgpo_trl"])
    assert not outside, "rgpo_trl imports outside the library:\n" + "\n".join(outside)


@pytest.mark.parametrize("baselines", ["mujoco_baselines", "atari_baselines"])
def test_the_baselines_import_only_the_library(graph, baselines):
    outside = imports_of(graph, baselines, [p for p in PACKAGES if p not in ("rgpo_trl", baselines)])
    assert not outside, f"{baselines} imports outside the library:\n" + "\n".join(outside)


def test_recipes_do_not_import_the_lab(graph):
    lab = imports_of(graph, "recipes", ["rgpo_lab"])
    assert not lab, "recipes import the lab:\n" + "\n".join(lab)


def layer_of(name: str, layers) -> int | None:
    """The index of the layer holding ``name``: the layer of the longest listed name it is or lies under."""
    placed = [(len(p), i) for i, layer in enumerate(layers) for p in layer if under(name, p)]
    return max(placed)[1] if placed else None


def layering(edges: Edges, package: str, layers) -> tuple[list[str], list[str]]:
    """The modules of ``package`` in no layer (the package itself aside), and every import of a module of
    ``package`` from a lower layer (an edge back up the layers)."""
    modules = [n for n in edges if under(n, package) and n != package]
    unplaced = [n for n in modules if layer_of(n, layers) is None]
    upward = [
        f"{a} (layer {layer_of(a, layers)}) -> {b} (layer {layer_of(b, layers)})  [{where}]"
        for a in modules
        for b, where in edges[a].items()
        if layer_of(a, layers) is not None
        and under(b, package)
        and layer_of(b, layers) is not None
        and layer_of(b, layers) > layer_of(a, layers)
    ]
    return unplaced, upward


def test_recipe_layers(graph):
    """Each layer of `RECIPE_LAYERS` imports only the layers before it (and the library)."""
    unplaced, upward = layering(graph, "recipes", [(la,) for la in RECIPE_LAYERS])
    assert not unplaced, f"recipes modules in no layer of RECIPE_LAYERS: {unplaced}"
    assert not upward, "a recipes layer imports a later one:\n" + "\n".join(upward)


def test_lab_layers(graph):
    """Each layer of `LAB_LAYERS` imports only itself and the layers below it; every lab module has a layer,
    and each layer holds a module (the map names the checkout, not only old names)."""
    unplaced, upward = layering(graph, "rgpo_lab", LAB_LAYERS)
    assert not unplaced, f"rgpo_lab modules in no layer of LAB_LAYERS (add them): {unplaced}"
    assert not upward, "a lab layer imports a higher one:\n" + "\n".join(upward)
    held = {layer_of(n, LAB_LAYERS) for n in graph if under(n, "rgpo_lab") and n != "rgpo_lab"}
    assert held == set(range(len(LAB_LAYERS))), held
    # the layers are read: the reports import the studies, the benchmarks the runners
    assert "rgpo_lab.rlhf_suite" in graph["rgpo_lab.rlhf_report.runs"]
    assert "rgpo_lab.rlhf_mismatch" in graph["rgpo_lab.rlhf_report.mismatch_runs"]


def test_a_back_edge_up_the_layers_is_found(tmp_path):
    """A helper importing a report (inside a function) is an edge back up; an unlisted module is unplaced;
    imports down and within a layer pass."""
    files = {
        "lab/__init__.py": "",
        "lab/stats.py": "import os\n",
        "lab/suite.py": "from lab.stats import x\nfrom lab import rules\n",
        "lab/rules.py": "from . import stats\n",
        "lab/report/__init__.py": "",
        "lab/report/build.py": "from ..suite import y\nfrom lab.report import figures\n",
        "lab/report/figures.py": "import lab.stats\n",
    }
    layers = (("lab.stats",), ("lab.suite", "lab.rules"), ("lab.report",))
    _write(tmp_path, files)
    assert layering(import_graph(tmp_path, ["lab"]), "lab", layers) == ([], [])
    _write(tmp_path, {"lab/stats.py": "def f():\n    from lab.report.build import z\n", "lab/extra.py": ""})
    unplaced, upward = layering(import_graph(tmp_path, ["lab"]), "lab", layers)
    assert unplaced == ["lab.extra"]
    assert upward == ["lab.stats (layer 0) -> lab.report.build (layer 2)  [lab/stats.py:2]"]


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_module_cycle_is_found(tmp_path):
    """A cycle closed by a function-level relative import and a ``from pkg import submodule``."""
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "def f():\n    from . import b\n",
            "pkg/b.py": "from pkg.sub import c\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/c.py": "from .. import a\nimport os\n",
            "pkg/d.py": "from pkg import b\n",  # into the cycle, not on it
        },
    )
    graph = import_graph(tmp_path, ["pkg"])
    assert graph["pkg.a"] == {"pkg.b": "pkg/a.py:2"}
    assert graph["pkg.sub.c"] == {"pkg.a": "pkg/sub/c.py:1"}
    found = all_cycles(graph)
    assert any(
        "pkg.a -> pkg.b" in c and "pkg.b -> pkg.sub.c" in c and "pkg.sub.c -> pkg.a" in c for c in found
    )
    assert not any("pkg.d" in c for c in found)


def test_a_package_cycle_without_a_module_cycle_is_found(tmp_path):
    """one.x -> two.y and two.z -> one.w: no module cycle, a cycle between the packages one and two."""
    _write(
        tmp_path,
        {
            "top/__init__.py": "",
            "top/one/__init__.py": "",
            "top/one/x.py": "from ..two import y\n",
            "top/one/w.py": "",
            "top/two/__init__.py": "",
            "top/two/y.py": "",
            "top/two/z.py": "if False:\n    import top.one.w\n",
        },
    )
    graph = import_graph(tmp_path, ["top"])
    assert not cycles(graph)
    found = all_cycles(graph)
    assert len(found) == 1 and "top.one -> top.two" in found[0] and "top.two -> top.one" in found[0], found


def test_an_acyclic_package_passes(tmp_path):
    _write(tmp_path, {"p/__init__.py": "from .a import f\n", "p/a.py": "from .b import g\n", "p/b.py": ""})
    assert all_cycles(import_graph(tmp_path, ["p"])) == []
