"""``python -m ckptaudit.stages STAGE …``: the entry point of the workflow's rules."""

import sys

from .cli import main
from .job_process import freeze_before_exit

code = main()
freeze_before_exit()  # the job ends here: skip the shutdown's full collection
sys.exit(code)
