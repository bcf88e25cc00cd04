"""Every table fits the width it is printed at: ``COLUMNS`` (or the terminal), never cutting a cell.

Each command's output is rendered at 80 and at 200 columns; no line may be wider and no cell may end
in rich's "…" (a cut name or number). At 80 columns the wide tables switch to their narrower layouts.
The ``--trace`` progress is the CLI's: the library reports through a callback and prints nothing.
"""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
from rich.console import Console
from typer.testing import CliRunner

from memest.cli import app, output_width
from memest.cli import calibrate as calibrate_command
from memest.cli.progress import LINE_SECONDS, progress_on_stderr
from memest.devices import get_device
from memest.estimate import estimate
from memest.report import trace as console
from memest.report.tables import Narrowest, name_col, new_table, number_col, prose_col
from memest.result import Kind
from memest.sources import load_model
from memest.trace import compare
from memest.trace.result import RankTrace, TensorGroup, TraceResult
from memest.workload import TrainingConfig

WIDTHS = (80, 200)

COMMANDS = {
    "hf train": ["hf", "meta-llama/Llama-2-7b-hf", "--train", "--gpu", "A100-80GB"],
    "hf lora --explain": ["hf", "meta-llama/Llama-3.1-8B", "--finetune", "lora", "--lora-targets", "all-linear",
                          "--micro-batch-size", "4", "--seq-len", "8192", "--explain"],
    "hf serve --explain": ["hf", "meta-llama/Llama-2-70b-hf", "--serve", "--explain"],
    "hf pipeline stages": ["hf", "meta-llama/Llama-3.1-8B", "--train", "--gpus", "4", "--pp", "4", "--explain"],
    "plan train": ["plan", "meta-llama/Llama-3.1-8B", "--train", "--seq-len", "8192",
                   "--gpus-available", "8xH100,8xA100-80GB"],
    "plan serve": ["plan", "meta-llama/Llama-3.1-8B", "--serve", "--max-model-len", "32768", "--batch-size", "16",
                   "--gpus-available", "8xH100,8xL40S", "--allow-quantization"],
    "sweep": ["sweep", "meta-llama/Llama-3.1-8B", "--train", "--seq-len", "1k..128k", "--gpu", "H100", "--gpus", "8",
              "--zero-stage", "3"],
    "models": ["models"],
    "gpus": ["gpus"],
}


def _check(text: str, width: int) -> None:
    lines = text.splitlines()
    assert lines, "nothing printed"
    too_wide = [line for line in lines if len(line) > width]
    assert not too_wide, f"{len(too_wide)} lines wider than {width}: {too_wide[0]!r}"
    cut = [line for line in lines if "…" in line]
    assert not cut, f"cut cells at {width} columns: {cut[0]!r}"


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_fits_columns_without_cut_cells(command: str, width: int) -> None:
    result = CliRunner().invoke(app, COMMANDS[command], env={"COLUMNS": str(width), "HF_HUB_OFFLINE": "1"})
    assert result.exit_code == 0, result.output
    _check(result.stdout, width)


def test_narrow_consoles_get_the_narrow_layouts() -> None:
    # the plan's wide table needs 8 columns' names and numbers whole (A100-80GB, peak GiB/device, ...):
    # more than 80 columns, so at 80 the setup is one column; at 200 the wide header is there
    narrow = CliRunner().invoke(app, COMMANDS["plan train"], env={"COLUMNS": "80"}).stdout
    wide = CliRunner().invoke(app, COMMANDS["plan train"], env={"COLUMNS": "200"}).stdout
    assert "setup" in narrow and "parallelism" not in narrow
    assert "parallelism" in wide and "peak GiB/device" in wide
    # models: the longest catalog name (40 characters) and the model_type column do not fit 80 beside
    # the numbers, so the type goes below the name
    assert "model (model_type)" in CliRunner().invoke(app, ["models"], env={"COLUMNS": "80"}).stdout
    wide_models = CliRunner().invoke(app, ["models"], env={"COLUMNS": "200"}).stdout
    assert "model_type" in wide_models and "model (model_type)" not in wide_models


def test_columns_sets_the_width_and_a_pipe_defaults_to_140(monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "97")
    assert output_width() == 97
    monkeypatch.delenv("COLUMNS")
    assert output_width() == 140  # pytest's stdout is captured: not a terminal


def test_names_and_numbers_fold_rather_than_cut_when_nothing_fits() -> None:
    table = new_table(name_col("term"), number_col("GiB"), prose_col("formula"))
    table.add_row("optimizer_states.moments", "1,234.56", "two fp32 moments per trainable parameter")
    out = Console(width=20, record=True, file=io.StringIO())
    out.print(Narrowest(table))
    text = out.export_text()
    assert "…" not in text
    assert all(len(line) <= 20 for line in text.splitlines())
    body = [line for line in text.splitlines() if line.startswith("│")]
    columns = ["".join(line.split("│")[i].strip() for line in body) for i in (1, 2, 3)]
    # every character of each cell is printed, folded over lines
    assert columns == ["optimizer_states.moments", "1,234.56", "twofp32momentspertrainableparameter"]


