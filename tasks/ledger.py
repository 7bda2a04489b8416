"""The lifetime privacy ledger: every release of a table (its schema name) and what they cost together.

One SQLite file in the installation's home (`<home>/privacy-ledger.sqlite`, tasks/home.py; `DPSYNTH_LEDGER`
names another file), owner-only, keyed by the table's schema name: every command run from any folder
with the same home reads the same ledger. It is not keyed by the schema's version: a new version of a
table's schema describes the same people, and must not start their lifetime budget afresh. A release is
entered just before it publishes anything, under an exclusive lock that first checks the table's
lifetime budget against every release already there, so two releases of the same table running at once
are both counted and the second is refused if both would not fit. What counts:

* "publishing": entered, registration under way (a release killed in that window still counts: it may
  have published, and counting it is the safe side);
* "published": registered and bundled;
* "refused": the DP approval refused it; its decision was drawn on the checkpoints and the validation
  rows, so it costs what a published release would.

No release stops on a fact of its rows (docs/privacy.md, section 12): a ledger written by an earlier
version may hold "aborted" entries (a split without a row of a target level stopped those); they were
spent and still count, but nothing enters that status any more.

A release that fails or is killed before it is entered (any stage up to the DP decision) adds nothing;
one that fails while publishing and registered nothing is taken out again. Retiring a version from the
registry gives nothing back: the ledger never looks at the registry. A trial (a profile with
`trial: true`, or `dpsynth release --no-publish`) publishes nothing and is never entered.

Only a profile with a lifetime budget publishes (`require_lifetime_budget`): without one, nothing
would stop try-outs and repeated releases from spending a table without limit.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from dpsynth.models.errors import BudgetExceededError, ConfigError
from dpsynth.models.privacy.lifetime import LifetimeCost, ReleaseCost, lifetime_cost
from dpsynth.tasks.private_files import owner_only, restrict

if TYPE_CHECKING:
    from dpsynth.models.config import Profile

LEDGER_FILE = "privacy-ledger.sqlite"
ENTERED = ("publishing", "published", "refused")
COUNTED = (*ENTERED, "aborted")  # "aborted": earlier versions' entries only (see the module notes)
# Columns later versions added, with their types: a ledger from before gains them on first use.
_ADDED_COLUMNS = {"input_sha256": "TEXT", "profile": "TEXT"}
_SCHEMA = """CREATE TABLE IF NOT EXISTS releases (
    release_id TEXT PRIMARY KEY,
    dataset TEXT NOT NULL,
    status TEXT NOT NULL,
    epsilon REAL NOT NULL,
    delta REAL NOT NULL,
    cost TEXT NOT NULL,
    lifetime_budget REAL,
    model_version TEXT,
    created TEXT NOT NULL,
    updated TEXT NOT NULL,
    input_sha256 TEXT,
    profile TEXT)"""


@dataclass(frozen=True)
class LedgerEntry:
    release_id: str
    dataset: str
    status: str
    epsilon: float
    delta: float
    cost: ReleaseCost
    lifetime_budget: float | None
    model_version: str | None
    created: str
    updated: str

    def as_dict(self) -> dict:
        return {
            "release_id": self.release_id,
            "status": self.status,
            "epsilon": None if math.isinf(self.epsilon) else self.epsilon,
            "delta": self.delta,
            "lifetime_budget": self.lifetime_budget,
            "model_version": self.model_version,
            "created": self.created,
            "updated": self.updated,
        }


def ledger_path() -> Path:
    """`DPSYNTH_LEDGER`, else the home's ledger: never the working folder, whatever the tracking store."""
    explicit = os.environ.get("DPSYNTH_LEDGER")
    if explicit:
        return Path(explicit)
    from dpsynth.tasks.home import home, require_explicit_home_for

    remote = os.environ.get("MLFLOW_TRACKING_URI")
    if remote:
        require_explicit_home_for(remote)
    return home() / LEDGER_FILE


