"""What the benchmark scripts share about their ``--db``: refuse, in one line and before any work, a database
without the measured tables their figures are about (scaleplan.db.measurements.require_tables)."""
from __future__ import annotations

import sys


def tables_db(url: str | None, profile: str = "p6-b200.48xlarge") -> str:
    """``url`` resolved, when it holds measured tables of ``profile``; else one line on stderr and exit status 2."""
    from scaleplan.db.measurements import require_tables
    from scaleplan.errors import ScaleplanError

    try:
        return require_tables(url, profile)
    except ScaleplanError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
