"""The results history: gate reports in SQLite, regressions by separated 95% intervals, plots (issue 16 item 4).

reader (one untrusted report -> a Record), store (the SQLite schema, migrations, idempotent ingest), compare
(runs and lock versions of a series, verdicts, pins changed), render (tables, PNGs, one self-contained HTML page),
command (`reprostack history`), bumpview (the comparison table of a bump PR body).
"""