@contextmanager
def _connect(write: bool = False) -> Iterator[sqlite3.Connection | None]:
    """The ledger's connection; None for a reader when there is no ledger yet."""
    owner_only()
    path = ledger_path()
    if not write and not path.exists():
        yield None
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    # timeout: a second release waits for the first one's short check-and-enter, it does not fail.
    with closing(sqlite3.connect(path, timeout=60, isolation_level=None)) as db:
        restrict(path)
        db.execute(_SCHEMA)
        present = {row[1] for row in db.execute("PRAGMA table_info(releases)")}
        for column, kind in _ADDED_COLUMNS.items():
            if column not in present:
                db.execute(f"ALTER TABLE releases ADD COLUMN {column} {kind}")
        if write:
            db.execute("BEGIN IMMEDIATE")  # one writer at a time: check and enter are one step
        try:
            yield db
            if write:
                db.execute("COMMIT")
        except BaseException:
            if write:
                db.execute("ROLLBACK")
            raise


@contextmanager
def _writing() -> Iterator[sqlite3.Connection]:
    """The ledger (created if missing) in one exclusive transaction."""
    with _connect(write=True) as db:
        assert db is not None  # a writer always opens the ledger
        yield db


def _entries(db: sqlite3.Connection | None, dataset: str) -> list[LedgerEntry]:
    if db is None:
        return []
    rows = db.execute(
        "SELECT release_id, dataset, status, epsilon, delta, cost, lifetime_budget, model_version, "
        "created, updated FROM releases WHERE dataset = ? ORDER BY created",
        (dataset,),
    ).fetchall()
    return [
        LedgerEntry(
            r[0], r[1], r[2], float(r[3]), float(r[4]), ReleaseCost.from_dict(json.loads(r[5])), r[6], r[7], r[8], r[9]
        )
        for r in rows
    ]


def entries(dataset: str) -> list[LedgerEntry]:
    """Every release of `dataset` in the ledger, oldest first."""
    with _connect() as db:
        return _entries(db, dataset)


def spent(dataset: str, extra: ReleaseCost | None = None, excluding: str | None = None) -> LifetimeCost:
    """What the counted releases of `dataset` cost together (with `extra` added, if given)."""
    with _connect() as db:
        costs = [e.cost for e in _entries(db, dataset) if e.status in COUNTED and e.release_id != excluding]
    return lifetime_cost(costs + ([extra] if extra is not None else []))


# The rules that refuse a release before any work, by the profile key that sets each; a forecast
# (`forecast_releases`) applies the same functions, in the same order, as the release's own checks.
LIFETIME_RULE = "privacy.lifetime_budget"
WINDOW_END_RULE = "privacy.releases_until"
PLANNED_RULE = "privacy.planned_releases"


@dataclass(frozen=True)
class Refusal:
    """Why a release would be refused: the profile key whose rule refuses it, and the message a refused
    release prints (exit 5)."""

    rule: str
    message: str

    def error(self) -> BudgetExceededError:
        return BudgetExceededError(self.message)


def lifetime_refusal(
    dataset: str, counted: list[ReleaseCost], planned: ReleaseCost, budget: float | None, when: str = "before any work"
) -> Refusal | None:
    """The lifetime budget's verdict on one more release of cost `planned` after the `counted` ones."""
    if budget is None:
        return None
    before, after = lifetime_cost(counted), lifetime_cost(counted + [planned])
    if after.epsilon <= budget:
        return None
    return Refusal(
        LIFETIME_RULE,
        f"Refusing this release of {dataset!r} {when}: its epsilon {planned.epsilon:.4g} would take the table's "
        f"lifetime spending from {before.epsilon:.4g} ({before.releases} release(s)) to {after.epsilon:.4g}, above "
        f"privacy.lifetime_budget {budget:g}. Nothing was published. Every release of the same rows adds to "
        "their privacy loss; `dpsynth ledger --config SCHEMA` lists what was spent.",
    )


