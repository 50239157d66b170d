# The bundled demo run: a real tiny GPT trained on CPU, with a real crash
# (SIGKILL during torch.save) and one silently flipped byte.


rule demo:
    conda:
        "envs/ckptaudit.yaml"
    output:
        directory(DEMO_DIR),
    params:
        python=PYTHON,
        max_steps=config["demo"]["max_steps"],
        save_every=config["demo"]["save_every"],
        seed=config["demo"]["seed"],
    log:
        f"{LOGS}/demo/demo.log",
    benchmark:
        f"{BENCH}/demo/demo.tsv"
    shell:
        "{params.python:q} -m ckptaudit.demo {output:q} --max-steps {params.max_steps} "
        "--save-every {params.save_every} --seed {params.seed} > {log:q} 2>&1"
