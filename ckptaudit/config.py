"""Audit config: the defaults of config/config.yaml, the user's --config file over them, and the schema check.

:func:`check_config` is the one config check of every entry point (the
command line, ``rules/common.smk`` under ``snakemake --config``, and
:func:`ckptaudit.pipeline.audit_in_process`): ``config/schema.yaml`` (types and
bounds) plus finiteness, which JSON Schema cannot say (NaN compares false with
every bound).  Defaults live in ``config/config.yaml`` only (:func:`defaults`);
they are read from the repository checkout, as the schema is (an editable
install).  Importing this module is cheap: yaml, jsonschema and click are
imported by the functions that need them.
"""

from __future__ import annotations

import copy
import functools
import json
import math
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

_REPO = Path(__file__).resolve().parent.parent
SCHEMA_PATH = _REPO / "config" / "schema.yaml"
CONFIG_PATH = _REPO / "config" / "config.yaml"

@functools.lru_cache(maxsize=1)
def _parsed_defaults() -> Dict[str, Any]:
    import yaml

    return yaml.safe_load(CONFIG_PATH.read_text())


def defaults() -> Dict[str, Any]:
    """A fresh copy of ``config/config.yaml`` (read once per process): every key with its default."""
    return copy.deepcopy(_parsed_defaults())


def check_config(cfg: dict, schema_path: str | Path | None = None) -> None:
    """Raise ``ValueError`` naming the key and the bound when ``cfg`` breaks the schema.

    ``cfg`` may be partial (keys missing from it are not checked); every number in it
    must be finite (``.inf``/``.nan`` are refused anywhere, also under
    ``expected_model_args``) and within ``config/schema.yaml``'s bounds, e.g.
    ``load.timeout_seconds: nan is not finite`` or
    ``load.memory_limit_mib: 10000000000000.0 is greater than the maximum of 1048576``.
    Only the first problem in key order is raised (one line).
    """
    problems = config_problems(cfg, schema_path)
    if problems:
        raise ValueError(f"invalid config: {problems[0]}")


def typed_cli_values(cfg: dict, schema_path: str | Path | None = None) -> dict:
    """``cfg`` with each string the schema wants as a number, integer or boolean read as one.

    ``snakemake --config 'load={timeout_seconds: 300}'`` is how Snakemake sets a nested key, and it reads the
    mapping with YAML's BaseLoader (``snakemake/cli.py`` ``parse_config``), so every value in it arrives as a
    string (``'300'``), which the schema refuses (``'300' is not of type 'number'``).  A string is read as
    ``int``, ``float`` or ``True``/``False`` (Snakemake's own order for a top-level value) only where the
    schema's type at that key has no ``string``; anything else is left for :func:`check_config` to judge.
    Returns a new dict; ``cfg`` is not changed."""
    path = Path(schema_path) if schema_path else SCHEMA_PATH
    if not path.is_file():
        return copy.deepcopy(cfg)
    return _typed(copy.deepcopy(cfg), _schema(str(path), path.stat().st_mtime_ns))


def _typed(value: Any, node: dict) -> Any:
    if isinstance(value, dict):
        props = node.get("properties") or {}
        return {k: (_typed(v, props[k]) if k in props else v) for k, v in value.items()}
    if not isinstance(value, str):
        return value
    types = node.get("type")
    types = {types} if isinstance(types, str) else set(types or ())
    types |= {t for alt in node.get("oneOf", ()) for t in ([alt.get("type")] if isinstance(alt.get("type"), str)
                                                           else alt.get("type") or ())}
    if not types or "string" in types:
        return value
    if "boolean" in types and value in ("True", "true", "False", "false"):
        return value in ("True", "true")
    for kind, read in (("integer", int), ("number", int), ("number", float)):
        if kind in types:
            try:
                return read(value)
            except ValueError:
                pass
    return value


def dotted_key_form(entry: str) -> str:
    """For a ``--config`` entry ``KEY=VALUE`` whose key has dots (``load.timeout_seconds=300``), the form that
    sets it: ``load={timeout_seconds: 300}``; "" for any other entry.  Snakemake's parser refuses a dotted key
    ("Config entry must start with a valid identifier") before the workflow is read."""
    key, eq, value = entry.partition("=")
    parts = key.strip().split(".")
    if not eq or len(parts) < 2 or not all(p.strip() for p in parts):
        return ""
    inner = value.strip() or "null"
    for p in reversed(parts[1:]):
        inner = "{" + f"{p}: {inner}" + "}"
    return f"{parts[0]}={inner}"


@functools.lru_cache(maxsize=4)
def _schema(path: str, mtime_ns: int) -> dict:
    """The parsed schema at ``path`` (~0.1 s of YAML), once per process and version of the file."""
    import yaml

    return yaml.safe_load(Path(path).read_text())


def config_problems(cfg: dict, schema_path: str | Path | None = None) -> List[str]:
    """Every ``"key.path: what is wrong"`` of ``cfg`` (empty when it is valid), sorted by key."""
    import jsonschema

    out = [f"{key}: {value!r} is not finite (NaN and infinities are refused)"
           for key, value in non_finite(cfg, "")]
    if out:
        return out
    path = Path(schema_path) if schema_path else SCHEMA_PATH
    if not path.is_file():  # an install without the workflow files: finiteness is all we can check
        return []
    validator = jsonschema.Draft202012Validator(_schema(str(path), path.stat().st_mtime_ns))
    for e in sorted(validator.iter_errors(cfg), key=lambda e: [str(p) for p in e.absolute_path]):
        key = ".".join(str(p) for p in e.absolute_path) or "(top level)"
        if e.validator == "additionalProperties":
            out.extend(_unknown_keys(e, key))
            continue
        msg = " ".join(e.message.split())  # one line, whatever the offending value holds
        out.append(f"{key}: {msg[:300] + '…' if len(msg) > 300 else msg}")
    return out


