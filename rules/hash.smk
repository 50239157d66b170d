# Hash: streamed SHA-256 of every file, checked against sidecars/manifests.


rule hash:
    conda:
        "envs/ckptaudit.yaml"
    input:
        inventory_done=get_inventory_done,
    output:
        f"{PARTS}/hash/{{part}}.parquet",
    params:
        python=PYTHON,
        inventory=f"{WORK}/inventory.json",
        units=get_part_units,
        version=VERSION,
    log:
        f"{LOGS}/hash/{{part}}.log",
    benchmark:
        f"{BENCH}/hash/{{part}}.tsv"
    threads: STAGE_THREADS
    resources:
        mem_mb=get_part_mem_mb("hash"),
        runtime=get_part_runtime("hash"),
    group:
        PART_GROUP
    shell:
        "{params.python} -m ckptaudit.stages hash --inventory {params.inventory} --part {wildcards.part} "
        "--out {output} > {log} 2>&1"
