"""A random sample of mutants over the package's deciding lines, each run against the tests of its module.

    python benchmarks/mutation_sample.py --count 100 [--seed S] [--timeout 240] [--out results.md] [--workdir DIR]
    python benchmarks/mutation_sample.py --list --seed S                  # the sample only, nothing run
    python benchmarks/mutation_sample.py --seed S --only 12,40-60         # a part of the sample (to resume)
    python benchmarks/mutation_sample.py --seed S --drawn-at COMMIT ...    # a sample drawn earlier, on today's code
    python benchmarks/mutation_sample.py --seed S --apply N                # mutant N written here, for tests by hand
    python benchmarks/mutation_sample.py --module haste_hf/x.py [--only ..] # every mutant of one module, no sample

A mutant changes one deciding spot of one line of `haste_hf/`: a comparison flipped (`<` to `>=`, `==` to `!=`, `is`
to `is not`, `in` to `not in`), a condition negated (`if`/`while`/`assert`/conditional expression), `and` swapped
for `or`, an integer bound moved by one, a returned value replaced (`True`/`False` swapped, another value by None), a
refusal removed (`raise` -> `pass`), a dtype changed (float32 <-> bfloat16, float64 -> float32, int64 -> int32).
The sample is drawn with `--seed` (a fresh one when not given, printed and written to the results).

Each mutant is applied to a copy of the repository (`--workdir`, made once from the git files), and the tests that
import its module (its own family's files first, at most MAX_TEST_FILES) run with `-x` under a timeout: `killed`
(a test failed),
`survived` (the tests passed), `no tests` (no test file imports the module or names its functions), `timeout` (undecided: the tests
outlived the timeout; rerun it with `--only N --timeout T`), or `gpu only` (the line is in a
Triton/CUDA kernel or behind a CUDA-only branch: not run, a CPU cannot show it). With `--drawn-at`, a mutant whose
line is no longer in the package is `gone` (not run). The ratio asked for is killed / (killed + survived + no tests).
"""

import argparse
import ast
import dataclasses
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "haste_hf"
FLIPPED = {
    ast.Lt: ">=",
    ast.LtE: ">",
    ast.Gt: "<=",
    ast.GtE: "<",
    ast.Eq: "!=",
    ast.NotEq: "==",
    ast.Is: "is not",
    ast.IsNot: "is",
    ast.In: "not in",
    ast.NotIn: "in",
}
DTYPES = {
    "torch.float32": "torch.bfloat16",
    "torch.bfloat16": "torch.float32",
    "torch.float64": "torch.float32",
    "torch.int64": "torch.int32",
    "torch.float": "torch.bfloat16",
}
FATES = ("killed", "survived", "no tests", "timeout", "gpu only", "gone")
MAX_TEST_FILES = 4  # per mutant: affordable on 2 shared cores
GPU_MARKERS = ("triton", "is_cuda", "cuda", "kernels", "_KERNELS")


@dataclass(frozen=True)
class Mutant:
    path: str  # relative to the repository
    line: int  # 1-based
    kind: str
    old: str  # the exact text replaced on that line
    new: str
    gpu_only: bool
    column: int = -1  # where `old` starts on the line (-1: its first occurrence)

    def describe(self) -> str:
        return f"{self.path}:{self.line} [{self.kind}] `{self.old}` -> `{self.new}`"


def _segment(lines: list[str], node: ast.AST) -> str | None:
    if node.lineno != node.end_lineno:
        return None
    return lines[node.lineno - 1][node.col_offset : node.end_col_offset]


def _operand(lines: list[str], node: ast.AST) -> str | None:
    """An operand's text, in the parentheses that its source needs around it inside a comparison."""
    text = _segment(lines, node)
    needs = isinstance(node, (ast.Compare, ast.BoolOp, ast.IfExp, ast.Lambda, ast.NamedExpr, ast.UnaryOp))
    return None if text is None else f"({text})" if needs else text


