"""transformers ``generate``: the prefill moment by moment (:mod:`.prefill`) and the peak of a
prefill + decode loop with its capacity answers (:mod:`.generate`)."""
