"""Planning over the estimator: the fit rule, the cheapest-setup search, the largest-that-fits
queries, sweeps and what a setup costs (DESIGN.md, "Planning").

``fit`` (the verdict), ``search`` (:func:`~memest.planning.search.plan`), ``recommend`` (``memest hf``'s
verdict and cheapest change: :func:`~memest.planning.recommend.assess`), ``maxfit``
(largest batch / length / concurrency), ``sweep`` (a grid of estimates), ``costs`` (money,
communication, disruption). No module here prints or names a CLI flag.
"""
