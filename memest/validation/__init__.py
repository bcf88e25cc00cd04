"""Published measurements and memest's figures of the same quantities.

:mod:`memest.validation.cases` reads the published cases (``benchmarks/data/validation_cases.json`` of a
source checkout); :mod:`.training` and :mod:`.serving` map each case onto memest's inputs and compare
like with like. The reports in ``benchmarks/`` and the tests in ``tests/test_validation_*.py`` use
the same functions, so both compare the same figures.
"""