def _gpu_only(path: str, parents: list[ast.AST], lines: list[str]) -> bool:
    if "/kernels/" in path:
        return True
    for parent in parents:
        if isinstance(parent, ast.FunctionDef) and any("triton" in ast.unparse(d) for d in parent.decorator_list):
            return True
        if isinstance(parent, ast.If) and any(marker in ast.unparse(parent.test) for marker in GPU_MARKERS):
            return True
    return False


def mutants_of(path: Path, root: Path = ROOT) -> list[Mutant]:
    """Every mutant of one module's deciding lines."""
    source = path.read_text()
    lines = source.splitlines()
    relative = str(path.relative_to(root))
    found: list[Mutant] = []

    def add(node, kind, new, parents):
        old = _segment(lines, node)
        if old is None or old == new or lines[node.lineno - 1].lstrip().startswith("#"):
            return
        found.append(
            Mutant(relative, node.lineno, kind, old, new, _gpu_only(relative, parents, lines), node.col_offset)
        )

    def visit(node, parents):
        docstring_owner = isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in FLIPPED:
            left, right = (_operand(lines, operand) for operand in (node.left, node.comparators[0]))
            if left is not None and right is not None:
                add(node, "comparison", f"{left} {FLIPPED[type(node.ops[0])]} {right}", parents)
        if isinstance(node, (ast.If, ast.While, ast.Assert, ast.IfExp)):
            test = node.test
            text = _segment(lines, test)
            if text is not None:
                if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
                    inner = _segment(lines, test.operand)
                    if inner is not None:
                        add(test, "negated condition", inner, parents)
                else:
                    add(test, "negated condition", f"not ({text})", parents)
        if isinstance(node, ast.BoolOp) and len(node.values) == 2:
            left, right = (_segment(lines, value) for value in node.values)
            if left is not None and right is not None:
                op = "or" if isinstance(node.op, ast.And) else "and"
                add(node, "and/or", f"({left}) {op} ({right})", parents)
        if (
            isinstance(node, ast.Constant)
            and type(node.value) is int
            and parents
            and isinstance(parents[-1], (ast.Compare, ast.Slice, ast.BinOp, ast.Subscript, ast.Call))
        ):
            add(node, "bound", str(node.value + random.Random(node.lineno).choice((1, -1))), parents)
        if isinstance(node, ast.Return) and node.value is not None:
            text = _segment(lines, node.value)
            if text is not None:
                if isinstance(node.value, ast.Constant) and isinstance(node.value.value, bool):
                    add(node.value, "returned value", str(not node.value.value), parents)
                elif not (isinstance(node.value, ast.Constant) and node.value.value is None):
                    add(node.value, "returned value", "None", parents)
        if isinstance(node, ast.Raise) and node.lineno == node.end_lineno:
            add(node, "refusal removed", "pass", parents)
        if isinstance(node, ast.Raise) and node.lineno != node.end_lineno:
            line = lines[node.lineno - 1]
            start = line.index("raise")
            head = line[start:]
            # A multi-line refusal: `raise X(` becomes `X(` (built, not raised); with a cause (`) from None` on a
            # later line, where `X(...) from None` would not compile, and a syntax error is no kill) the statement
            # stays and never runs: `if False: raise X(`.
            if head.startswith("raise "):
                found.append(
                    Mutant(
                        relative,
                        node.lineno,
                        "refusal removed",
                        head,
                        head[len("raise ") :] if node.cause is None else f"if False: {head}",
                        _gpu_only(relative, parents, lines),
                    )
                )
        if isinstance(node, ast.Attribute):
            text = _segment(lines, node)
            if text in DTYPES:
                add(node, "dtype", DTYPES[text], parents)
        for index, child in enumerate(ast.iter_child_nodes(node)):
            if docstring_owner and index == 0 and isinstance(child, ast.Expr) and isinstance(child.value, ast.Constant):
                continue
            visit(child, [*parents, node])

    visit(ast.parse(source), [])
    return found


def apply(mutant: Mutant, root: Path) -> None:
    path = root / mutant.path
    lines = path.read_text().split("\n")
    line = lines[mutant.line - 1]
    start = line.index(mutant.old) if mutant.column < 0 else mutant.column
    assert line[start : start + len(mutant.old)] == mutant.old, (mutant, line)
    lines[mutant.line - 1] = line[:start] + mutant.new + line[start + len(mutant.old) :]
    path.write_text("\n".join(lines))


