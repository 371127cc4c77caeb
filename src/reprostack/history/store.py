"""The results history: every gate report ingested into one SQLite database (stdlib sqlite3).

Tables (schema version SCHEMA_VERSION, kept in `PRAGMA user_version` and one `schema_version` row per applied
migration):
- reports(id = sha256 of the report file, path, gate, profile, result, stack, lock_sha256, image_digest,
  host_fp, host, date): one row per report file content;
- pins(report_id, name, rev): the pin revs the report's provenance records;
- measurements(report_id, metric, unit, n, mean, p50, stdev, lo, hi, method, samples (JSON list), better).

Invariants:
- ingest is idempotent: a report whose sha256 is already stored adds nothing; each report goes in whole or not
  at all: `ingest_many` stores a batch of reports in one transaction (the ids already there, looked up inside
  it, are left out), so 10,000 reports cost a few transactions, not 10,000 fsyncs;
- the file's integrity is checked before it is used (`PRAGMA quick_check`, on a read-only connection): a damaged
  SQLite file or one that is not SQLite is one HistoryError line and is never written to;
- a stored row is as untrusted as a report (a database of an older version, or edited by hand): `points` and
  `pins` skip a row of the wrong type, with non-finite numbers or with statistics that contradict themselves
  (reader.inconsistency) and note it in `skipped_rows` (one line naming the row); nothing read from the file
  raises past them;
- SQL takes values only as parameters, never formatted into the text;
- a database of a newer schema than this code knows is refused with one line, before anything is written; an
  older one is migrated step by step (MIGRATIONS[v] takes version v to v + 1, each step one transaction); a file
  that is not SQLite, or a SQLite file that is not a history (tables but user_version 0, or any trigger or view:
  the migrations make neither), is refused;
- the default database lives outside git: `<cache dir>/history/history.sqlite3` (reprostack.paths.cache_dir).
"""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from .. import paths
from ..errors import ReprostackError
from .reader import MAX_SAMPLES, Measurement, Record, clean, inconsistency

SCHEMA_VERSION = 1

# MIGRATIONS[v]: the statements that take a database at version v to v + 1 (v = 0: an empty file).
MIGRATIONS: list[tuple[str, ...]] = [
    (
        "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, note TEXT NOT NULL)",
        "CREATE TABLE reports (id TEXT PRIMARY KEY, path TEXT NOT NULL, gate TEXT NOT NULL, profile TEXT NOT NULL, "
        "result TEXT NOT NULL, stack TEXT NOT NULL, lock_sha256 TEXT NOT NULL, image_digest TEXT NOT NULL, "
        "host_fp TEXT NOT NULL, host TEXT NOT NULL, date TEXT NOT NULL)",
        "CREATE TABLE pins (report_id TEXT NOT NULL REFERENCES reports(id), name TEXT NOT NULL, rev TEXT NOT NULL, "
        "PRIMARY KEY (report_id, name))",
        "CREATE TABLE measurements (report_id TEXT NOT NULL REFERENCES reports(id), metric TEXT NOT NULL, "
        "unit TEXT NOT NULL, n INTEGER NOT NULL, mean REAL NOT NULL, p50 REAL, stdev REAL, lo REAL, hi REAL, "
        "method TEXT, samples TEXT NOT NULL, better TEXT, PRIMARY KEY (report_id, metric))",
        "CREATE INDEX reports_key ON reports (gate, profile, stack, date)",
    ),
]


class HistoryError(ReprostackError):
    """The history database cannot be used: `DB: why`."""


def default_db() -> Path:
    """`<cache dir>/history/history.sqlite3` (outside git)."""
    return paths.cache_dir() / "history" / "history.sqlite3"


@dataclass(frozen=True)
class Point:
    """One measurement of one report, with the report's keys."""

    report_id: str
    path: str
    gate: str
    profile: str
    result: str
    stack: str
    lock_sha256: str
    image_digest: str
    host_fp: str
    host: str
    date: str
    m: Measurement

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.gate, self.profile, self.stack, self.m.metric)


def db_error(where: str, e: sqlite3.Error, *, left: str = "") -> HistoryError:
    """One line for an SQLite error on the database at `where`: locked by another process, read-only, or not a
    history database (each says what to do)."""
    text = str(e)
    if "locked" in text:
        return HistoryError(
            f"{where}: locked by another process (SQLite: {text}); run again once it has finished, or use another --db"
        )
    if "readonly" in text or "read-only" in text:
        return HistoryError(f"{where}: read-only (SQLite: {text}); make it writable, or use another --db")
    return HistoryError(f"{where}: not a history database ({text}){left}")


