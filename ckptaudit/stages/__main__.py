"""``python -m ckptaudit.stages STAGE …``: the entry point of the workflow's rules.  Run in the audit's stage job
server when there is one (:mod:`.jobs.client`, :mod:`.jobs.server`), else here."""

import os
import sys

from .jobs.client import SERVE, run_in_server

if sys.argv[1:2] == [SERVE]:  # the audit's stage job server (started by ckptaudit.stages.jobs.server.start)
    from .cli import main
    from .jobs.server import serve

    status = serve(*map(int, sys.argv[2:4]), *sys.argv[4:6], main)
    sys.stderr.flush()
    os._exit(status)
code = run_in_server(sys.argv)
if code is None:
    from .cli import main
    from .jobs.process import freeze_before_exit

    code = main()
    freeze_before_exit()  # the job ends here: skip the shutdown's full collection
sys.exit(code)
