"""``memest calibrate``: run a few real steps of a job on a device and compare with the estimate.

The pieces, each with one job:

- :mod:`~memest.calibration.request` — what to run (model, workload flags, steps, backend) and
  which workloads calibrate can run; plain data, no torch;
- :mod:`~memest.calibration.models` — the transformers model built from its config with random
  weights directly on the device (real weights only on request);
- :mod:`~memest.calibration.training` / :mod:`~memest.calibration.serving` — the workloads: a
  training step with the precision recipe, optimizer and LoRA; prefill plus decode with the HF cache;
- :mod:`~memest.calibration.distributed` — torchrun, DDP / FSDP2, gathering per-rank figures
  (:mod:`~memest.calibration.worker` is each torchrun worker's entry point);
- :mod:`~memest.calibration.runner` — the protocol around the steps (warm-up, baseline,
  out-of-memory as a result, releasing the device) on one process;
- :mod:`~memest.calibration.compare` — predicted versus measured, per term and in total; no torch;
- :mod:`~memest.calibration.records` — the JSON-lines records in ``calibrate/results/``;
- :mod:`~memest.calibration.suites` — the case lists in ``calibrate/suites/``;
- :mod:`~memest.calibration.constants` — runtime constants derived from records.

torch, transformers and peft are imported inside functions only.
"""
