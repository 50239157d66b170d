"""Config defaults have one source, config/config.yaml: the schema's ``default:`` entries (which
snakemake.utils.validate fills from) mirror it exactly, and the code reads it instead of copying it."""

from __future__ import annotations

import yaml

from ckptaudit.config import CONFIG_PATH, SCHEMA_PATH, config_problems, defaults


def _schema_defaults(node, key=""):
    """(key path, default) of every schema property that declares one."""
    for k, prop in (node.get("properties") or {}).items():
        path = f"{key}.{k}" if key else k
        if "default" in prop:
            yield path, prop
        yield from _schema_defaults(prop, path)


def _get(cfg, path):
    for part in path.split("."):
        cfg = cfg[part]
    return cfg


def test_every_schema_default_is_the_config_yaml_value():
    schema = yaml.safe_load(SCHEMA_PATH.read_text())
    cfg = yaml.safe_load(CONFIG_PATH.read_text())
    seen = set()
    for path, prop in _schema_defaults(schema):
        if prop.get("type") == "object" and prop.get("properties"):
            assert prop["default"] == {}, path  # filled key by key from its properties' defaults
            continue
        assert prop["default"] == _get(cfg, path), path
        seen.add(path)
    leaves = {f"{k}.{kk}" if isinstance(v, dict) and v else k
              for k, v in cfg.items() for kk in (v if isinstance(v, dict) and v else [None])}
    assert seen == leaves


def test_every_config_yaml_key_is_in_the_schema_with_its_default():
    props = yaml.safe_load(SCHEMA_PATH.read_text())["properties"]
    cfg = yaml.safe_load(CONFIG_PATH.read_text())
    for k, v in cfg.items():
        assert k in props, k
        if isinstance(v, dict) and props[k].get("properties"):
            for kk, vv in v.items():
                assert props[k]["properties"][kk]["default"] == vv, f"{k}.{kk}"
        else:
            assert props[k]["default"] == v, k


def test_code_reads_the_defaults_from_config_yaml():
    from ckptaudit.drill.settings import DEFAULTS
    from ckptaudit.pipeline import STAGE_KEYS, default_config

    cfg = yaml.safe_load(CONFIG_PATH.read_text())
    assert defaults() == cfg
    assert default_config() == {k: cfg[k] for k in STAGE_KEYS}
    assert DEFAULTS == cfg["drill"]
    assert config_problems(cfg) == []


def test_unknown_key_names_the_allowed_keys_in_one_line():
    c = defaults()
    c["laod"] = {"enabled": False}
    assert config_problems(c) == [
        "laod: unknown key (did you mean 'load'?); allowed at the top level: run_dir, run_name, out_dir, "
        "units_per_job, reuse, verify_budget, expected_model_args, model_factory, reference, target, load, security, salvage, state, "
        "s3, demo, drill"]
    c = defaults()
    c["load"]["timout"] = 3
    c["load"]["timeout_seconds"] = "abc"
    assert config_problems(c) == [
        "load.timout: unknown key; allowed in load: enabled, timeout_seconds, memory_limit_mib, "
        "by_equivalence",
        "load.timeout_seconds: 'abc' is not of type 'number'"]