def _quick_check(conn: sqlite3.Connection, where: str) -> None:
    """PRAGMA quick_check of an open connection: HistoryError naming the first problem it reports."""
    rows = conn.execute("PRAGMA quick_check(5)").fetchall()
    if rows != [("ok",)]:
        first = " ".join("; ".join(str(r[0]) for r in rows[:2]).split())[:200]  # one line
        raise HistoryError(
            f"{where}: a damaged SQLite file (PRAGMA quick_check: {first}); left as it is: move it away, or use "
            f"another --db"
        )


class Store:
    """An open history database (use as a context manager, or call close())."""

    def __init__(self, conn: sqlite3.Connection, where: str):
        self.conn, self.where = conn, where
        self.skipped_rows: list[str] = []  # one line per stored row points()/pins() passed over

    # ---- opening and migrating
    @classmethod
    def check_file(cls, path: Path) -> None:
        """Refuse, before anything can write to it, a file that is not a history this code can use: read-only
        connection, PRAGMA quick_check, then the schema checks (check_version)."""
        try:
            ro = sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True)
        except sqlite3.Error as e:
            raise HistoryError(f"{path}: cannot open the history database: {e}") from None
        try:
            _quick_check(ro, str(path))
            cls(ro, str(path)).check_version()
        except sqlite3.DatabaseError as e:
            raise db_error(str(path), e, left="; left as it is") from None
        finally:
            ro.close()

    @classmethod
    def open(cls, path: Path | str) -> Store:
        """Open (creating or migrating) the database at `path`, or ":memory:"."""
        where = str(path)
        if where != ":memory:":
            p = Path(path)
            if p.exists() and not p.is_file():
                raise HistoryError(f"{p}: not a regular file (expected a history database)")
            if p.exists() and p.stat().st_size > 0:
                cls.check_file(p)
            p.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = sqlite3.connect(where, isolation_level=None)
        except sqlite3.Error as e:
            raise HistoryError(f"{where}: cannot open the history database: {e}") from None
        store = cls(conn, where)
        try:
            store._migrate()
        except sqlite3.DatabaseError as e:
            conn.close()
            raise db_error(where, e) from None
        except BaseException:
            conn.close()
            raise
        return store

    @classmethod
    def copy_of(cls, path: Path) -> Store:
        """An in-memory copy of the database at `path` (checked like open(), the file is never written)."""
        try:
            src = sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True)
        except sqlite3.Error as e:
            raise HistoryError(f"{path}: cannot open the history database: {e}") from None
        try:
            _quick_check(src, str(path))
            cls(src, str(path)).check_version()
            mem = sqlite3.connect(":memory:", isolation_level=None)
            src.backup(mem)
        except sqlite3.DatabaseError as e:
            raise db_error(str(path), e) from None
        finally:
            src.close()
        store = cls(mem, str(path))
        store._migrate()
        return store

    def version(self) -> int:
        return int(self.conn.execute("PRAGMA user_version").fetchone()[0])

    def check_version(self) -> int:
        """The database's schema version; refuses a newer one, and a SQLite file that is not a history."""
        v = self.version()
        if v > SCHEMA_VERSION:
            raise HistoryError(
                f"{self.where}: history schema version {v} is newer than this reprostack reads "
                f"({SCHEMA_VERSION}): use a newer reprostack, or another --db"
            )
        if v == 0:
            tables = [r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            if tables:
                raise HistoryError(
                    f"{self.where}: a SQLite database with tables ({', '.join(tables[:5])}) but no "
                    f"history schema version: not a reprostack history; use another --db"
                )
        # the migrations make tables and indexes only: a trigger (it could rewrite or add measurements as reports
        # go in) or a view in the file was put there by someone else
        foreign = [
            f"{r[0]} {r[1]}"
            for r in self.conn.execute(
                "SELECT type, name FROM sqlite_master WHERE type NOT IN ('table', 'index') ORDER BY name"
            )
        ]
        if foreign:
            raise HistoryError(
                f"{self.where}: holds {', '.join(foreign[:5])[:200]}, which no reprostack history "
                f"has: not used; use another --db"
            )
        return v

    def _migrate(self) -> None:
        v = self.check_version()
        for step in range(v, len(MIGRATIONS)):
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                for sql in MIGRATIONS[step]:
                    self.conn.execute(sql)
                self.conn.execute(
                    "INSERT INTO schema_version (version, note) VALUES (?, ?)", (step + 1, f"migrated from {step}")
                )
                self.conn.execute(f"PRAGMA user_version = {int(step + 1)}")  # a PRAGMA takes no parameter
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- ingest
    def has(self, report_id: str) -> bool:
        return self.conn.execute("SELECT 1 FROM reports WHERE id = ?", (report_id,)).fetchone() is not None

    def ids(self) -> set[str]:
        """The ids (sha256) of every stored report."""
        return {r[0] for r in self.conn.execute("SELECT id FROM reports")}

    def ingest(self, r: Record) -> bool:
        """Store one report; False when a report of the same sha256 is already stored (nothing added)."""
        return self.ingest_many([r]) == 1

    def ingest_many(self, records: list[Record]) -> int:
        """Store `records` in one transaction (see the module doc); returns how many were new. A database another
        process holds locked, or one that is read-only, is a HistoryError (one line), never a traceback."""
        try:
            return self._ingest_many(records)
        except sqlite3.OperationalError as e:
            raise db_error(self.where, e) from None

    def _ingest_many(self, records: list[Record]) -> int:
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            there: set[str] = set()
            ids = list(dict.fromkeys(r.id for r in records))
            for i in range(0, len(ids), 500):  # within the lock: another writer may have stored some since
                chunk = ids[i : i + 500]
                there |= {
                    row[0]
                    for row in c.execute(f"SELECT id FROM reports WHERE id IN ({','.join('?' * len(chunk))})", chunk)
                }
            new: list[Record] = []
            for r in records:
                if r.id not in there:
                    there.add(r.id)
                    new.append(r)
            new.sort(key=lambda r: r.id)  # the primary-key indexes then grow in order within the batch
            c.executemany(
                "INSERT INTO reports (id, path, gate, profile, result, stack, lock_sha256, image_digest, host_fp, "
                "host, date) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        r.id,
                        r.path,
                        r.gate,
                        r.profile,
                        r.result,
                        r.stack,
                        r.lock_sha256,
                        r.image_digest,
                        r.host_fp,
                        r.host,
                        r.date,
                    )
                    for r in new
                ],
            )
            c.executemany(
                "INSERT INTO pins (report_id, name, rev) VALUES (?, ?, ?)",
                [(r.id, n, rev) for r in new for n, rev in sorted(r.pins.items())],
            )
            c.executemany(
                "INSERT INTO measurements (report_id, metric, unit, n, mean, p50, stdev, lo, hi, method, "
                "samples, better) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        r.id,
                        m.metric,
                        m.unit,
                        m.n,
                        m.mean,
                        m.p50,
                        m.stdev,
                        m.lo,
                        m.hi,
                        m.method,
                        _samples_json(m.samples),
                        m.better,
                    )
                    for r in new
                    for m in r.measurements
                ],
            )
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise
        return len(new)

    # ---- queries
    def count(self) -> tuple[int, int]:
        """(reports, measurements) stored."""
        return (
            self.conn.execute("SELECT COUNT(*) FROM reports").fetchone()[0],
            self.conn.execute("SELECT COUNT(*) FROM measurements").fetchone()[0],
        )

    def accepted(self, stack: str, gate: str | None = None, profile: str | None = None) -> list[tuple[str, str]]:
        """(id, path) of every stored report with result pass of `stack` (of `gate` and `profile` when given), oldest
        first: the accepted runs a baseline may take (`gate --baseline history`). The stored values are as untrusted
        as the file: a row whose id or path is not a string is left out."""
        sql = "SELECT id, path FROM reports WHERE result = 'pass' AND stack = ?"
        args: list = [stack]
        for col, v in (("gate", gate), ("profile", profile)):
            if v is not None:
                sql += f" AND {col} = ?"  # the column name is ours, the value a parameter
                args.append(v)
        rows = self.conn.execute(sql + " ORDER BY date, id", args).fetchall()
        return [(i, p) for i, p in rows if isinstance(i, str) and isinstance(p, str)]

    def points(self, gates: tuple[str, ...] | None = None) -> list[Point]:
        """Every measurement (of `gates` only, when given), ordered by gate, profile, stack, metric, date. A row
        that cannot be used is passed over and named in `skipped_rows` (see the module doc)."""
        rows = self.conn.execute(
            "SELECT r.id, r.path, r.gate, r.profile, r.result, r.stack, r.lock_sha256, r.image_digest, r.host_fp, "
            "r.host, r.date, m.metric, m.unit, m.n, m.mean, m.p50, m.stdev, m.lo, m.hi, m.method, m.samples, "
            "m.better FROM reports r JOIN measurements m ON m.report_id = r.id "
            "ORDER BY r.gate, r.profile, r.stack, m.metric, r.date, r.id"
        )
        out = []
        heads: dict = {}  # report id -> its cleaned columns (a report has many measurements)
        for row in rows:
            if gates is not None and row[2] not in gates:
                continue
            try:
                m = _measurement(row)
            except ValueError as e:
                self._skip(row, str(e))
                continue
            key = row[0]
            if key not in heads:  # printed and put in the page, like a report's
                heads[key] = tuple(clean(v, 1000) for v in row[:11])
            out.append(Point(*heads[key], m))
        return out

    def _skip(self, row, why: str) -> None:
        line = (
            f"{self.where}: skipped stored measurement {clean(row[11], 80)!r} of report {clean(row[0])[:12]} "
            f"({clean(row[1], 300)}): {why}"
        )
        if line not in self.skipped_rows:
            self.skipped_rows.append(line)

    def pins(self, report_id: str) -> dict[str, str]:
        """{pin name: rev} of a report; a pin row that is not two strings is passed over (skipped_rows)."""
        out = {}
        for name, rev in self.conn.execute(
            "SELECT name, rev FROM pins WHERE report_id = ? ORDER BY name", (report_id,)
        ):
            if isinstance(name, str) and isinstance(rev, str):
                out[clean(name)] = clean(rev, 80)
            else:
                line = f"{self.where}: skipped a stored pin of report {clean(report_id)[:12]}: not a name and a rev"
                if line not in self.skipped_rows:
                    self.skipped_rows.append(line)
        return out


