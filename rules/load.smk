# Load: torch.load(weights_only=True) in a forked child with a timeout and an
# address-space limit, only for units without file or security errors.  The
# only stage that needs torch: on one machine the audit's load server (ckptaudit/stages/load/server.py, started by
# onstart) has imported it once, and each load job's loads are forked from it.


rule load:
    conda:
        "envs/ckptaudit.yaml"
    input:
        scan=f"{PARTS}/scan/{{part}}.parquet",
        facts=f"{WORK}/bytefacts/{{part}}.parquet",
        config=f"{WORK}/config.json",
        inventory_done=get_inventory_done,
    output:
        f"{PARTS}/load/{{part}}.parquet",
    params:
        python=PYTHON,
        inventory=f"{WORK}/inventory.json",
        server=f"{WORK}/load_server.json",
        units=get_part_units,
        version=VERSION,
    log:
        f"{LOGS}/load/{{part}}.log",
    benchmark:
        f"{BENCH}/load/{{part}}.tsv"
    threads: STAGE_THREADS
    # the longest job after the scan (``import torch``): started first, while the cheaper stages share the rest
    priority: 10
    resources:
        mem_mb=get_part_mem_mb("load"),
        runtime=get_part_runtime("load"),
    group:
        PART_GROUP
    shell:
        "{params.python:q} -m ckptaudit.stages load --inventory {params.inventory:q} --part {wildcards.part} "
        "--config {input.config:q} --scan {input.scan:q} --facts {input.facts:q} "
        "--load-server {params.server:q} --out {output:q} > {log:q} 2>&1"


# The load server's work ends with the last load job: asked to exit then, it does not hold torch's ~230 MiB
# while structure, state and the report run (issue 22: the audit's summed memory).  No server, no error.
# A target of `audit` and an input of `drill`, not of the report: the report needs the load tables, not the
# server gone, so it starts as soon as they are written instead of one job start later (issue 45).
rule load_server_done:
    conda:
        "envs/ckptaudit.yaml"
    input:
        get_parts_of("load"),
    output:
        f"{WORK}/load_server.done",
    params:
        python=PYTHON,
        server=f"{WORK}/load_server.json",
    log:
        f"{LOGS}/load_server_done.log",
    localrule: True
    shell:
        "{params.python:q} -m ckptaudit.stages.load.server done {params.server:q} > {log:q} 2>&1 && touch {output:q}"
