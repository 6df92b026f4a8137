"""The fast start-up of `haste-hf train` holds under any transformers version: the flags read from the live parser
under versions other than the snapshot's are kept in a cache file, which later runs read without transformers."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from haste_hf.cli import flags as train_flags


OTHER_VERSIONS = {"transformers": "5.999.0", "torch": "2.13.0"}


@pytest.fixture
def other_versions(monkeypatch, tmp_path):
    monkeypatch.setenv(train_flags.CACHE_VARIABLE, str(tmp_path))
    monkeypatch.setattr(train_flags, "installed_versions", lambda: dict(OTHER_VERSIONS))
    live_calls = []
    describe = train_flags.describe_live_flags
    monkeypatch.setattr(train_flags, "describe_live_flags", lambda: live_calls.append(1) or describe())
    train_flags.flag_description.cache_clear()
    yield live_calls
    train_flags.flag_description.cache_clear()


def test_the_live_flags_are_read_once_per_versions(other_versions, tmp_path):
    first = train_flags.flag_description()
    assert other_versions == [1] and first["versions"] == OTHER_VERSIONS
    assert train_flags.cache_path(OTHER_VERSIONS).parent == tmp_path
    train_flags.flag_description.cache_clear()
    assert train_flags.flag_description() == first and other_versions == [1]  # from the cache


def test_a_damaged_cache_is_read_again(other_versions):
    path = train_flags.cache_path(OTHER_VERSIONS)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"versions": {"transfor', encoding="utf-8")
    assert train_flags.flag_description()["versions"] == OTHER_VERSIONS and other_versions == [1]
    assert json.loads(path.read_text(encoding="utf-8"))["versions"] == OTHER_VERSIONS


def test_the_cached_flags_answer_without_importing_transformers(tmp_path):
    """Two runs under other versions: the first fills the cache; the second builds `train`'s parser from it alone."""
    script = textwrap.dedent(
        f"""
        import sys
        from haste_hf.cli import flags as train_flags
        train_flags.installed_versions = lambda: {OTHER_VERSIONS!r}
        parser = train_flags.flags_parser(*train_flags.DATACLASS_NAMES)
        assert parser.parse_args(["--fan-in", "8"]).fan_in == 8
        print("transformers" in sys.modules)
        """
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, train_flags.CACHE_VARIABLE: str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=300,
        )
        for _ in range(2)
    ]
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
    assert [run.stdout.split()[-1] for run in runs] == ["True", "False"]
