"""Run `make_prompts`: `python scripts/make_prompts [--seed 0] [--output cerberus_hf/data/prompts.jsonl]` from the
repository root (or `python -m scripts.make_prompts ...`); what it reproduces is in `__init__.py`."""

import sys
from pathlib import Path

if __package__:  # python -m scripts.make_prompts
    from .cli import main
else:  # python scripts/make_prompts: the package's own folder is sys.path[0]; its parent must be instead
    sys.path[0] = str(Path(__file__).resolve().parents[1])
    from make_prompts.cli import main

sys.exit(main())
