# State: components present and sound, counters, NaN/Inf counts (from the hash stage's one pass).
# It reads the scan's tables and the byte facts, so it runs beside the load test and configdiff.


rule state:
    conda:
        "envs/ckptaudit.yaml"
    input:
        scan=f"{PARTS}/scan/{{part}}.parquet",
        tensors=f"{PARTS}/tensors/{{part}}.parquet",
        facts=f"{WORK}/bytefacts/{{part}}.parquet",
        config=f"{WORK}/config.json",
        inventory_done=get_inventory_done,
    output:
        f"{PARTS}/state/{{part}}.parquet",
    params:
        python=PYTHON,
        inventory=f"{WORK}/inventory.json",
        units=get_part_units,
        version=VERSION,
    log:
        f"{LOGS}/state/{{part}}.log",
    benchmark:
        f"{BENCH}/state/{{part}}.tsv"
    threads: STAGE_THREADS
    resources:
        mem_mb=get_part_mem_mb("state"),
        runtime=get_part_runtime("state"),
    group:
        PART_GROUP
    shell:
        "{params.python:q} -m ckptaudit.stages state --inventory {params.inventory:q} --part {wildcards.part} "
        "--config {input.config:q} --scan {input.scan:q} --tensors {input.tensors:q} --facts {input.facts:q} --out {output:q} > {log:q} 2>&1"
