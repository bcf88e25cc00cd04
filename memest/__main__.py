"""``python -m memest``."""

from memest.cli import main

main()
