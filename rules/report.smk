# Report: join every part into tables/, verdict.json, units.parquet and a
# self-contained report.html.


rule report:
    conda:
        "envs/ckptaudit.yaml"
    input:
        inventory=f"{WORK}/inventory.json",
        config=f"{WORK}/config.json",
        hash=get_parts_of("hash"),
        scan=get_parts_of("scan"),
        tensors=get_parts_of("tensors"),
        imports=get_parts_of("imports"),
        load=get_parts_of("load"),
        structure=get_parts_of("structure"),
        configdiff=get_parts_of("configdiff"),
        state=get_parts_of("state"),
        load_server_done=f"{WORK}/load_server.done",
    output:
        verdict=f"{OUT}/verdict.json",
        html=f"{OUT}/report.html",
        units=f"{TABLES}/units.parquet",
    params:
        python=PYTHON,
        out=get_out_dir,
        bench=BENCH,
        version=VERSION,
        reuse="--reuse" if config["reuse"] else "",
    log:
        f"{LOGS}/report/report.log",
    resources:
        mem_mb=get_report_mem_mb,
        runtime=get_report_runtime,
    shell:
        "{params.python} -m ckptaudit.report --inventory {input.inventory} --config {input.config} "
        "--out-dir {params.out} --bench-dir {params.bench} --hash {input.hash} --scan {input.scan} "
        "--tensors {input.tensors} --imports {input.imports} --load {input.load} "
        "--structure {input.structure} --configdiff {input.configdiff} --state {input.state} "
        "{params.reuse} > {log} 2>&1"
