"""The analytic path starts fast: importing the CLI loads no torch, transformers or huggingface_hub."""

import subprocess
import sys

HEAVY = ("torch", "transformers", "huggingface_hub", "accelerate")


def test_cli_import_is_light():
    code = (
        "import sys, memest.cli, memest.estimate, memest.planning.search, memest.report, memest.sources;"
        f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_catalog_estimate_loads_no_heavy_module():
    code = (
        "import sys\n"
        "from memest.cli import main\n"
        "sys.argv = ['memest', 'hf', 'meta-llama/Llama-2-70b-hf', '--serve', '--json']\n"
        "import io, contextlib\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        "    try:\n"
        "        main()\n"
        "    except SystemExit:\n"
        "        pass\n"
        f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1:] in ([], [""])
