"""Serving as transformers ``generate`` runs it: a prefill of the prompt, then decode steps.

What memest estimates with ``--engine hf`` (:mod:`memest.estimate.serving.hf.generate`): ``batch_size``
sequences of a prompt then new tokens (:func:`~memest.estimate.serving.hf.generate.lengths`), greedy decoding with the default dynamic cache (``DynamicCache``: per layer, K and V tensors that
grow by concatenation each step), weights at the serving dtype (``auto`` = the checkpoint's, fp32
checkpoints in fp16, as :func:`memest.estimate.serving.common.weight_dtype` says). The warm-up is a
generate of a short prompt, so kernels and the cuBLAS workspace exist before the baseline.
Encoder-only models (BERT-style) run one forward of the batch instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memest.errors import InputError
from memest.workload import ServingConfig

WARMUP_PROMPT = 8
WARMUP_NEW_TOKENS = 2


@dataclass
class ServingSession:
    """A model ready to serve one measured batch.

    Attributes:
        model: The model in eval mode.
        batch_size: Sequences.
        prompt_len: Prompt tokens per sequence.
        new_tokens: Decode steps (0 for encoder-only models: one forward).
        vocab_size: Token ids are drawn below this.
        device: The torch device.
    """

    model: Any
    batch_size: int
    prompt_len: int
    new_tokens: int
    vocab_size: int
    device: Any

    def _run(self, prompt_len: int, new_tokens: int) -> None:
        import torch

        g = torch.Generator(device="cpu").manual_seed(0)
        ids = torch.randint(0, self.vocab_size, (self.batch_size, prompt_len), generator=g).to(self.device)
        with torch.inference_mode():
            if self.new_tokens == 0:
                self.model(input_ids=ids)
                return
            from transformers import GenerationConfig

            config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                      pad_token_id=0, eos_token_id=None, use_cache=True)
            self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)

    def warmup(self) -> None:
        """A short generate: loads kernels, creates the cuBLAS workspace."""
        self._run(min(WARMUP_PROMPT, self.prompt_len), min(WARMUP_NEW_TOKENS, self.new_tokens))

    def step(self) -> None:
        """The measured generate: prefill ``prompt_len`` tokens, decode ``new_tokens``."""
        self._run(self.prompt_len, self.new_tokens)

    def live_bytes(self) -> int:
        """Bytes of the parameters and buffers."""
        import itertools

        from memest.calibration.training import tensors_bytes

        return tensors_bytes(itertools.chain(self.model.parameters(), self.model.buffers()))

    def static_bytes(self) -> dict[str, int]:
        """Bytes of the weights."""
        from memest.calibration.models import parameter_bytes

        return {"weights": parameter_bytes(self.model)}


def prepare_serving(model: Any, spec: Any, s: ServingConfig, *, device: Any, vocab_size: int) -> ServingSession:
    """Set up ``model`` (on ``device`` at the serving dtype) to serve ``s``: the prompt and generated
    lengths are :func:`memest.estimate.serving.hf.generate.lengths`, the estimate's own.

    Raises:
        InputError: nothing to generate for a generating model, or no prompt.
    """
    from memest.estimate.serving.hf.generate import lengths

    n = lengths(spec, s)
    generates = spec.task in ("causal_lm", "seq2seq")
    if generates and n.new < 2:
        raise InputError(f"calibrate measures at least 2 decode steps; {{max_new_tokens}} is {n.new} "
                         "(raise it, or {max_model_len} above the prompt)", field="max_new_tokens")
    if n.prompt < 1:
        raise InputError(f"{{max_model_len}} leaves no prompt before {n.new} new tokens; raise {{max_model_len}}",
                         field="max_model_len")
    model.eval()
    return ServingSession(model, s.batch_size, n.prompt, n.new if generates else 0, vocab_size, device)