def _samples_json(samples: tuple[float, ...]) -> str:
    """`json.dumps(list(samples))` for finite floats (the reader keeps no other), without the encoder's setup."""
    return "[" + ", ".join(map(float.__repr__, samples)) + "]"


_STR, _NUMS, _OPT_STR = {str}, {int, float}, {str, type(None)}


def _measurement(row) -> Measurement:
    """The Measurement of a points() row, checked (the database is a file on a disk others may write): ValueError
    saying why when it cannot be used. (Set-of-types tests: a history of 10,000 reports has 300,000 rows.)"""
    if type(row[20]) is not str:
        raise ValueError("samples are not JSON")
    try:
        samples = json.loads(row[20])
    except (ValueError, RecursionError):
        raise ValueError("samples are not JSON") from None
    if type(samples) is not list:
        raise ValueError("samples are not a JSON list")
    opt = [v for v in row[15:19] if v is not None]
    nums = [row[14], *opt, *samples]
    if not (
        type(row[13]) is int
        and row[13] >= 1
        and set(map(type, nums)) <= _NUMS
        and set(map(type, row[:13])) <= _STR
        and {type(row[19]), type(row[21])} <= _OPT_STR
    ):
        raise ValueError("a value of the wrong type")
    if len(samples) > MAX_SAMPLES:
        raise ValueError(f"more than {MAX_SAMPLES} samples")
    try:
        floats = list(map(float, nums))  # an integer column may hold one past a float's range
    except OverflowError:
        raise ValueError("a value that is not a finite number") from None
    if not all(map(math.isfinite, floats)):  # json.loads takes NaN and 1e999 in `samples`
        raise ValueError("a value that is not a finite number")
    lo, hi = (None if row[17] is None else float(row[17])), (None if row[18] is None else float(row[18]))
    m = Measurement(
        clean(row[11]),
        clean(row[12]),
        row[13],
        floats[0],
        None if row[15] is None else float(row[15]),
        None if row[16] is None else float(row[16]),
        lo,
        hi,
        _opt(row[19]),
        tuple(floats[1 + len(opt) :]),
        _opt(row[21]),
    )
    bad = inconsistency(m)
    if bad:
        raise ValueError(f"{bad[0]}: {bad[1]}")
    return m


def _opt(v):
    return None if v is None else clean(v)
