"""Generate the security corpus: ``python -m tests.security_corpus.make --out DIR``.

Writes one run folder per sample x container, ``DIR/<sample>__<container>/``,
each with a ``truth.json`` that names the malicious unit and file, plus

* ``DIR/manifest.json``: the samples (id, family, protocol, source, notes),
  the containers, and every run;
* ``DIR/_samples/<id>.pkl``: each sample's bare bytes, for reading with
  ``python -m pickletools`` (never with ``pickle``).

Deterministic (same bytes on every call with the same torch/transformers) and
fast: a few seconds, most of it importing torch and building one
``TrainingArguments``.  Nothing is ever unpickled.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Iterable, Optional

from . import containers as C
from .samples import CONTROLS, SAMPLES, Sample


def generate(out, *, sample_ids: Optional[Iterable[str]] = None, container_names: Optional[Iterable[str]] = None,
             controls: bool = True, zip_tricks: bool = True, real_training_args: bool = True) -> dict:
    """Write the corpus under ``out`` (created; must be empty or absent); return the manifest."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty")
    out.mkdir(parents=True, exist_ok=True)
    wanted = set(sample_ids) if sample_ids is not None else None
    chosen = [s for s in SAMPLES + (CONTROLS if controls else []) if wanted is None or s.id in wanted]
    conts = tuple(container_names) if container_names is not None else C.CONTAINERS
    t = C.Templates(real_training_args=real_training_args)
    runs = []
    try:
        (out / "_samples").mkdir()
        for s in chosen:
            (out / "_samples" / f"{s.id}.pkl").write_bytes(s.bytes())
        for s, cont in C.runs_for(chosen, [c for c in conts if c in C.CONTAINERS],
                                  zip_tricks=zip_tricks and (container_names is None
                                                             or any(c in C.ZIP_TRICKS for c in conts))):
            if container_names is not None and cont not in conts:
                continue
            name = C.run_name(s.id, cont)
            truth = C.build_run(t, s, cont, out / name)
            runs.append({"run": name, **{k: truth[k] for k in ("sample", "container", "unit", "file", "malicious")}})
        manifest = {
            "schema": "ckptaudit.security-corpus/1",
            "samples": [s.row() for s in chosen if s.family != "control"],
            "controls": [s.row() for s in chosen if s.family == "control"],
            "containers": {c: C.DESCRIPTIONS[c] for c in C.ALL_CONTAINERS if any(r["container"] == c for r in runs)},
            "training_args": t.training_args_kind,
            "runs": runs,
        }
    finally:
        t.close()
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def sample_table(samples: Iterable[Sample] = SAMPLES) -> str:
    """The sample list as a Markdown table (id, family, protocol, source)."""
    lines = ["| id | family | protocol | source |", "| --- | --- | --- | --- |"]
    lines += [f"| {s.id} | {s.family} | {s.protocol} | {s.source} |" for s in samples]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.security_corpus.make", description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="folder to create (must be empty or absent)")
    ap.add_argument("--force", action="store_true", help="delete --out first")
    ap.add_argument("--sample", action="append", help="only these sample ids (repeatable)")
    ap.add_argument("--container", action="append", choices=C.ALL_CONTAINERS, help="only these containers")
    ap.add_argument("--no-controls", action="store_true")
    ap.add_argument("--no-zip-tricks", action="store_true")
    ap.add_argument("--no-transformers", action="store_true",
                    help="write a dict stand-in for the clean training_args.bin instead of a real TrainingArguments")
    ap.add_argument("--table", action="store_true", help="print the sample table (Markdown) and exit")
    a = ap.parse_args(argv)
    if a.table:
        print(sample_table())
        return 0
    if not a.out:
        ap.error("--out is required")
    out = Path(a.out)
    if a.force and out.exists():
        shutil.rmtree(out)
    t0 = time.perf_counter()
    m = generate(out, sample_ids=a.sample, container_names=a.container, controls=not a.no_controls,
                 zip_tricks=not a.no_zip_tricks, real_training_args=not a.no_transformers)
    dt = time.perf_counter() - t0
    print(f"{len(m['samples'])} samples + {len(m['controls'])} controls, {len(m['runs'])} run folders "
          f"in {out} ({dt:.1f} s; training_args: {m['training_args']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
