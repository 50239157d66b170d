"""One streaming pass per audited file: a reader feeds every byte once to small consumers (SHA-256, CRC32, value stats).

The package, in import order: :mod:`.values` (NaN/Inf counts and sums of squares of one buffer),
:mod:`.consumers` (the objects fed the buffers), :mod:`.stream` (the reader: one bounded,
sequential pass per file, local or ``s3://``), :mod:`.plan` (what to feed whom: the zip
central directory, data.pkl's static walk, a safetensors header, read first with small reads),
:mod:`.facts` (the rows the hash stage writes, and their lookups for the scan and state stages).
"""