def _unknown_keys(e, key: str) -> List[str]:
    """``laod: unknown key (did you mean 'load'?); allowed: run_dir, …`` for each key the schema does not have."""
    import difflib

    allowed = list((e.schema.get("properties") or {}).keys())
    where = "" if key == "(top level)" else key + "."
    out = []
    for k in sorted(set(e.instance) - set(allowed), key=str):
        near = difflib.get_close_matches(str(k), allowed, n=1)
        out.append(f"{where}{k}: unknown key{f' (did you mean {near[0]!r}?)' if near else ''}; allowed "
                   f"{'at the top level' if not where else 'in ' + key}: {', '.join(allowed)}")
    return out


def non_finite(v, key: str) -> Iterator[Tuple[str, float]]:
    """``(key path, value)`` of every NaN or infinite float in the config value ``v`` (nested dicts and lists)."""
    if isinstance(v, float) and not math.isfinite(v):
        yield key or "(top level)", v
    elif isinstance(v, dict):
        for k, x in v.items():
            yield from non_finite(x, f"{key}.{k}" if key else str(k))
    elif isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            yield from non_finite(x, f"{key}[{i}]")



def workflow_dir() -> Path:
    """The folder holding the Snakefile (the repository root of an editable install).

    Raises :class:`click.ClickException` when the package is installed without it."""
    import click

    here = _REPO
    if (here / "Snakefile").exists():
        return here
    raise click.ClickException(
        f"cannot find the ckptaudit Snakefile next to the package ({here}); install ckptaudit from its "
        "repository with `pip install -e .`")


CONFIG_MAX_BYTES = 1 << 20  # a config file is a few KiB; anything larger is not one


def read_config_file(path: str, max_bytes: int = CONFIG_MAX_BYTES) -> str:
    """The text of the ``--config`` file, read without blocking and with a size cap.

    Opened with ``O_NONBLOCK`` and checked to be a regular file before any read, so a
    FIFO, ``/dev/zero`` or a socket is refused at once instead of hanging or filling
    memory; a file over ``max_bytes`` (1 MiB) is refused unread.  Raises
    :class:`click.ClickException` with a one-line reason.
    """
    import os
    import stat

    import click

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise click.ClickException(f"--config {path}: cannot open: {e.strerror}")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            what = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode)
                    or stat.S_ISBLK(st.st_mode) else "a folder" if stat.S_ISDIR(st.st_mode)
                    else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
            raise click.ClickException(f"--config {path}: is {what}; expected a regular YAML/JSON file")
        if st.st_size > max_bytes:
            raise click.ClickException(
                f"--config {path}: {st.st_size} bytes, more than the {max_bytes} bytes a config file may have")
        with os.fdopen(fd, "rb", closefd=True) as f:
            fd = -1
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise click.ClickException(f"--config {path}: cannot read: {e.strerror}")
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > max_bytes:  # grew while being read
        raise click.ClickException(f"--config {path}: more than the {max_bytes} bytes a config file may have")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise click.ClickException(f"--config {path}: not UTF-8 text ({e.reason} at byte {e.start})")


def load_user_config(path: str | None) -> dict:
    """A YAML or JSON file with keys of config/config.yaml over :func:`defaults`, checked by
    :func:`check_config` (config/schema.yaml's types and bounds, and finiteness).  Raises
    :class:`click.ClickException` with a one-line reason."""
    import click
    import yaml

    workflow_dir()  # refuses an install without the workflow files, with its reason
    base = defaults()
    if path is not None:
        form = dotted_key_form(path) if not Path(path).exists() else ""
        if form or ("=" in path and not Path(path).exists()):
            key, _, value = (form or path).partition("=")
            raise click.ClickException(
                f"--config {path}: ckptaudit audit's --config takes a YAML/JSON file; write `{key}: {value}` in it "
                f"(with snakemake: --config '{form or path}')")
        text = read_config_file(path)
        try:
            # JSON first: YAML 1.1 reads a JSON number such as 1e13 as the string "1e13"
            user = json_or_none(text)
            if user is None:
                user = yaml.safe_load(text) or {}
        except yaml.YAMLError as e:
            raise click.ClickException(f"--config {path}: not YAML: {' '.join(str(e).split())[:300]}")
        except RecursionError:
            raise click.ClickException(f"--config {path}: nested too deeply")
        if not isinstance(user, dict):
            raise click.ClickException(f"--config {path}: expected a mapping of config keys")
        base = merge_config(base, user)
    try:
        check_config(base, workflow_dir() / "config" / "schema.yaml")
    except ValueError as e:
        raise click.ClickException(f"{'--config ' + path + ': ' if path else ''}{e}")
    return base


def json_or_none(text: str):
    """``text`` parsed as JSON when it is a JSON object, else None (then it is read as YAML)."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None  # YAML flow mappings start with "{" too


def merge_config(a: dict, b: dict) -> dict:
    """``b`` over ``a``, mappings merged key by key."""
    out = dict(a)
    for k, v in b.items():
        out[k] = merge_config(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out

