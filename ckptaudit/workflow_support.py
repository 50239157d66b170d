"""Plain functions behind the Snakefile's input functions (testable without
Snakemake).  Imports nothing heavy."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Dict, List

from .inventory import listing_fingerprint  # noqa: F401 - re-exported for rules/common.smk

STAGE_KEYS = ("expected_model_args", "model_factory", "reference", "target", "load", "security", "state",
              "run_name")


def run_name(run_dir: str) -> str:
    """Report folder name for a run: the run folder's base name."""
    name = Path(str(run_dir).rstrip("/")).name
    return name or "run"


def stage_config(config: dict, run_dir: str, name: str) -> dict:
    """The part of the audit config the stages read (written to work/config.json)."""
    out = {k: config.get(k) for k in STAGE_KEYS}
    out["run_dir"] = run_dir
    out["run_name"] = name
    return out


def read_inventory(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def part_units(inv: dict, part: str) -> List[dict]:
    wanted = set(inv["parts"].get(part, []))
    return [u for u in inv["units"] if u["unit"] in wanted]


def part_files(inv: dict, part: str) -> List[str]:
    """The run's files that a part's jobs read (Snakemake inputs: a changed file
    re-runs its part)."""
    root = inv["run_dir"]
    out: List[str] = []
    for u in part_units(inv, part):
        out.extend(os.path.join(root, f) for f in u["files"])
        out.extend(os.path.join(root, f) for f in u.get("sidecars", []))
        if u.get("manifest"):
            out.append(os.path.join(root, u["manifest"]))
    return out


def part_signature(inv: dict, part: str) -> str:
    """What a part holds (units and their files); a param, so a changed membership re-runs the part."""
    return json.dumps([[u["unit"], u["files"], u["sidecars"], u["manifest"]] for u in part_units(inv, part)],
                      sort_keys=True)


def write_config(doc_json: str, out: str) -> None:
    doc = json.loads(doc_json)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    os.replace(tmp, out)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 3 and argv[0] == "write-config":
        write_config(argv[1], argv[2])
        return 0
    print("usage: python -m ckptaudit.workflow_support write-config JSON OUT", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
