"""TensorRT-LLM: the KV-cache sizing of its backends (:mod:`.budget`) and the estimate of a job with its
capacity answers (:mod:`.engine`)."""
