# Restore drill (issue #7): restore the audit's rollback point (or drill.unit) in
# a fresh child process through drill.hook, continue drill.steps updates and
# compare with what the run recorded.  Not part of the default `audit` target:
#   snakemake --cores 8 drill                                    # {OUT}/drill/drill.html
#   snakemake --profile config/profiles/nightly drill_nightly    # + {OUT}/drill/nightly/<date>/
# The job exits 0 once its outputs are written: a failing drill is data
# (drill.json's exit_code), not a failed job.  ckptaudit.drill imports no torch.
from ckptaudit import drill as dr

DRILL = f"{OUT}/drill"
DRILL_DATE = dr.report_date(config)  # drill.report_date, or today (UTC)


wildcard_constraints:
    date=r"\d{4}-\d{2}-\d{2}",


rule drill:
    conda:
        "envs/ckptaudit.yaml"
    input:
        verdict=f"{OUT}/verdict.json",
        load_server_done=f"{WORK}/load_server.done",  # the drill's loads do not share memory with the server's torch
    output:
        parquet=f"{DRILL}/drill.parquet",
        json=f"{DRILL}/drill.json",
        html=f"{DRILL}/drill.html",
    params:
        python=PYTHON,
        cfg=dr.rule_config_json(config),
        version=VERSION,
    log:
        f"{LOGS}/drill/drill.log",
    benchmark:
        f"{BENCH}/drill/drill.tsv"
    resources:
        mem_mb=dr.rule_mem_mb(config),
        runtime=dr.rule_runtime_minutes(config),
    shell:
        "{params.python:q} -m ckptaudit.drill run --verdict {input.verdict:q} --config-json {params.cfg:q} "
        "--out-parquet {output.parquet:q} --exit-zero > {log:q} 2>&1"


rule drill_dated:
    conda:
        "envs/ckptaudit.yaml"
    input:
        drill_json=f"{DRILL}/drill.json",
        reports=[f"{DRILL}/drill.html", f"{DRILL}/drill.parquet", f"{OUT}/verdict.json", f"{OUT}/report.html"],
    output:
        summary=f"{DRILL}/nightly/{{date}}/summary.txt",
        drill_json=f"{DRILL}/nightly/{{date}}/drill.json",
        drill_html=f"{DRILL}/nightly/{{date}}/drill.html",
        drill_parquet=f"{DRILL}/nightly/{{date}}/drill.parquet",
        verdict=f"{DRILL}/nightly/{{date}}/verdict.json",
        report=f"{DRILL}/nightly/{{date}}/report.html",
    params:
        python=PYTHON,
    log:
        f"{LOGS}/drill_dated/{{date}}.log",
    benchmark:
        f"{BENCH}/drill_dated/{{date}}.tsv"
    shell:
        "{params.python:q} -m ckptaudit.drill dated --date {wildcards.date} --summary {output.summary:q} "
        "--drill-json {input.drill_json:q} {input.drill_json:q} {input.reports:q} > {log:q} 2>&1"


rule drill_nightly:
    input:
        f"{DRILL}/nightly/{DRILL_DATE}/summary.txt",
