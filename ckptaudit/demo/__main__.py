"""``python -m ckptaudit.demo OUT_DIR …``: build the demo run (rules/demo.smk)."""

import sys

from .run import main

if __name__ == "__main__":
    sys.exit(main())
