"""The model's folder (`haste_hf/modeling/`) is copied beside every checkpoint and must load there without the
package: its modules import their siblings with single-dot imports, and nothing else of `haste_hf` but the
named doors, each of which falls back (or refuses in one line) when the package is absent."""

import ast
from pathlib import Path

import haste_hf.modeling
from haste_hf.modeling.saving import exported_code_files


MODELING = Path(haste_hf.modeling.__file__).parent
# The doors: the compiled kernels (looked up by name, so an exported folder falls back to PyTorch), the Hub
# code behind `push_to_hub` (an exported folder pushes the transformers way) and the label additions behind
# `add_labels` (an exported folder refuses it in one line: they need the package).
DOORS = {"haste_hf.kernels.ops", "haste_hf.hub", "haste_hf.labels.additions"}


def imports_of(path: Path):
    """(line, imported module, level) of every import in the file, those inside functions included, and the
    modules named to `importlib.import_module`."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, 0
        elif isinstance(node, ast.ImportFrom):
            yield node.lineno, node.module or "", node.level
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            yield node.lineno, node.args[0].value, 0


def test_the_model_folder_imports_only_its_siblings_and_the_named_doors():
    siblings = {path.stem for path in MODELING.glob("*.py")}
    broken = []
    for path in sorted(MODELING.glob("*.py")):
        for line, module, level in imports_of(path):
            where = f"{path.name}:{line}"
            if level > 1:
                broken.append(f"{where}: from {'.' * level}{module} (outside the folder)")
            elif level == 1 and module.split(".")[0] not in siblings | {""}:
                broken.append(f"{where}: from .{module} (no such sibling)")
            elif level == 0 and module.split(".")[0] == "haste_hf" and module not in DOORS:
                broken.append(f"{where}: {module} (not a named door)")
    assert not broken, "\n".join(broken)


def test_the_doors_fall_back_without_the_package():
    """Each door is opened inside `try: ... except ImportError`, so the exported copy runs without `haste_hf`."""
    for path in sorted(MODELING.glob("*.py")):
        tree = ast.parse(path.read_text())
        guarded = {
            id(node)
            for handler in ast.walk(tree)
            if isinstance(handler, ast.Try)
            and any(getattr(h.type, "id", None) == "ImportError" for h in handler.handlers)
            for statement in handler.body
            for node in ast.walk(statement)
        }
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module" and node.args:
                names = [getattr(node.args[0], "value", None)]
            if any(name in DOORS for name in names):
                assert id(node) in guarded, f"{path.name}:{node.lineno}: the door to {names[0]} has no fallback"


def test_exported_code_is_the_folder_itself():
    files = {Path(path).resolve() for path in exported_code_files()}
    assert files and all(path.parent == MODELING.resolve() for path in files)
    assert {"modeling_haste.py", "configuration_haste.py", "defaults.py"} <= {path.name for path in files}
