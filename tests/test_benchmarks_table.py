"""BENCHMARKS.md is a table a person reads: one row per target, its figure in one line."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ["target", "latest figure", "met", "command", "date"]


def _rows():
    lines = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8").splitlines()
    table = [line for line in lines if line.startswith("| ")]
    header = [c.strip() for c in table[0].strip().strip("|").split(" | ")]
    return header, [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in table[1:]]


def test_every_row_has_the_five_columns_and_a_short_figure():
    header, rows = _rows()
    assert header == COLUMNS
    assert len(rows) >= 20
    for row in rows:
        assert len(row) == len(COLUMNS), row[0]
        target, figure, met, command, date = row
        assert len(figure) <= 300, (target, len(figure))
        assert "`" in command or command.startswith("same"), (target, command)
        assert date[:4] == "2026", (target, date)


def test_every_row_keeps_its_full_text_in_the_history():
    _, rows = _rows()
    history = (ROOT / "docs" / "benchmarks-history.md").read_text(encoding="utf-8")
    for target, *_ in rows:
        assert f"### {target}\n" in history, target
