"""Sweeps: range parsing, one estimate per point, the exact boundary, and the picture."""

from __future__ import annotations

import sys

import pytest

from memest.devices import get_device
from memest.errors import InputError, MissingDependencyError
from memest.estimate import estimate
from memest.planning.sweep import MAX_POINTS, parse_size, parse_values, sweep
from memest.sources import load_model
from memest.workload import Parallelism, Recompute, ServingConfig, TrainingConfig

HEADROOM = 0.10


@pytest.mark.parametrize(("text", "expected"), [
    ("4096", 4096), ("4k", 4096), ("4K", 4096), ("128k", 131072), ("1M", 1048576), (" 2k ", 2048),
])
def test_sizes_use_binary_k_and_m(text, expected):
    assert parse_size(text, "seq_len") == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("1k..128k", (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)),  # powers of two by default
    ("3000..20000", (3000, 6000, 12000, 20000)),  # doubling from the start; the end is always included
    ("1..64:x4", (1, 4, 16, 64)),
    ("1..10:+4", (1, 5, 9, 10)),
    ("1k,4k,2k", (1024, 2048, 4096)),  # lists are sorted
    ("8..8", (8,)),
    ("512", (512,)),
])
def test_ranges(text, expected):
    assert parse_values(text, "seq_len") == expected


@pytest.mark.parametrize(("text", "message"), [
    ("0", "^seq_len '0' is not a positive size"),
    ("1.5k", "^seq_len '1.5k' is not a positive size"),
    ("4k..1k", "the range ends below its start"),
    ("1..4:x1", "the step must be"),
    ("1..4:-1", "the step must be"),
    ("1..100000:+1", f"names more than {MAX_POINTS} points"),
])
def test_bad_ranges_are_input_errors(text, message):
    with pytest.raises(InputError, match=message):
        parse_values(text, "seq_len")


def test_each_point_is_the_estimate_at_that_value():
    spec = load_model("meta-llama/Llama-2-7b-hf")
    device = get_device("H100")
    w = TrainingConfig(recompute=Recompute.FULL, parallelism=Parallelism(dp=8, zero_stage=3))
    result = sweep(spec, w, device, "seq_len", (1024, 8192, 131072), headroom=HEADROOM)
    assert [p.value for p in result.points] == [1024, 8192, 131072]
    for p in result.points:
        again = estimate(spec, w.replace(seq_len=p.value), device)
        assert p.estimate is not None and p.estimate.per_device.terms == again.per_device.terms
    fits = [p.verdict.fits for p in result.points]
    assert fits == [True, True, False]
    # the exact boundary lies between the last point that fits and the first that does not
    assert 8192 <= result.largest.value < 131072


def test_rejected_points_are_recorded_not_raised():
    spec = load_model("Qwen/Qwen2.5-7B")
    w = TrainingConfig(parallelism=Parallelism(cp=2, dp=4, zero_stage=3))
    result = sweep(spec, w, get_device("H100"), "seq_len", (1024, 1025), headroom=HEADROOM)
    assert result.points[0].error is None
    assert result.points[1].estimate is None and "divisible by 2 x cp (4)" in result.points[1].error


def test_a_setting_of_the_other_mode_is_refused():
    spec = load_model("meta-llama/Llama-2-7b-hf")
    with pytest.raises(InputError, match="--batch-size cannot be swept for a train job; sweep --micro-batch-size or --seq-len"):
        sweep(spec, TrainingConfig(), get_device("H100"), "batch_size", (1, 2), headroom=HEADROOM)


@pytest.mark.parametrize("suffix", [".png", ".svg", ".pdf"])
def test_plot_writes_an_image(tmp_path, suffix):
    pytest.importorskip("matplotlib")
    from memest.report.plot import plot_sweep

    spec = load_model("meta-llama/Llama-2-70b-hf")
    result = sweep(spec, ServingConfig(max_model_len=4096, parallelism=Parallelism(tp=4)), get_device("H100"),
                   "batch_size", parse_values("1..1024", "batch_size"), headroom=HEADROOM)
    out = plot_sweep(result, tmp_path / f"sweep{suffix}")
    data = out.read_bytes()
    magic = {".png": data.startswith(b"\x89PNG"), ".svg": b"<svg" in data[:2000], ".pdf": data.startswith(b"%PDF")}
    assert magic[suffix]
    if suffix == ".svg":
        text = data.decode()
        # vLLM's fit rule keeps no --headroom (gpu_memory_utilization is its share): the usable line says so
        for label in ("kv cache", "weights", "H100-80GB capacity", "usable (vLLM: headroom not applied",
                      "largest that fits"):
            assert label in text
        # 1024 sequences of 4k tokens (1024 x 4096 x 327,680 B / tp 4 = 320 GiB of KV cache alone) need more than
        # 2.5 x 79.19 GiB: the axis is clipped, and says so
        top = result.points[-1].estimate.per_device.device_used_bytes
        assert top > 2.5 * result.device.memory_bytes and "clipped: " in text


def test_plot_refuses_other_formats(tmp_path):
    from memest.report.plot import plot_sweep

    spec = load_model("meta-llama/Llama-2-7b-hf")
    result = sweep(spec, ServingConfig(), get_device("H100"), "batch_size", (1, 2), headroom=HEADROOM)
    with pytest.raises(InputError, match=r"must end in .png, .svg or .pdf"):
        plot_sweep(result, tmp_path / "sweep.jpg")


def test_plot_without_matplotlib_says_how_to_install(tmp_path, monkeypatch):
    from memest.report.plot import plot_sweep

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    spec = load_model("meta-llama/Llama-2-7b-hf")
    result = sweep(spec, ServingConfig(), get_device("H100"), "batch_size", (1, 2), headroom=HEADROOM)
    with pytest.raises(MissingDependencyError, match=r"pip install 'memest\[plot\]'"):
        plot_sweep(result, tmp_path / "sweep.png")
