"""A setting the job would not read is refused when it is named, even at its default value.

The README's rule ("a flag the job would not read is refused rather than ignored") held only for values
that differ from the default: ``--train --lora-rank 16`` (16 is the default rank) ran full training
silently. A user who types a flag, or passes a keyword, expects it to be read.
"""

from __future__ import annotations

import os

import pytest
from inprocess import run_memest

import memest

ENV = {k: v for k, v in os.environ.items() if k not in ("MEMEST_DEBUG", "COLUMNS")} | {"HF_HUB_OFFLINE": "1"}


@pytest.mark.parametrize(("args", "fragment"), [
    (("--train", "--lora-rank", "16"), "--lora-rank applies to --finetune lora or --finetune qlora, not --train"),
    (("--train", "--engine", "vllm"), "--engine is a serving flag"),
    (("--finetune", "lora", "--block-size", "16"), "--block-size is a serving flag"),
    (("--serve", "--micro-batch-size", "1"), "--micro-batch-size is a training flag"),
    (("--lora-rank", "16"), "add --train or --finetune (serving is the default)"),
    (("--engine", "hf", "--block-size", "16"), "--block-size is a --engine vllm flag"),
    (("--engine", "vllm", "--page-size", "1"), "--page-size is a --engine sglang flag"),
])
def test_a_flag_named_at_its_default_is_still_refused(args, fragment):
    for command in ("hf", "plan"):
        out = run_memest(command, "openai-community/gpt2", *args, env=ENV)
        assert out.returncode == 2 and fragment in out.stderr, (command, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1


def test_flags_the_job_reads_are_accepted_at_their_defaults():
    for args in (("--train", "--seq-len", "1024", "--micro-batch-size", "1"),
                 ("--serve", "--engine", "vllm", "--block-size", "16"),
                 ("--finetune", "lora", "--lora-rank", "16")):
        out = run_memest("hf", "openai-community/gpt2", *args, "--json", env=ENV)
        assert out.returncode == 0, (args, out.stderr)


def test_a_keyword_named_at_its_default_is_refused_by_the_python_api():
    with pytest.raises(memest.InputError, match="lora_rank applies to mode lora or mode qlora"):
        memest.estimate_memory("openai-community/gpt2", mode="train", lora_rank=16)
    with pytest.raises(memest.InputError, match="block_size is a serving"):
        memest.estimate_memory("openai-community/gpt2", mode="train", block_size=16)
    assert memest.estimate_memory("openai-community/gpt2", mode="lora", lora_rank=16).fits is not None