def window_refusal(dataset: str, profile: Profile, made: int, today: date) -> Refusal | None:
    """The profile's schedule's verdict on one more release, `made` of its releases being counted already:
    refused after `privacy.releases_until`, or once `privacy.planned_releases` are made."""
    privacy = profile.privacy
    if privacy.releases_until is not None and today > date.fromisoformat(privacy.releases_until):
        return Refusal(
            WINDOW_END_RULE,
            f"Refusing this release of {dataset!r}: profile {profile.name!r} releases until "
            f"{privacy.releases_until} (privacy.releases_until), and today is {today.isoformat()}. Nothing was "
            "started. A new schedule is a new decision: set a later date in the profile if it is intended.",
        )
    if privacy.planned_releases is not None and made >= privacy.planned_releases:
        return Refusal(
            PLANNED_RULE,
            f"Refusing this release of {dataset!r}: the table's privacy ledger already holds {made} "
            f"release(s) of profile {profile.name!r}, which plans {privacy.planned_releases} "
            "(privacy.planned_releases). Nothing was started. `dpsynth ledger --config SCHEMA --profile "
            f"{profile.name} --forecast N` shows what more releases would spend.",
        )
    return None


def release_refusal(
    dataset: str, profile: Profile, planned: ReleaseCost, counted: list[ReleaseCost], made: int, today: date
) -> Refusal | None:
    """The first rule that refuses a release before any work, in the order a release checks them
    (`check_lifetime`, then `check_release_window`); None if it fits."""
    return lifetime_refusal(dataset, counted, planned, profile.privacy.lifetime_budget) or window_refusal(
        dataset, profile, made, today
    )


def require_lifetime_budget(profile: Profile) -> None:
    """Refuse (ConfigError, exit 2) to publish with a profile that sets no `privacy.lifetime_budget`."""
    if profile.trial or profile.privacy.lifetime_budget is not None:
        return
    raise ConfigError(
        f"Profile {profile.name!r} sets no privacy.lifetime_budget, so it cannot publish: every release of a "
        "table adds to its rows' privacy loss, and only a lifetime budget stops try-outs and repeated releases "
        "from spending the table without limit (the privacy ledger composes them). Nothing was started. Set "
        "privacy.lifetime_budget in the profile (the shipped Cardio release profiles allow 30; `dpsynth ledger "
        "--config SCHEMA` shows what the table has spent), or run it as a trial with `dpsynth release "
        "--no-publish`, which runs every stage and publishes nothing."
    )


def check_lifetime(dataset: str, planned: ReleaseCost, budget: float | None, release_id: str | None = None) -> None:
    """Refuse (BudgetExceededError, exit 5) a release whose planned cost would take `dataset` past `budget`."""
    refusal = lifetime_refusal(dataset, _counted(dataset, excluding=release_id), planned, budget)
    if refusal is not None:
        raise refusal.error()


def _counted(dataset: str, excluding: str | None = None) -> list[ReleaseCost]:
    """The costs of the counted releases of `dataset` (all but `excluding`, a release resuming itself)."""
    with _connect() as db:
        return [e.cost for e in _entries(db, dataset) if e.status in COUNTED and e.release_id != excluding]


def enter(
    dataset: str,
    release_id: str,
    cost: ReleaseCost,
    budget: float | None,
    status: str = "publishing",
    input_sha256: str | None = None,
    profile: str | None = None,
) -> None:
    """Enter a release (idempotent on `release_id`: a resumed release replaces its own entry), after
    checking the budget against every other release, in one exclusive transaction. `input_sha256` (the
    input file's hash) stays in the ledger, which is internal: `check_new_input` reads it; `profile`
    (its name) lets `releases_of_profile` count a schedule's releases."""
    if status not in ENTERED:
        raise ValueError(f"unknown ledger status {status!r}")
    now = datetime.now(UTC).isoformat()
    with _writing() as db:
        others = [e.cost for e in _entries(db, dataset) if e.status in COUNTED and e.release_id != release_id]
        when = "at publication (another release of the same table was entered since this one started)"
        refusal = lifetime_refusal(dataset, others, cost, budget, when)
        if refusal is not None:
            raise refusal.error()
        created = db.execute("SELECT created FROM releases WHERE release_id = ?", (release_id,)).fetchone()
        db.execute(
            "INSERT OR REPLACE INTO releases (release_id, dataset, status, epsilon, delta, cost, "
            "lifetime_budget, model_version, created, updated, input_sha256, profile) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, ?)",
            (
                release_id,
                dataset,
                status,
                cost.epsilon,
                cost.delta,
                json.dumps(cost.to_dict()),
                budget,
                created[0] if created else now,
                now,
                input_sha256,
                profile,
            ),
        )


