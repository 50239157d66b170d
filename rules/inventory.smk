# Inventory: every unit, pointer and leftover of the run.  Re-runs when the
# folder's listing (names, sizes, mtimes) changes, so new checkpoints are
# picked up; per-part jobs re-run only when their own units change.


# Writes a small JSON from the config: not worth a cluster job.
localrules:
    stage_config,


rule stage_config:
    conda:
        "envs/ckptaudit.yaml"
    output:
        f"{WORK}/config.json",
    params:
        python=PYTHON,
        cfg=get_stage_config,
    log:
        f"{LOGS}/stage_config/stage_config.log",
    shell:
        "{params.python:q} -m ckptaudit.workflow.support write-config {params.cfg:q} {output:q} > {log:q} 2>&1"


checkpoint inventory:
    conda:
        "envs/ckptaudit.yaml"
    input:
        get_run_dir_input,
    output:
        parquet=f"{TABLES}/inventory.parquet",
        json=f"{WORK}/inventory.json",
        pointers=f"{WORK}/pointers.parquet",
    params:
        python=PYTHON,
        run_dir=RUN_DIR,
        listing=get_listing_fingerprint,
        units_per_job=config["units_per_job"],
        part_bytes=get_part_bytes,
        version=VERSION,
    log:
        f"{LOGS}/inventory/inventory.log",
    benchmark:
        f"{BENCH}/inventory/inventory.tsv"
    resources:
        mem_mb=get_inventory_mem_mb,
        runtime=get_inventory_runtime,
    shell:
        "{params.python:q} -m ckptaudit.stages inventory --run-dir {params.run_dir:q} "
        "--units-per-job {params.units_per_job} --part-bytes {params.part_bytes} --out {output.parquet:q} --out-json {output.json:q} "
        "--out-pointers {output.pointers:q} > {log:q} 2>&1"
