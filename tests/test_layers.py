"""The package's import graph: no cycle, no arrow up the layers below, and no private name imported across modules;
no script borrows from tests/ or a private name, and no function is longer than a reader can hold (`LONGEST_FUNCTION`).

Every ``import`` in the package counts, at module level or inside a function (read from the source, not from
``sys.modules``). A module may import modules of its own layer or of a layer below; a new module must be placed in
`LAYERS`, which is the architecture in one table (docs/architecture.md explains it).
"""

from __future__ import annotations

import ast
from pathlib import Path

import cerberus_hf

PACKAGE = Path(cerberus_hf.__file__).resolve().parent

# Lowest first. A name ending in ".*" covers a subpackage's modules; "decoding" alone is its __init__.
LAYERS = [
    # foundations: user errors, transformers seams, files, views of a module, calibration keys
    ["errors", "compat", "files", "checkpoint", "module_views", "hardware"],
    # decoding's building blocks, which know no drafter: trees and masks, the gate, acceptance, lookup, n-grams,
    # rescoring, settings, statistics, strict verification, packed weights, batching, transfers
    ["blocks", "blocks.*"],
    # what a saved folder is: its config and the code stubs it carries
    ["configuration_cerberus", "remote_code"],
    # the drafter interface and the families
    ["drafters", "drafters.*"],
    # the draft-verify loop, which knows drafters only through their interface
    ["decoding", "decoding.*"],
    # reading a saved folder (or one in another project's layout) and the base it names, with its tokenizer
    ["loading", "base_model", "real_models", "importing", "tokenization_cerberus"],
    # training, then calibration (which reads training data's held-out split)
    ["training", "training.*"],
    ["calibration", "calibration.*"],
    # the model users load, what its calls decode with, and its entry points (it calibrates a machine on first use)
    ["modeling_cerberus", "settings_selection", "custom_generate", ""],
    # the command line
    ["tools", "tools.*"],
    # tiny models and oracle drafts, to test a drafter (nothing in the package imports them)
    ["testing"],
]


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) for every package import in ``path``."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    if name == "":
        package = []
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.split(".")[0] == PACKAGE.name:
                target = node.module.partition(".")[2]
            else:
                continue
            names = [alias.name for alias in node.names]
            submodules = [f"{target}.{n}".lstrip(".") for n in names if f"{target}.{n}".lstrip(".") in modules]
            if submodules:
                found += [(m, []) for m in submodules]
            else:
                found.append((target, names))
        elif isinstance(node, ast.Import):
            found += [(alias.name.partition(".")[2], []) for alias in node.names
                      if alias.name.split(".")[0] == PACKAGE.name]
    return [(target, names) for target, names in found if target != name]


def _layer(name: str) -> int:
    for index, layer in enumerate(LAYERS):
        for entry in layer:
            if name == entry or (entry.endswith(".*") and name.startswith(entry[:-1])):
                return index
    raise AssertionError(f"cerberus_hf.{name} is in no layer of LAYERS (tests/test_layers.py): place it there")


def test_every_module_is_placed_and_imports_only_its_layer_or_below():
    modules = _modules()
    upward = []
    for name, path in modules.items():
        for target, _ in _imports(name, path, modules):
            if _layer(target) > _layer(name):
                upward.append(f"{name or 'cerberus_hf'} -> {target}")
    assert not upward, "imports up the layers: " + ", ".join(sorted(upward))


def test_no_cycle():
    modules = _modules()
    graph = {name: {t for t, _ in _imports(name, path, modules)} for name, path in modules.items()}
    done, on_path = set(), []

    def visit(node: str) -> None:
        if node in on_path:
            raise AssertionError("import cycle: " + " -> ".join(on_path[on_path.index(node):] + [node]))
        if node in done:
            return
        on_path.append(node)
        for target in sorted(graph.get(node, ())):
            visit(target)
        on_path.pop()
        done.add(node)

    for name in sorted(graph):
        visit(name)


def test_no_private_name_is_imported_across_modules():
    modules = _modules()
    private = [f"{name} imports {n} from {target}" for name, path in modules.items()
               for target, names in _imports(name, path, modules) for n in names
               if n.startswith("_") and not n.startswith("__")]
    assert not private, "; ".join(sorted(private))


def test_the_check_sees_an_upward_import(tmp_path):
    """The checks read what they should: a layer-0 module importing the model is caught."""
    source = PACKAGE / "errors.py"
    found = _imports("errors", source, _modules())
    assert found == []
    fake = tmp_path / "errors.py"
    fake.write_text("from .modeling_cerberus import CerberusForCausalLM\nfrom .decoding import loop\n")
    found = _imports("errors", fake, _modules())
    assert ("modeling_cerberus", ["CerberusForCausalLM"]) in found and ("decoding.loop", []) in found
    assert all(_layer(target) > _layer("errors") for target, _ in found)


# ------------------------------------------------------------------------------------------------ scripts
SCRIPTS = PACKAGE.parent / "scripts"
BENCHMARKS = PACKAGE.parent / "benchmarks"  # a measurement's script lives in the run folder it made
TEST_MODULES = {"tests", "helpers", "tiny_models", "conftest"}


