"""``python -m ckptaudit.cluster start|stop|status``: the local SLURM from a shell (.ci/slurm-setup.sh)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from .local_slurm import (DEFAULT_STATE, USABLE_STATES, SlurmSetupError, munge_works, node_states,
                          slurm_installed, start_local_slurm, stop_local_slurm)


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m ckptaudit.cluster",
                                 description="A single-node SLURM on this machine, for ckptaudit's tests and CI.")
    ap.add_argument("command", choices=("start", "stop", "status"))
    ap.add_argument("--state-dir", default=str(DEFAULT_STATE))
    ap.add_argument("--conf", default=None, help="where to write slurm.conf (default /etc/slurm/slurm.conf)")
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for the node to be idle")
    a = ap.parse_args(argv)
    if a.command == "start":
        try:
            info = start_local_slurm(a.state_dir, a.conf, a.timeout)
        except SlurmSetupError as e:
            print(f"ckptaudit.cluster: {e}", file=sys.stderr)
            return 1
        print(json.dumps(asdict(info)))
        if info.env():
            print(f"export SLURM_CONF={info.conf}", file=sys.stderr)
        return 0
    if a.command == "stop":
        print("stopped: " + (", ".join(stop_local_slurm(a.state_dir)) or "nothing"))
        return 0
    conf = Path(a.conf) if a.conf else None
    states = node_states(conf)
    print(json.dumps({"installed": slurm_installed(), "munge": munge_works(), "nodes": states,
                      "ready": any(s in USABLE_STATES for s in states.values())}))
    return 0 if states else 1


if __name__ == "__main__":
    raise SystemExit(main())