def module_name(path: str) -> str:
    return path[: -len(".py")].replace("/", ".").removesuffix(".__init__")


def tests_of(mutant: Mutant, root: Path) -> list[str]:
    """Test files that import the mutant's module (by its dotted name, `from package import stem`, or the mirrored
    test file)."""
    module = module_name(mutant.path)
    parent, _, stem = module.rpartition(".")
    patterns = [
        re.compile(rf"\b{re.escape(module)}\b"),
        re.compile(rf"from {re.escape(parent)} import [^\n]*\b{re.escape(stem)}\b"),
    ]
    reexported = _reexported_names(mutant.path, root)
    if reexported:  # `from haste_hf.cli import main` reaches cli/commands.py through the package's __init__
        names = "|".join(map(re.escape, reexported))
        patterns.append(re.compile(rf"from {re.escape(parent)} import [^\n]*\b(?:{names})\b"))
    mirrored, importing = [], []
    for test in sorted((root / "tests").rglob("test_*.py")):
        if test.stem == f"test_{stem}" or test.stem.startswith(f"test_{stem}_"):
            mirrored.append(str(test.relative_to(root)))
        elif any(pattern.search(test.read_text()) for pattern in patterns):
            importing.append(str(test.relative_to(root)))
    # The importing files that use the module most first (its names, counted): `from x import y` alone
    # says little about which of a dozen files tests the mutated line.
    names = _module_names(mutant, root)
    uses = {test: _uses(names, (root / test).read_text()) for test in importing}
    importing.sort(key=lambda test: -uses[test])
    if not importing:  # reached through other modules (a CLI flag, a model method): the tests that name its
        # functions and classes, most names first, after its own family's file (which need not test every line)
        importing = [test for test in _tests_naming(mutant, root) if test not in mirrored]
    if not mirrored and not importing:  # else the tests of the package's modules that import it
        for user in _package_importers(mutant, root):
            importing += [test for test in tests_of(user, root) if test not in importing]
    # The family's own files first, then the others that import the module, up to MAX_TEST_FILES in all.
    return (mirrored + importing)[:MAX_TEST_FILES]


def _reexported_names(path: str, root: Path) -> list[str]:
    """The names the `__init__.py` beside the module at `path` imports from it (`from .stem import a, b`)."""
    init = (root / path).with_name("__init__.py")
    if not init.is_file() or init == root / path:
        return []
    stem = Path(path).stem
    return [
        alias.asname or alias.name
        for node in ast.parse(init.read_text()).body
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module == stem
        for alias in node.names
    ]


def _package_importers(mutant: Mutant, root: Path) -> list[Mutant]:
    stem = Path(mutant.path).stem
    pattern = re.compile(rf"from \.+[\w.]*\b{re.escape(stem)} import|from \.+[\w.]* import [^\n]*\b{re.escape(stem)}\b")
    return [
        Mutant(str(path.relative_to(root)), 0, "", "", "", False)
        for path in sorted((root / PACKAGE).rglob("*.py"))
        if str(path.relative_to(root)) != mutant.path and pattern.search(path.read_text())
    ]


def _module_names(mutant: Mutant, root: Path) -> list[str]:
    """The module's top-level functions and classes (names of more than 3 letters)."""
    tree = ast.parse((root / mutant.path).read_text())
    return [
        node.name
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and len(node.name.strip("_")) > 3
    ]


def _uses(names: list[str], text: str) -> int:
    return sum(len(re.findall(rf"\b{re.escape(name)}\b", text)) for name in names)


def _tests_naming(mutant: Mutant, root: Path) -> list[str]:
    names = _module_names(mutant, root)
    hits = {}
    for test in sorted((root / "tests").rglob("test_*.py")):
        text = test.read_text()
        count = sum(bool(re.search(rf"\b{re.escape(name)}\b", text)) for name in names)
        if count:
            hits[str(test.relative_to(root))] = count
    return sorted(hits, key=lambda name: -hits[name])


