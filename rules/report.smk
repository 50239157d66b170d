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
        verify=get_verify_plan_arg,
        audit=AUDIT_ID if VERIFY_BUDGET else "",  # ages and "not verified since" change with every audit
    log:
        f"{LOGS}/report/report.log",
    resources:
        mem_mb=get_report_mem_mb,
        runtime=get_report_runtime,
    shell:
        "{params.python:q} -m ckptaudit.stages report --inventory {input.inventory:q} --config {input.config:q} "
        "--out-dir {params.out:q} --bench-dir {params.bench:q} --hash {input.hash:q} --scan {input.scan:q} "
        "--tensors {input.tensors:q} --imports {input.imports:q} --load {input.load:q} "
        "--structure {input.structure:q} --configdiff {input.configdiff:q} --state {input.state:q} "
        "{params.reuse} {params.verify} > {log:q} 2>&1"
