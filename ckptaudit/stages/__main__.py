"""``python -m ckptaudit.stages STAGE …``: the entry point of the workflow's rules."""

import sys

from .cli import main

sys.exit(main())
