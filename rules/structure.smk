# Structure: keys, shapes, prefixes, tied weights, optimizer vs parameters,
# parallel layout vs the job that will resume.


# Writes the target's JSON from the config: not worth a cluster job.
localrules:
    target,


rule target:
    conda:
        "envs/ckptaudit.yaml"
    input:
        config=f"{WORK}/config.json",
    output:
        f"{WORK}/target.json",
    params:
        python=PYTHON,
        version=VERSION,
    log:
        f"{LOGS}/target/target.log",
    benchmark:
        f"{BENCH}/target/target.tsv"
    shell:
        "{params.python:q} -m ckptaudit.stages target write {input.config:q} {output:q} > {log:q} 2>&1"


rule structure:
    conda:
        "envs/ckptaudit.yaml"
    input:
        scan=f"{PARTS}/scan/{{part}}.parquet",
        tensors=f"{PARTS}/tensors/{{part}}.parquet",
        config=f"{WORK}/config.json",
        target=f"{WORK}/target.json",
        inventory_done=get_inventory_done,
    output:
        f"{PARTS}/structure/{{part}}.parquet",
    params:
        python=PYTHON,
        inventory=f"{WORK}/inventory.json",
        units=get_part_units,
        version=VERSION,
    log:
        f"{LOGS}/structure/{{part}}.log",
    benchmark:
        f"{BENCH}/structure/{{part}}.tsv"
    threads: STAGE_THREADS
    resources:
        mem_mb=get_part_mem_mb("structure"),
        runtime=get_part_runtime("structure"),
    group:
        PART_GROUP
    shell:
        "{params.python:q} -m ckptaudit.stages structure --inventory {params.inventory:q} --part {wildcards.part} "
        "--config {input.config:q} --scan {input.scan:q} --tensors {input.tensors:q} --target {input.target:q} --out {output:q} > {log:q} 2>&1"
