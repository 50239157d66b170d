# Hash: one pass over every file (SHA-256 checked against sidecars/manifests, and the CRC32
# and value statistics the scan and state stages read from the bytefacts table).


rule hash:
    conda:
        "envs/ckptaudit.yaml"
    input:
        inventory_done=get_inventory_done,
    output:
        hash=f"{PARTS}/hash/{{part}}.parquet",
        facts=f"{WORK}/bytefacts/{{part}}.parquet",
    params:
        python=PYTHON,
        inventory=f"{WORK}/inventory.json",
        units=get_part_units,
        version=VERSION,
        verify=get_verify_plan_arg,
    log:
        f"{LOGS}/hash/{{part}}.log",
    benchmark:
        f"{BENCH}/hash/{{part}}.tsv"
    threads: get_hash_threads
    resources:
        mem_mb=get_part_mem_mb("hash"),
        runtime=get_part_runtime("hash"),
    group:
        PART_GROUP
    shell:
        "{params.python:q} -m ckptaudit.stages hash --inventory {params.inventory:q} --part {wildcards.part} "
        "--out {output.hash:q} --out-facts {output.facts:q} {params.verify} > {log:q} 2>&1"
