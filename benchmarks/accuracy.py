"""One table of memest's predictions against measurements: calibration records and published cases.

Run ``python benchmarks/accuracy.py`` to regenerate ``benchmarks/accuracy.md``; ``--readme`` also
rewrites the accuracy section of README.md (between ``<!-- accuracy:start -->`` and
``<!-- accuracy:end -->``). The rows, the summary and both texts come from
:mod:`memest.validation.accuracy` (its docstring says what is compared).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from memest.validation.accuracy import END, START, collect, markdown, readme_section

REPORT = Path(__file__).resolve().parent / "accuracy.md"
README = ROOT / "README.md"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", action="store_true", help="also rewrite the accuracy section of README.md")
    args = parser.parse_args(argv)
    rows, skipped = collect()
    REPORT.write_text(markdown(rows, skipped))
    print(f"wrote {REPORT.relative_to(ROOT)}: {len(rows)} figures, {len(skipped)} without a figure")
    if args.readme:
        text = README.read_text()
        section = readme_section(rows)
        if START in text and END in text:
            text = text[:text.index(START)] + section + text[text.index(END) + len(END):]
        else:
            header = "" if text.rstrip().endswith("## Accuracy") else "\n\n## Accuracy"
            text = text.rstrip("\n") + header + "\n\n" + section + "\n"
        README.write_text(text)
        print(f"updated {README.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