def run_mutant(mutant: Mutant, root: Path, timeout: float, marks: str) -> tuple[str, float, str]:
    if mutant.gpu_only:
        return "gpu only", 0.0, ""
    tests = tests_of(mutant, root)
    if not tests:
        return "no tests", 0.0, ""
    original = (root / mutant.path).read_text()
    apply(mutant, root)
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", marks, *tests]
    start = time.monotonic()
    try:
        process = subprocess.Popen(
            command,
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = process.communicate(timeout=timeout)
            fate = "survived" if process.returncode in (0, 5) else "killed"  # 5: every selected test deselected
            if process.returncode == 5:
                fate = "no tests"
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            output, _ = process.communicate()
            fate = "timeout"  # undecided: slow tests or a hang; rerun it alone with a longer --timeout
    finally:
        (root / mutant.path).write_text(original)
    failed = next((line for line in output.splitlines() if line.startswith(("FAILED", "ERROR"))), "")
    return fate, time.monotonic() - start, failed


def draw(count: int, seed: int, root: Path = ROOT) -> list[Mutant]:
    every = [mutant for path in sorted((root / PACKAGE).rglob("*.py")) for mutant in mutants_of(path, root)]
    return random.Random(seed).sample(every, min(count, len(every)))


def draw_at(commit: str, count: int, seed: int) -> list[Mutant | None]:
    """The sample drawn from the package as of `commit` (a sample is a function of the seed and the code), each
    mutant moved to the same line of today's package: an identical line, in its module first (else in the module it
    moved to), the one whose neighbouring lines match best, then the nearest (None: the line is gone)."""
    with tempfile.TemporaryDirectory() as old_root:
        archive = subprocess.run(["git", "archive", commit, PACKAGE], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", old_root], input=archive.stdout, check=True)
        sample = draw(count, seed, Path(old_root))
        today = {str(path.relative_to(ROOT)): path.read_text().split("\n") for path in (ROOT / PACKAGE).rglob("*.py")}
        return [_moved(mutant, (Path(old_root) / mutant.path).read_text().split("\n"), today) for mutant in sample]


def _moved(mutant: Mutant, old_lines: list[str], today: dict[str, list[str]]) -> Mutant | None:
    """The mutant on today's copy of its line: identical (else the same text re-indented, its column shifted
    alike), in its module first, then anywhere in the package; the neighbours that match best, then the nearest."""
    index = mutant.line - 1
    old_line = old_lines[index]
    context = {
        offset: old_lines[index + offset].strip() for offset in range(-3, 4) if 0 <= index + offset < len(old_lines)
    }

    def score(lines: list[str], number: int) -> int:
        return sum(
            0 <= number + offset < len(lines) and lines[number + offset].strip() == text
            for offset, text in context.items()
        )

    for same in (lambda line: line == old_line, lambda line: line.strip() == old_line.strip()):
        for paths in ([mutant.path], sorted(today)):
            found = [(path, number) for path in paths for number, line in enumerate(today.get(path, [])) if same(line)]
            if found:
                path, number = max(found, key=lambda hit: (score(today[hit[0]], hit[1]), -abs(hit[1] - index)))
                line = today[path][number]
                shift = (len(line) - len(line.lstrip())) - (len(old_line) - len(old_line.lstrip()))
                column = mutant.column + shift if mutant.column >= 0 else -1
                return dataclasses.replace(mutant, path=path, line=number + 1, column=column)
    return None


def parse_only(text: str | None, count: int) -> list[int]:
    if not text:
        return list(range(count))
    chosen = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        chosen.extend(range(int(low), int(high or low) + 1))
    return chosen


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per mutant's test run")
    parser.add_argument("--marks", default="not gpu and not slow", help="pytest -m expression of the tests run")
    parser.add_argument("--only", default=None, help="indices of the sample to run: 0,3,10-20")
    parser.add_argument("--list", action="store_true", help="print the sample and exit")
    parser.add_argument(
        "--apply",
        type=int,
        default=None,
        help="write mutant N of the sample into this checkout and exit, to run any test against it by hand "
        "(undo: git checkout -- haste_hf)",
    )
    parser.add_argument(
        "--module",
        default=None,
        help="a module's path (haste_hf/...): every mutant of its lines in order instead of a sample (--count and "
        "--seed unused; --only, --list and --apply index this list)",
    )
    parser.add_argument("--workdir", default="/tmp/haste-mutation-copy", help="where the mutated copy lives")
    parser.add_argument("--out", default=None, help="a Markdown file to write the table to (as it goes)")
    parser.add_argument(
        "--drawn-at",
        default=None,
        help="a commit: draw the sample from the package as it was there (to finish an earlier sample after the code "
        "moved on) and run each mutant on the same line of today's code ('gone' where that line is no more)",
    )
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    if args.module:
        sample = mutants_of(ROOT / args.module)
        print(f"{args.module}: every one of its {len(sample)} mutants", flush=True)
    else:
        sample = draw_at(args.drawn_at, args.count, seed) if args.drawn_at else draw(args.count, seed)
        print(
            f"seed {seed}: {len(sample)} mutants" + (f" drawn at {args.drawn_at}" if args.drawn_at else ""), flush=True
        )
    if args.list:
        for index, mutant in enumerate(sample):
            print(
                f"{index:3d} "
                + ("gone" if mutant is None else f"{'(gpu) ' if mutant.gpu_only else ''}{mutant.describe()}")
            )
        return
    if args.apply is not None:
        if sample[args.apply] is None:
            raise SystemExit(f"mutant {args.apply} is gone: its line is no longer in the package")
        apply(sample[args.apply], ROOT)
        print(f"applied {args.apply}: {sample[args.apply].describe()} (undo: git checkout -- {PACKAGE})")
        return
    workdir = Path(args.workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in filter(None, files.split("\0")):
        if (ROOT / name).is_file():
            (workdir / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, workdir / name)
    rows = []
    for index in parse_only(args.only, len(sample)):
        mutant = sample[index]
        if mutant is None:
            print(f"{index:3d} gone: its line is no longer in the package", flush=True)
            continue
        fate, seconds, failed = run_mutant(mutant, workdir, args.timeout, args.marks)
        rows.append((index, mutant, fate, seconds, failed))
        print(f"{index:3d} {fate:9s} {seconds:6.0f}s {mutant.describe()} {failed}", flush=True)
        if args.out:
            write_table(Path(args.out), seed, args, rows)
    counts = {fate: sum(row[2] == fate for row in rows) for fate in FATES}
    showable = counts["killed"] + counts["survived"] + counts["no tests"]
    print(counts, f"killed {counts['killed']}/{showable} of those a CPU can show", flush=True)


def write_table(path: Path, seed: int, args, rows) -> None:
    counts = {fate: sum(row[2] == fate for row in rows) for fate in FATES}
    showable = counts["killed"] + counts["survived"] + counts["no tests"]
    ratio = f"{100 * counts['killed'] / showable:.0f}%" if showable else "-"
    lines = [
        "# Mutation sample",
        "",
        "`python benchmarks/mutation_sample.py "
        + (f"--module {args.module}" if args.module else f"--count {args.count} --seed {seed}")
        + f" --timeout {args.timeout:g}"
        + (f" --drawn-at {args.drawn_at}" if args.drawn_at else "")
        + (f" --only {args.only}" if args.only else "")
        + "`"
        f' (tests: `-m "{args.marks}"`, `-x`)',
        "",
        f"Run: {len(rows)} mutants; killed {counts['killed']}, survived {counts['survived']}, no tests "
        f"{counts['no tests']}, timed out (undecided) {counts['timeout']}, GPU only {counts['gpu only']}: **{ratio}** "
        "of those a CPU can show (killed / (killed + survived + no tests)) killed.",
        "",
        "| # | fate | s | mutant | first failing test |",
        "|---|---|---|---|---|",
    ]
    for index, mutant, fate, seconds, failed in rows:
        describe = mutant.describe().replace("|", "\\|")
        lines.append(f"| {index} | {fate} | {seconds:.0f} | {describe} | {failed.replace('|', '/')[:120]} |")
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
