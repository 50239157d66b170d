"""Work budgets of one walk: the opcode, memory, nesting and decoding limits that bound it.

The walk reads these from this module when it runs (the opcode loop binds the two it uses per opcode when
the walk starts), so a test that wants a smaller budget patches them here; the package face
(:mod:`ckptaudit.pickle_walk`) forwards reads and writes of these names to this module.
"""

from __future__ import annotations

_MAX_NESTED_DEPTH = 4
_MIN_ENCODED_CHARS = 24  # shortest str/bytes operand tried as base64/hex/compressed pickle
_MAX_DECODED_BYTES = 16 << 20  # per decoded blob (decompression bombs stop here)
_MAX_DECODE_BUDGET = 64 << 20  # decoded bytes per top-level walk, all blobs together
MAX_STREAMS = 64  # pickle streams walked back to back in one buffer
_MAX_TRICKS = 200
_MAX_KEY_NODES = 2000
# Work budget of one walk.  A torch.save state_dict costs about 30 opcodes and 7 retained objects per
# tensor (measured on a 40,000-tensor AdamW checkpoint: 1.19 M opcodes, 2.3 s), so MAX_OPS alone allows a
# pickle of ~160,000 tensors while keeping a hostile stream (a list appended to itself, millions of
# memoised empty lists) under ~400 MiB and ~15 s; a torch zip's data.pkl gets more with more records
# (ops_for), each record being a storage the file pays for in bytes.
MAX_OPS = 5_000_000
#: Opcodes one record of a torch zip may account for (a tensor's rebuild is ~30, above): the data.pkl of a zip
#: with more than MAX_OPS / OPS_PER_RECORD records gets a budget in proportion to them (:func:`ops_for`).
OPS_PER_RECORD = 40
MAX_WALK_BLOCKS = 4_000_000  # interpreter memory blocks the walk may hold (sys.getallocatedblocks)
MAX_IMPORT_SCAN_OPS = 20_000_000  # opcodes scanned for imports only, after the walk's budget ran out
_BLOCK_CHECK_EVERY = 8192
_CHECK_MASK = _BLOCK_CHECK_EVERY - 1


def ops_for(n_records: int) -> int:
    """The opcode budget for the ``data.pkl`` of a torch zip of ``n_records`` records: :data:`MAX_OPS`, or
    :data:`OPS_PER_RECORD` a record when that is more.  A real ``torch.save`` of 200,000 tensors has ~6,000,000
    opcodes and 200,006 records, and its walk needs ~1.5 µs an opcode (benchmarks/bench_walk.py); a hostile
    stream of padding has a handful of records and keeps :data:`MAX_OPS`.  Memory stays bounded by
    :data:`MAX_WALK_BLOCKS` either way."""
    return max(MAX_OPS, OPS_PER_RECORD * n_records)