def _script_files() -> list[Path]:
    """Every Python file a user runs as a script: under scripts/ (packages such as make_prompts/ included) and in the
    run folders of benchmarks/."""
    return sorted(path for folder in (SCRIPTS, BENCHMARKS) for path in folder.rglob("*.py"))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _script_problems(source: str, modules: dict[str, Path]) -> list[str]:
    """What in a script's ``source`` reaches into tests/ or into the package's private names: an import of a test
    module, a ``sys.path`` change that names tests, ``from cerberus_hf... import _name``, and ``module._name`` on a
    package module the script imported. Scripts use what a user could: the public API and `cerberus_hf.testing`."""
    problems = []
    package_modules = set()  # the script's names bound to modules of the package
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in TEST_MODULES:
                    problems.append(f"line {node.lineno}: imports {alias.name}")
                if alias.name.split(".")[0] == PACKAGE.name:
                    package_modules.add(alias.asname or PACKAGE.name)
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in TEST_MODULES:
                problems.append(f"line {node.lineno}: imports from {node.module}")
            if node.module.split(".")[0] == PACKAGE.name:
                target = node.module.partition(".")[2]
                for alias in node.names:
                    if _private(alias.name):
                        problems.append(f"line {node.lineno}: imports {alias.name} from {node.module}")
                    if f"{target}.{alias.name}".lstrip(".") in modules:
                        package_modules.add(alias.asname or alias.name)
        elif isinstance(node, (ast.Call, ast.Assign, ast.AugAssign)):
            changed = node.func if isinstance(node, ast.Call) else (
                node.targets[0] if isinstance(node, ast.Assign) else node.target)
            text = ast.unparse(changed)
            if (text.startswith("sys.path") or text.startswith("site.addsitedir")) \
                    and "tests" in ast.unparse(node).lower():
                problems.append(f"line {node.lineno}: puts tests on sys.path")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in package_modules:
                problems.append(f"line {node.lineno}: reads {ast.unparse(node)}")
    return problems


def test_no_script_imports_tests_or_private_names():
    """Scripts (scripts/ and those beside their runs in benchmarks/) are the library's first users: what they need
    from tests/ or from private names belongs in the public API (test helpers that a drafter's author needs are in
    `cerberus_hf.testing`)."""
    modules = _modules()
    paths = _script_files()
    assert any(SCRIPTS in path.parents for path in paths) and any(BENCHMARKS in path.parents for path in paths)
    found = [f"{path.relative_to(PACKAGE.parent)} {problem}" for path in paths
             for problem in _script_problems(path.read_text(), modules)]
    assert not found, "; ".join(found)


def test_the_script_check_sees_each_kind():
    source = (
        "import sys\nfrom pathlib import Path\n"
        "sys.path.insert(0, str(Path(__file__).parents[1] / 'tests'))\n"
        "from helpers import install_oracle\nimport tiny_models\nimport tests.conftest\n"
        "from cerberus_hf.training.distill import _trim, generate_distillation_data\n"
        "from cerberus_hf.training import distill\nimport cerberus_hf.decoding.loop as loop\nimport cerberus_hf\n"
        "distill._eos_ids(None, None); loop._step; cerberus_hf.compat._anything\n"
        "from cerberus_hf import __version__\nfrom cerberus_hf.testing import tiny_model\n"
    )
    problems = _script_problems(source, _modules())
    expected = ["line 3: puts tests on sys.path", "line 4: imports from helpers", "line 5: imports tiny_models",
                "line 6: imports tests.conftest", "line 7: imports _trim from cerberus_hf.training.distill",
                "line 11: reads distill._eos_ids", "line 11: reads loop._step", "line 11: reads cerberus_hf.compat._anything"]
    assert sorted(problems) == sorted(expected)
    assert _script_problems("import sys\nsys.path.insert(0, 'src')\nimport cerberus_hf\nx = cerberus_hf.__all__\n",
                            _modules()) == []


# A function a reader can hold: its signature, docstring and body together (issue 58).
LONGEST_FUNCTION = 80


def long_functions(root: Path, limit: int = LONGEST_FUNCTION) -> list[str]:
    """``path:line name (lines)`` of every function under ``root`` longer than ``limit`` lines, from its ``def`` (or
    first decorator) to its last line."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                if node.end_lineno - first + 1 > limit:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} "
                                 f"({node.end_lineno - first + 1})")
    return found


def test_no_function_is_longer_than_a_reader_can_hold():
    assert long_functions(PACKAGE) == []


def test_the_length_check_sees_a_long_function(tmp_path):
    package = tmp_path / "package"
    package.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(LONGEST_FUNCTION))
    (package / "module.py").write_text(f"def short():\n    return 1\n\n\n@staticmethod\ndef long():\n{body}\n")
    assert long_functions(package) == [f"package/module.py:6 long ({LONGEST_FUNCTION + 2})"]
