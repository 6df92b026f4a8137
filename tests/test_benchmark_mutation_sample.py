# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""benchmarks/mutation_sample.py: which test files run against a mutant, on a hand-made tree."""

import importlib.util
import sys
from pathlib import Path

import pytest


SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "mutation_sample.py"


@pytest.fixture(scope="module")
def mutation_sample():
    spec = importlib.util.spec_from_file_location("mutation_sample", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_a_test_importing_a_name_the_package_reexports_runs_against_the_module(mutation_sample, tmp_path):
    """`from haste_hf.cli import main` reaches cli/commands.py through cli/__init__.py (`from .commands import
    main`): the test that imports it so is among the mutant's tests beside the one that imports the module by name;
    one that imports only another name is not."""
    files = {
        "haste_hf/cli/__init__.py": "from .commands import main\nfrom .parser import build_parser\n",
        "haste_hf/cli/commands.py": "def main():\n    return 0\n",
        "haste_hf/cli/parser.py": "def build_parser():\n    return None\n",
        "tests/cli/test_entry.py": "from haste_hf.cli import main\n\n\ndef test_main():\n    assert main() == 0\n",
        "tests/cli/test_direct.py": "from haste_hf.cli.commands import main\n",
        "tests/cli/test_flags.py": "from haste_hf.cli import build_parser\n\n\ndef test_parser():\n    build_parser()\n",
    }
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    mutant = mutation_sample.Mutant("haste_hf/cli/commands.py", 2, "", "", "", False)
    assert sorted(mutation_sample.tests_of(mutant, tmp_path)) == ["tests/cli/test_direct.py", "tests/cli/test_entry.py"]


def test_a_modules_own_test_file_leaves_room_for_the_tests_that_name_its_classes(mutation_sample, tmp_path):
    """A module that no test imports by name (run_options.py here; recipe_arguments.py in the package): the tests that
    name its class (through the command line, say) run against it, after its own family's file, which need not test
    every line; a test naming nothing of it does not."""
    files = {
        "haste_hf/__init__.py": "",
        "haste_hf/run_options.py": "class RunOptionsOfTheTree:\n    propensity_a = 1.0\n",
        "tests/test_run_options.py": "def test_own():\n    pass\n",
        "tests/cli/test_usage.py": "def test_flags():\n    assert type(parse_flags()).__name__ == 'RunOptionsOfTheTree'\n",
        "tests/test_other.py": "def test_other():\n    pass\n",
    }
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    mutant = mutation_sample.Mutant("haste_hf/run_options.py", 2, "", "", "", False)
    assert mutation_sample.tests_of(mutant, tmp_path) == ["tests/test_run_options.py", "tests/cli/test_usage.py"]


def test_module_lists_every_mutant_of_one_module_in_order(mutation_sample):
    """`--module PATH --list`: every mutant of the module (no sample), numbered as `--only` and `--apply` take them."""
    import subprocess

    path = "haste_hf/labels/priors.py"
    listed = subprocess.run(
        [sys.executable, str(SCRIPT), "--module", path, "--list"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    every = mutation_sample.mutants_of(mutation_sample.ROOT / path)
    assert listed[0] == f"{path}: every one of its {len(every)} mutants" and len(every) > 100
    assert listed[1:] == [f"{index:3d} {mutant.describe()}" for index, mutant in enumerate(every)]


def test_every_mutant_of_a_module_compiles(mutation_sample, tmp_path):
    """A mutant that does not compile fails every test that imports its module: a kill that says nothing of the
    tests. A multi-line refusal with a cause (`) from None`) stays a statement that never runs."""
    (tmp_path / "haste_hf").mkdir()
    module = tmp_path / "haste_hf" / "refusals.py"
    module.write_text(
        "def check(value):\n"
        "    try:\n"
        "        int(value)\n"
        "    except ValueError:\n"
        "        raise ValueError(\n"
        "            f'bad {value!r}'\n"
        "        ) from None\n"
        "    if value == '':\n"
        "        raise TypeError(\n"
        "            'empty'\n"
        "        )\n"
        "    return value\n"
    )
    mutants = mutation_sample.mutants_of(module, tmp_path)
    refusals = [mutant for mutant in mutants if mutant.kind == "refusal removed"]
    assert [(mutant.old, mutant.new) for mutant in refusals] == [
        ("raise ValueError(", "if False: raise ValueError("),
        ("raise TypeError(", "TypeError("),
    ]
    original = module.read_text()
    for mutant in mutants:
        mutation_sample.apply(mutant, tmp_path)
        compile(module.read_text(), str(module), "exec")
        module.write_text(original)
    namespace = {}
    mutation_sample.apply(refusals[0], tmp_path)
    exec(module.read_text(), namespace)
    assert namespace["check"]("x") == "x"  # the refusal is gone
