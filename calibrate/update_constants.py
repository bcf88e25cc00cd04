"""Rewrite memest/data/calibrated.json from the calibration records in calibrate/results/.

``python calibrate/update_constants.py`` derives, per device family, the CUDA context (non-torch
memory of one-process runs) and the caching-allocator slack of training runs
(:mod:`memest.calibration.constants`), each naming the records it came from, and prints what
changed. memest/estimate/runtime.py reads the file; families without records keep the defaults.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from memest.calibration.constants import derive
from memest.calibration.records import read_records
from memest.estimate.runtime import CALIBRATED_PATH


def main() -> None:
    records = list(read_records(sorted((ROOT / "calibrate" / "results").glob("*.jsonl"))))
    new = derive(records, root=ROOT)
    old = json.loads(CALIBRATED_PATH.read_text()) if CALIBRATED_PATH.is_file() else {}
    CALIBRATED_PATH.write_text(json.dumps(new, indent=2) + "\n")
    for section in ("cuda_context_bytes", "allocator_slack"):
        for arch, entry in new[section].items():
            before = old.get(section, {}).get(arch, {}).get("value")
            print(f"{section}[{arch}] = {entry['value']} (was {before}; median of {entry['n']} records, "
                  f"range {entry['min']}..{entry['max']})")
    print(f"wrote {CALIBRATED_PATH.relative_to(ROOT)} from {len(records)} records")


if __name__ == "__main__":
    main()
