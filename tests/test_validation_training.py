"""Every training case of benchmarks/data/validation_cases.json (kinds train_full, train_multi_gpu, lora,
qlora) against memest, like with like, through two mappings.

The hand mapping from each case's published settings to memest's inputs, and the metric compared, live
in ``memest/validation/training.py``; the stack mapping (the case's stack, the settings its source states and
the config files memest reads) in ``memest/validation/stack_mapping.py``; ``benchmarks/training_cases.py``
writes the report ``benchmarks/training_cases.md``. Expected values are the published figures. Tolerances:
HIGH_TOLERANCE (10%) for tensor-byte figures of high-confidence cases, DEVICE_TOLERANCE (15%) for reserved /
nvidia-smi figures (allocator slack is a fixed share in memest), MEDIUM_TOLERANCE (25%) for medium-confidence
cases, which are sanity checks. Cases memest does not yet reproduce are expected failures with the reason of
``memest/validation/gaps.py`` (the report lists the same reasons); a case whose verdict changes between the
two mappings must say why there (``STACK_GAPS``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from memest.validation import stack_mapping as sm
from memest.validation import training as tc
from memest.validation.cases import load_cases
from memest.validation.gaps import GOAL, KNOWN_GAPS, STACK_GAPS
from memest.workload import Stack

REPORT = Path(__file__).resolve().parents[1] / "benchmarks" / "training_cases.md"

ROWS = tc.rows()
STACK_ROWS = tc.stack_rows(ROWS)
PAIRS = dict(zip((r.case.id for r in ROWS), zip(ROWS, STACK_ROWS, strict=True), strict=True))


def test_every_training_case_is_compared():
    published = {c["id"] for c in load_cases(*tc.KINDS)}
    compared = {r.case.id.split("@")[0] for r in ROWS}
    assert compared == published


@pytest.mark.parametrize("row", ROWS, ids=[r.case.id for r in ROWS])
def test_case_within_tolerance(row):
    if row.case.id in KNOWN_GAPS and abs(row.error) > row.case.tolerance:
        pytest.xfail(KNOWN_GAPS[row.case.id])
    assert abs(row.error) <= row.case.tolerance, (
        f"{row.case.id}: memest {row.predicted_bytes / tc.GiB:.2f} GiB vs measured "
        f"{row.case.measured_bytes / tc.GiB:.2f} GiB ({row.error:+.1%}, moment {row.estimate.extra['peak_moment']})"
    )


@pytest.mark.parametrize("row", STACK_ROWS, ids=[r.case.id for r in STACK_ROWS])
def test_case_within_tolerance_through_its_stack(row):
    """The stack mapping's row: an expected failure only with a reason, its own (STACK_GAPS) where its verdict
    differs from the hand mapping's, else the hand mapping's (KNOWN_GAPS)."""
    hand = PAIRS[row.case.id][0]
    if abs(row.error) > row.case.tolerance:
        if row.case.id in STACK_GAPS:
            pytest.xfail(STACK_GAPS[row.case.id])
        if row.case.id in KNOWN_GAPS and abs(hand.error) > hand.case.tolerance:
            pytest.xfail(KNOWN_GAPS[row.case.id])
    assert abs(row.error) <= row.case.tolerance, (
        f"{row.case.id} through {row.case.extra['via']}: memest {row.predicted_bytes / tc.GiB:.2f} GiB vs measured "
        f"{row.case.measured_bytes / tc.GiB:.2f} GiB ({row.error:+.1%}); differs from the hand mapping in "
        f"{row.case.extra['differences']}"
    )


def test_a_verdict_that_changes_between_the_mappings_is_explained():
    """A case that newly passes or fails (its tolerance, or issue 14's goal) through its stack has a STACK_GAPS
    reason, and every STACK_GAPS entry is such a case (no stale reasons)."""
    changed = {cid for cid, (hand, stack) in PAIRS.items() if tc.verdicts(hand) != tc.verdicts(stack)}
    assert changed == set(STACK_GAPS), (
        f"unexplained: {sorted(changed - set(STACK_GAPS))}; stale: {sorted(set(STACK_GAPS) - changed)}")


def test_every_case_beyond_the_goal_names_its_missing_mechanism():
    """Each hand-mapped case beyond +-10% has a KNOWN_GAPS reason (the report's section reads it), and every
    KNOWN_GAPS entry is such a case."""
    beyond = {r.case.id for r in ROWS if abs(r.error) > GOAL}
    assert beyond == set(KNOWN_GAPS), (
        f"no reason: {sorted(beyond - set(KNOWN_GAPS))}; stale: {sorted(set(KNOWN_GAPS) - beyond)}")


@pytest.mark.parametrize("case", load_cases(*tc.KINDS), ids=lambda c: c["id"])
def test_case_names_its_stack_and_files(case):
    """Each case names a stack memest has, states settings by memest's keywords, and stores every config file
    it cites at a full commit under benchmarks/data/configs/<repo>/<commit[:12]>/<path>."""
    assert Stack(case["stack"]) in Stack
    m = sm.mapping(case)  # raises on a missing file or an unknown reader
    for entry in case.get("config_files", []):
        assert re.fullmatch(r"[0-9a-f]{40}", entry["commit"]), entry
        assert entry["file"] == f"configs/{entry['repo']}/{entry['commit'][:12]}/{entry['path']}"
        assert (sm.CONFIG_DIR / entry["file"]).stat().st_size > 0
    if any(e["reader"] == "pending" for e in case.get("config_files", [])):
        assert sm.PENDING in m.via


def test_the_stack_mapping_reads_the_stored_accelerate_config():
    """peft's examples/sft/configs/deepspeed_config.yaml (commit 09802c1b) says DeepSpeed ZeRO-3 on 8 processes
    (distributed_type DEEPSPEED, zero_stage 3, num_processes 8): the stack mapping takes them from the file, not
    from stated settings."""
    _, stack = PAIRS["peft_llama2_70b_lora_ds_zero3_8gpu"]
    par = stack.case.workload.parallelism
    assert (par.zero_stage, par.dp) == (3, 8)
    assert "deepspeed_config.yaml" in stack.case.extra["via"]
    assert "zero_stage" not in load_cases_by_id()["peft_llama2_70b_lora_ds_zero3_8gpu"]["stack_settings"]


def test_differences_name_where_the_stack_value_comes_from():
    """HF Trainer docs' BERT rows: the hand mapping sets eager attention and zero_grad(set_to_none=False) (torch
    1.x, Jan 2022); the hf-trainer stack's defaults are SDPA and set_to_none=True."""
    _, stack = PAIRS["hf_bert_large_vanilla_bs4"]
    assert stack.case.extra["differences"] == ("attn_implementation: hand eager, stack default sdpa",
                                               "set_grads_to_none: hand False, stack default True")


def load_cases_by_id():
    return {c["id"]: c for c in load_cases(*tc.KINDS)}


def test_median_error_goal():
    """The earlier goal: median |error| <= 5% over the published training cases (the cases collected for issue 14
    are the check on runs memest was never compared with: reported, not held to it)."""
    earlier = [r for r in ROWS if "collected_for" not in load_cases_by_id()[r.case.id.split("@")[0]]]
    assert tc.summary(earlier)["median_abs_error"] <= 0.05


def test_median_error_goal_of_issue_14():
    """Issue 14's goal: median |error| <= 3% over the published training cases."""
    assert tc.summary(ROWS)["median_abs_error"] <= 0.03


def test_report_is_current():
    """benchmarks/training_cases.md is what the script generates now."""
    report = REPORT.read_text()
    assert report.startswith(tc.markdown(ROWS, STACK_ROWS))


def test_a_litgpt_config_hub_yaml_is_no_deepspeed_config():
    """litgpt's config_hub/finetune/phi-2/lora.yaml (commit 00af8b0d) has a top-level ``optimizer`` (class_path /
    init_args), which memest read as a DeepSpeed config at ZeRO stage 0; DeepSpeed's ``optimizer`` has a ``type``.
    memest has no litgpt reader: the file is refused, naming the formats it reads."""
    from memest.errors import InputError
    from memest.workload import files

    stored = sm.CONFIG_DIR / "configs/Lightning-AI/litgpt/00af8b0d9b43/config_hub/finetune/phi-2/lora.yaml"
    with pytest.raises(InputError, match="not a format memest reads"):
        files.read([stored])


def test_torchtune_readme_gb_figure_is_compared_as_gib():
    """torchtune's recipes print only ``get_memory_stats`` figures, each divided by 1024**3
    (``torchtune/training/memory.py`` at 30b8519e8): the README's '44.8 GB' 405B row is 44.8 GiB,
    44.8 x 1,073,741,824 = 48,103,633,715.2 B, not 44.8e9 B."""
    case = next(r.case for r in ROWS if r.case.id == "torchtune_llama31_405b_qlora_8xa100")
    assert case.measured_bytes == 48_103_633_715
