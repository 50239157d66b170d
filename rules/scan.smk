# Scan: file and security layers from bytes alone (zip/safetensors/legacy
# structure, CRCs, static pickle walk).  Nothing is unpickled.


rule scan:
    conda:
        "envs/ckptaudit.yaml"
    input:
        hash=f"{PARTS}/hash/{{part}}.parquet",
        facts=f"{WORK}/bytefacts/{{part}}.parquet",
        config=f"{WORK}/config.json",
        inventory_done=get_inventory_done,
    output:
        scan=f"{PARTS}/scan/{{part}}.parquet",
        tensors=f"{PARTS}/tensors/{{part}}.parquet",
        imports=f"{PARTS}/imports/{{part}}.parquet",
    params:
        python=PYTHON,
        inventory=f"{WORK}/inventory.json",
        units=get_part_units,
        version=VERSION,
    log:
        f"{LOGS}/scan/{{part}}.log",
    benchmark:
        f"{BENCH}/scan/{{part}}.tsv"
    threads: STAGE_THREADS
    resources:
        mem_mb=get_part_mem_mb("scan"),
        runtime=get_part_runtime("scan"),
    group:
        PART_GROUP
    shell:
        "{params.python:q} -m ckptaudit.stages scan --inventory {params.inventory:q} --part {wildcards.part} "
        "--config {input.config:q} --out {output.scan:q} --out-tensors {output.tensors:q} "
        "--out-imports {output.imports:q} --facts {input.facts:q} > {log:q} 2>&1"
