# Config/environment diff: saved model args and versions vs the target.  It reads what the scan
# found (no tensor data, nothing unpickled), so it runs beside the load test, not after it.


rule configdiff:
    conda:
        "envs/ckptaudit.yaml"
    input:
        scan=f"{PARTS}/scan/{{part}}.parquet",
        config=f"{WORK}/config.json",
        inventory_done=get_inventory_done,
    output:
        f"{PARTS}/configdiff/{{part}}.parquet",
    params:
        python=PYTHON,
        inventory=f"{WORK}/inventory.json",
        units=get_part_units,
        version=VERSION,
    log:
        f"{LOGS}/configdiff/{{part}}.log",
    benchmark:
        f"{BENCH}/configdiff/{{part}}.tsv"
    threads: STAGE_THREADS
    resources:
        mem_mb=get_part_mem_mb("configdiff"),
        runtime=get_part_runtime("configdiff"),
    group:
        PART_GROUP
    shell:
        "{params.python:q} -m ckptaudit.stages configdiff --inventory {params.inventory:q} --part {wildcards.part} "
        "--config {input.config:q} --scan {input.scan:q} --out {output:q} > {log:q} 2>&1"