def releases_of_profile(dataset: str, profile: str, excluding: str | None = None) -> int:
    """How many counted releases of the table were made with the profile named `profile`."""
    with _connect() as db:
        if db is None:
            return 0
        row = db.execute(
            f"SELECT COUNT(*) FROM releases WHERE dataset = ? AND profile = ? AND release_id != ? "
            f"AND status IN ({', '.join('?' * len(COUNTED))})",
            (dataset, profile, excluding or "", *COUNTED),
        ).fetchone()
    return int(row[0])


def check_release_window(
    dataset: str, profile: Profile, release_id: str | None = None, today: date | None = None
) -> None:
    """Refuse (exit 5, before any work) a release past where the profile says its schedule ends: after
    `privacy.releases_until`, or once the table's ledger holds `privacy.planned_releases` counted releases
    made with this profile. A schedule that has ended then stops cleanly instead of spending on."""
    made = releases_of_profile(dataset, profile.name, excluding=release_id)
    refusal = window_refusal(dataset, profile, made, today or datetime.now(UTC).date())
    if refusal is not None:
        raise refusal.error()


def check_new_input(dataset: str, input_sha256: str, release_id: str | None = None) -> None:
    """Refuse (BudgetExceededError, exit 5) a release of the very file the table's last counted release
    read: a schedule whose extract nobody replaced would release the same rows again and spend again for
    nothing new. `--allow-same-input` skips this check."""
    with _connect() as db:
        if db is None:
            return
        row = db.execute(
            "SELECT release_id, input_sha256 FROM releases WHERE dataset = ? AND status IN "
            f"({', '.join('?' * len(COUNTED))}) AND release_id != ? ORDER BY created DESC LIMIT 1",
            (dataset, *COUNTED, release_id or ""),
        ).fetchone()
    if row is not None and row[1] == input_sha256:
        raise BudgetExceededError(
            f"Refusing this release of {dataset!r}: its input file is byte for byte the one the table's last "
            f"release ({row[0]}) read. Releasing the same rows again spends privacy budget for nothing new (a "
            "scheduled release whose extract was not replaced does this). Nothing was started. Replace the "
            "file with the new extract, or pass --allow-same-input if a second release of the same rows is "
            "intended."
        )


def forecast(dataset: str, planned: ReleaseCost, releases: int, budget: float | None) -> dict:
    """The table's lifetime spending after each of `releases` more releases of cost `planned` (composed as
    the ledger composes), and the first of them the budget would refuse (None if none). A refused release
    costs nothing, and every later one, of the same cost, is refused too: the spending stays."""
    with _connect() as db:
        counted = [e.cost for e in _entries(db, dataset) if e.status in COUNTED]

    def finite(value: float) -> float | None:
        return None if math.isinf(value) else value

    now = lifetime_cost(counted).epsilon
    after, stops_at, total = [], None, now
    for k in range(1, releases + 1):
        if stops_at is None:
            if lifetime_refusal(dataset, counted, planned, budget) is not None:  # the release's own rule
                stops_at = k
            else:
                counted = counted + [planned]
                total = lifetime_cost(counted).epsilon
        after.append(finite(total))
    return {
        "dataset": dataset,
        "spent_epsilon": finite(now),
        "planned_release_epsilon": finite(planned.epsilon),
        "lifetime_budget": budget,
        "after": after,
        "stops_at": stops_at,
    }


