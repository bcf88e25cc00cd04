"""vLLM: the start-up budget of each version (:mod:`.budget`), the weights as it loads them
(:mod:`.weights`), and the estimate of a job with its capacity answers (:mod:`.engine`)."""
