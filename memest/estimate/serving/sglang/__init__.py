"""SGLang: the start-up arithmetic of each version (:mod:`.budget`) and the estimate of a job with its
capacity answers (:mod:`.engine`)."""
