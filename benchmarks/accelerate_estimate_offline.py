"""Run `accelerate estimate-memory`'s own code path offline, for the start-up comparison.

accelerate's command first asks the Hub for the repo's metadata (`verify_on_hub`); this machine has
no Hub access, so that one call is replaced by the metadata of a local config.json. Everything else
(importing torch + transformers, building the model on the meta device, summing sizes, printing the
table) is accelerate's code as installed.

Usage: python benchmarks/accelerate_estimate_offline.py path/to/model_folder
"""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

from accelerate.commands import estimate

folder = Path(sys.argv[1])
config = json.loads((folder / "config.json").read_text())
estimate.verify_on_hub = lambda name, token=None: SimpleNamespace(config=config, library_name="transformers")
parser = estimate.estimate_command_parser()
args = parser.parse_args([str(folder), "--library_name", "transformers", "--dtypes", "float32", "float16"])
estimate.estimate_command(args)
