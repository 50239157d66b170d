# Hash: streamed SHA-256 of every file, checked against sidecars/manifests.


rule hash:
    conda:
        "envs/ckptaudit.yaml"
    input:
        get_part_files,
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
    shell:
        "{params.python} -m ckptaudit.stages hash --inventory {params.inventory} --part {wildcards.part} "
        "--out {output} > {log} 2>&1"
