"""The arithmetic of benchmarks/pipeline_call.py: each call's ratio to HASTE's own pipeline."""

from benchmark_scripts import load_benchmark


pipeline_call = load_benchmark("pipeline_call")


def test_table_gives_each_call_against_haste():
    rows = {"plain": ("A", 0.03), "haste": ("B", 0.025), "stock": ("C", 2.5)}
    lines = pipeline_call.table(rows, 300_000, 2).splitlines()
    assert "300,000 labels" in lines[0]
    assert lines[4:] == [
        "| plain | A | 0.0300 | 1.20x |",
        "| haste | B | 0.0250 | 1.00x |",
        "| stock | C | 2.5000 | 100.00x |",
    ]


def test_a_small_model_runs_end_to_end(tmp_path):
    out = tmp_path / "table.md"
    assert pipeline_call.main(
        ["--labels", "300", "--texts", "2", "--repeats", "1", "--stock-texts", "1", "--out", str(out)]
    ) in (0, 1)
    assert "| plain | HasteTextClassificationPipeline |" in out.read_text()
