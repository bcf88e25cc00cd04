"""memest.validation.accuracy (benchmarks/accuracy.py's report): records re-estimated, the per-task
modules' rows imported, one summary."""

import types
from dataclasses import dataclass
from pathlib import Path

import pytest

from memest.calibration.records import read_records
from memest.errors import UnknownModelError
from memest.validation import accuracy

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class _TrainingCase:  # the shape of memest.validation.training's Row.case
    id: str
    metric: str
    measured_bytes: int
    figure: str = ""


@dataclass
class _TrainingRow:
    case: _TrainingCase
    predicted_bytes: int


@dataclass
class _Comparison:  # the shape of memest.validation.serving's Comparison
    case: str
    figure: str
    predicted: float
    measured: float
    unit: str
    fitted: bool = False


def test_both_report_shapes_are_imported_not_rederived():
    training = types.SimpleNamespace(rows=lambda: [_TrainingRow(_TrainingCase("t1", "allocated", 1000), 1100)])

    def comparisons(case):
        if case["id"] == "s2":
            raise UnknownModelError("unknown model 'x'")
        return [_Comparison("s1", "kv_cache_tokens", 98.0, 100.0, "tokens"),
                _Comparison("s1", "non_torch_GiB", 2.0, 2.0, "GiB", fitted=True)]

    serving = types.SimpleNamespace(load_cases=lambda: [{"id": "s1"}, {"id": "s2"}], comparisons=comparisons)
    out = list(accuracy.published_rows([("training", training), ("serving", serving)]))
    rows = [r for r in out if isinstance(r, accuracy.AccuracyRow)]
    skipped = [s for s in out if isinstance(s, accuracy.Skipped)]
    assert [(r.source, r.case, r.figure, r.error) for r in rows] == [
        ("training", "t1", "allocated", pytest.approx(0.10)),
        ("serving", "s1", "kv_cache_tokens", pytest.approx(-0.02)),
        ("serving", "s1", "non_torch_GiB", 0.0),
    ]
    assert rows[2].note == "fitted"
    assert [(s.case, s.why) for s in skipped] == [("s2", "not modelled: unknown model 'x'")]


def test_summary_leaves_fitted_figures_out_and_names_the_worst():
    rows = [accuracy.AccuracyRow("serving", "a", "f", 101, 100), accuracy.AccuracyRow("serving", "b", "f", 90, 100),
            accuracy.AccuracyRow("serving", "c", "f", 103, 100), accuracy.AccuracyRow("serving", "d", "f", 50, 100,
                                                                                       note="fitted")]
    [(name, n, median, worst), (all_name, *_)] = accuracy.summarize(rows)
    assert (name, n, all_name) == ("serving", 3, "all")
    assert median == pytest.approx(0.03)  # |errors| 0.01, 0.10, 0.03
    assert worst.case == "b"
    assert [r.case for r in accuracy.per_case(rows)] == ["a", "b", "c"]


def test_the_newest_record_of_each_case_is_re_estimated_against_its_largest_rank():
    paths = sorted((ROOT / "calibrate" / "results").glob("*.jsonl"))
    records = [r for _, r in accuracy.latest_records(paths)]
    assert len(records) <= len(list(read_records(paths)))
    rows = [r for r in accuracy.record_rows(paths) if isinstance(r, accuracy.AccuracyRow) and r.figure == "peak allocated"]
    ok = [r for r in records if r["outcome"] == "ok"]
    assert len(rows) == len(ok) > 0
    for row, rec in zip(rows, ok, strict=True):
        assert row.measured == max(m["peak_allocated_bytes"] for m in rec["measured"])


def test_readme_section_is_between_markers():
    section = accuracy.readme_section([accuracy.AccuracyRow("calibrate/cpu", "cpu/x", "peak allocated", 110, 100)])
    assert section.startswith(accuracy.START) and section.endswith(accuracy.END)
    assert "| calibrate/cpu | cpu/x | peak allocated | 0.00 MiB | 0.00 MiB | +10.0% |" in section


def test_readme_accuracy_section_is_current():
    """The README's accuracy tables are what ``python benchmarks/accuracy.py --readme`` writes from today's
    estimates: a change that moves a published case's error must regenerate them (they went stale once, showing
    an unsloth case at +103.7% that the estimate had moved to -20.6%)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    current = text[text.index(accuracy.START):text.index(accuracy.END) + len(accuracy.END)]
    rows, _ = accuracy.collect()
    assert current == accuracy.readme_section(rows), "README's accuracy section is stale: run python benchmarks/accuracy.py --readme"
