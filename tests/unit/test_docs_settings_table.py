"""docs/configuration.md holds one table of every setting; it must match config.SETTINGS exactly."""

from __future__ import annotations

from pathlib import Path

from llmman.config.settings import SETTINGS

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
HEADER = ["Key", "Variable", "Ollama fallback", "Default", "Meaning"]
NONE_MARKS = {"", "—", "-", "none"}


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _unquote(cell: str) -> str:
    cell = cell.strip()
    if len(cell) >= 2 and cell[0] == cell[-1] == "`":
        cell = cell[1:-1]
    return "" if cell == '""' else cell


def _settings_table() -> list[list[str]]:
    """Rows of the one table whose header is HEADER (a header line, a separator, then body lines)."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    tables = [i for i, line in enumerate(lines) if line.startswith("|") and _cells(line) == HEADER]
    assert len(tables) == 1, f"expected exactly one settings table in {DOC}, found {len(tables)}"
    start = tables[0] + 2
    assert set(lines[start - 1].replace("|", "").strip()) <= set("-: "), "missing separator line"
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = _cells(line)
        assert len(cells) == len(HEADER), f"bad row: {line}"
        rows.append(cells)
    return rows


def test_docs_table_lists_exactly_the_settings() -> None:
    rows = _settings_table()
    documented = [_unquote(row[0]) for row in rows]
    assert documented == [spec.key for spec in SETTINGS]


def test_docs_table_matches_env_names_and_defaults() -> None:
    for row, spec in zip(_settings_table(), SETTINGS, strict=True):
        _key, variable, fallback, default, meaning = row
        assert _unquote(variable) == (spec.env or ""), spec.key
        expected_fallback = spec.ollama_env or ""
        actual_fallback = _unquote(fallback)
        assert (
            actual_fallback in NONE_MARKS and not expected_fallback
        ) or actual_fallback == expected_fallback, spec.key
        assert _unquote(default) == spec.default, spec.key
        assert meaning, f"{spec.key} has no meaning documented"


def test_every_setting_has_a_doc_line() -> None:
    for spec in SETTINGS:
        assert spec.doc.strip(), spec.key
        assert spec.key.count(".") == 1, spec.key