def forecast_releases(
    dataset: str, profile: Profile, planned: ReleaseCost, releases: int, today: date | None = None
) -> dict:
    """What release would say to each of `releases` more releases of `profile` (each at its planned cost),
    made one after another from today's ledger: `release_refusal`, the release's own rules, applied to
    the ledger as each earlier one leaves it (a release that fits is counted; a refused one spends
    nothing). `verdicts[k]` is {"release", "fits", "rule", "reason", "lifetime_epsilon"}; `stops_at` the
    first refused (None if none)."""
    today = today or datetime.now(UTC).date()
    counted = _counted(dataset)
    made = releases_of_profile(dataset, profile.name)

    def finite(value: float) -> float | None:
        return None if math.isinf(value) else value

    verdicts, after = [], []
    for k in range(1, releases + 1):
        refusal = release_refusal(dataset, profile, planned, counted, made, today)
        if refusal is None:
            counted, made = counted + [planned], made + 1
        total = finite(lifetime_cost(counted).epsilon)
        after.append(total)
        verdicts.append(
            {
                "release": k,
                "fits": refusal is None,
                "rule": None if refusal is None else refusal.rule,
                "reason": None if refusal is None else refusal.message,
                "lifetime_epsilon": total,
            }
        )
    refused = [v for v in verdicts if not v["fits"]]
    return {
        "dataset": dataset,
        "profile": profile.name,
        "spent_epsilon": finite(lifetime_cost(_counted(dataset)).epsilon),
        "planned_release_epsilon": finite(planned.epsilon),
        "lifetime_budget": profile.privacy.lifetime_budget,
        "planned_releases": profile.privacy.planned_releases,
        "releases_until": profile.privacy.releases_until,
        "as_of": today.isoformat(),
        "after": after,
        "verdicts": verdicts,
        "stops_at": refused[0]["release"] if refused else None,
        "stopping_rule": refused[0]["rule"] if refused else None,
    }


def last_release_profile(dataset: str) -> str | None:
    """The profile name the table's latest release (counted or not) entered in the ledger, if any."""
    with _connect() as db:
        if db is None:
            return None
        row = db.execute(
            "SELECT profile FROM releases WHERE dataset = ? AND profile IS NOT NULL ORDER BY created DESC LIMIT 1",
            (dataset,),
        ).fetchone()
    return None if row is None else str(row[0])


def mark_published(release_id: str, model_version: str) -> None:
    with _writing() as db:
        db.execute(
            "UPDATE releases SET status = 'published', model_version = ?, updated = ? WHERE release_id = ?",
            (model_version, datetime.now(UTC).isoformat(), release_id),
        )


def withdraw(release_id: str) -> None:
    """Take out a release entered for publication that failed before registering anything."""
    with _writing() as db:
        db.execute("DELETE FROM releases WHERE release_id = ? AND status = 'publishing'", (release_id,))


def summary(dataset: str, budget: float | None = None) -> dict:
    """The ledger of `dataset` for people: its releases, what they cost together, the budget left.
    `budget` defaults to the lifetime budget of the latest release that named one."""
    rows = entries(dataset)
    total = lifetime_cost([e.cost for e in rows if e.status in COUNTED])
    if budget is None:
        budget = next((e.lifetime_budget for e in reversed(rows) if e.lifetime_budget is not None), None)

    def finite(value: float | None) -> float | None:
        return None if value is None or math.isinf(value) else value

    return {
        "dataset": dataset,
        "ledger": str(ledger_path()),
        "releases": [e.as_dict() for e in rows],
        "counted": total.releases,
        "spent_epsilon": finite(total.epsilon),
        "spent_delta": total.delta,
        "basic_composition_epsilon": finite(total.basic_epsilon),
        "lifetime_budget": budget,
        "remaining_epsilon": None if budget is None else finite(max(0.0, budget - total.epsilon)),
    }
