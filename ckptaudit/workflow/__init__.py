"""The Snakemake workflow's plumbing: the Snakefile's input functions and the output folder's lock."""
