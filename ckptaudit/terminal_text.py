"""Text from the run is data: every character that could steer a terminal or a log reader is shown, not sent.

A file name, tensor key, pickle global or loader message comes from the run, which may be hostile (issue 24:
a file name holding an OSC sequence set the terminal's title; one holding a newline printed a second,
forged ``ckptaudit: RESUME from …`` line).  :func:`shown` is applied to each line the audit writes to a
terminal or log — the summary (:mod:`ckptaudit.outputs.summary`), the progress line (:mod:`ckptaudit.cli.ticker`),
the failed-job lines (:mod:`ckptaudit.outputs.job_errors`), the command line's errors and the reader's log
records (:mod:`ckptaudit.safe_load`) — after the line is built and before it is joined to the next, so a
line break inside a name can never start a line of its own.

Escaped, visibly, as ``\\n``, ``\\r``, ``\\t``, ``\\xNN`` (below U+0100) or ``\\uNNNN``: C0 controls (ESC,
CR, LF, TAB, BEL, …), DEL, C1 controls (U+0080–U+009F: 8-bit CSI and OSC), the line and paragraph
separators U+2028/U+2029, and the Unicode bidirectional controls that reorder what is shown (U+061C,
U+200E, U+200F, U+202A–U+202E, U+2066–U+2069; the "Trojan Source" characters, CVE-2021-42574).
Everything else, letters of any script included, is left as it is.  The HTML report escapes through
Jinja2's autoescape instead.
"""

from __future__ import annotations

import re

_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029" + _BIDI + "]")


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: "re.Match[str]") -> str:
    ch = m.group(0)
    if ch in _NAMED:
        return _NAMED[ch]
    c = ord(ch)
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def shown(text: object) -> str:
    """``text`` as one line safe to print: every control, separator and bidi override escaped (``\\x1b``,
    ``\\n``, ``\\u202e``): ``shown("a\\nb") == "a\\\\nb"``."""
    return _UNSAFE.sub(_escape, str(text))


def shown_lines(lines) -> str:
    """The lines, each :func:`shown`, joined by newlines: the only line breaks are the caller's."""
    return "\n".join(shown(ln) for ln in lines)


__all__ = ["shown", "shown_lines"]