def _trace_result() -> TraceResult:
    labels = ("aten._log_softmax_backward_data (32768, 128256) float32", "aten._to_copy (4, 8192, 4096) float32")
    rank = RankTrace(rank=0, peak_allocated_bytes=60 << 30, peak_reserved_bytes=64 << 30, peak_tensor_bytes=60 << 30,
                     by_kind={Kind.WEIGHTS: 15 << 30, Kind.ACTIVATIONS: 45 << 30}, peak_phase="backward", peak_event=1,
                     num_events=2, phase_peaks={"forward": 59 << 30, "backward": 60 << 30},
                     groups=tuple(TensorGroup(Kind.ACTIVATIONS, label, 32, 15 << 30) for label in labels))
    return TraceResult(model="meta-llama/Llama-3.1-8B", mode="train", target="cuda", world_size=1, ranks=(rank,),
                       seconds=3.2, num_ops=12_957, settings=("precision mixed: parameters bfloat16",))


@pytest.mark.parametrize("width", WIDTHS)
def test_the_trace_tables_fit(width: int) -> None:
    spec = load_model("meta-llama/Llama-3.1-8B")
    result = _trace_result()
    comparison = compare(result, estimate(spec, TrainingConfig(seq_len=8192), get_device("H100-80GB")))
    out = Console(width=width, record=True, file=io.StringIO())
    out.print(console.render(result, comparison))
    _check(out.export_text(), width)


@pytest.mark.parametrize("width", WIDTHS)
def test_the_calibrate_table_fits(width: int) -> None:
    spec = load_model("meta-llama/Llama-3.1-8B")
    workload = TrainingConfig()
    est = estimate(spec, workload, get_device("H100-80GB"))
    names = [t.name for t in est.per_device.terms]
    rows = [SimpleNamespace(name="activations", total=False, predicted=123 << 30, measured=120 << 30,
                            delta=3 << 30, error=0.025, terms=tuple(n for n in names if n.startswith("activations"))),
            SimpleNamespace(name="peak allocated (max_memory_allocated)", total=True, predicted=1_234 << 30,
                            measured=1_200 << 30, delta=34 << 30, error=0.0283, terms=())]
    measurement = SimpleNamespace(device_name="NVIDIA H100 80GB HBM3", backend="cuda", fits=True, error=None,
                                  num_alloc_retries=0, num_ooms=0)
    result = SimpleNamespace(ranks=[SimpleNamespace(rank=0, measurement=measurement, rows=rows)], estimate=est,
                             device=get_device("H100-80GB"),
                             verdict=SimpleNamespace(status="right", predicted_fits=True, measured_fits=True,
                                                     headroom=0.1))
    rec = {"versions": {"torch": "2.13.0", "transformers": "5.24.0", "cuda": "13.0", "driver": "580.65"},
           "inputs": {"steps": 3, "weights": "random"}, "id": "0123abcd"}
    out = Console(width=width, record=True, file=io.StringIO())
    out.print(calibrate_command.render(spec, workload, result, rec, None))
    _check(out.export_text(), width)


# ---- --trace progress ----


def test_progress_off_a_terminal_is_one_line_per_few_seconds() -> None:
    now = [0.0]
    err = io.StringIO()
    stderr = Console(file=err, force_terminal=False, width=80)
    with progress_on_stderr(stderr, "tracing", clock=lambda: now[0]) as progress:
        for t, done in ((0.5, 1), (2.0, 2), (LINE_SECONDS + 0.1, 3), (LINE_SECONDS + 1, 4), (2 * LINE_SECONDS + 0.2, 5)):
            now[0] = t
            progress("backward", done, 65)
    assert err.getvalue().splitlines() == ["tracing backward 3/65 (5 s)", "tracing backward 5/65 (10 s)"]


def test_a_quick_run_off_a_terminal_prints_nothing() -> None:
    err = io.StringIO()
    with progress_on_stderr(Console(file=err, force_terminal=False), "tracing") as progress:
        progress("forward", 1, 3)
    assert err.getvalue() == ""


def test_progress_on_a_terminal_is_a_transient_bar() -> None:
    err = io.StringIO()
    with progress_on_stderr(Console(file=err, force_terminal=True, width=80), "tracing", start="model build") as progress:
        progress("forward", 1, 3)
        progress("backward", 3, 3)
    assert "tracing" in err.getvalue()  # drawn, then cleared (transient)


@pytest.mark.slow
def test_the_trace_reports_progress_through_the_callback_and_prints_nothing(capsys) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from trace_models import tiny_config

    cfg = tiny_config("llama")
    workload = TrainingConfig(seq_len=64)
    device = get_device("H100-80GB")
    from memest.sources import spec_from_config

    calls: list[tuple[str, int, int]] = []
    console.trace_for_cli(cfg, workload, device, estimate(spec_from_config(cfg), workload, device),
                          trust_remote_code=False, plot=None, progress=lambda *a: calls.append(a))
    # one tick per decoder-layer pass, forward and backward, then the optimizer step: done reaches total
    assert calls and calls[-1][1] == calls[-1][2]
    assert {what for what, _, _ in calls} >= {"forward", "backward"}
    printed = capsys.readouterr()
    assert printed.out == ""
    assert "tracing" not in printed.err
