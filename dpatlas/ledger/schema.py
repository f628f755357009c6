"""The ledger's tables (SQLAlchemy Core) and their migration from the previous version.

Tables (created if missing, and migrated in place from the previous version by adding what it
lacked): ``ledger_caps`` (one row per dataset), ``ledger_cap_changes`` (one row per cap change),
``ledger_releases`` (one row per release id, its primary key), ``ledger_charges`` (one row per
charged budget step), ``ledger_release_plans`` (the budget plan a release was charged under)."""

from __future__ import annotations

import sqlalchemy as sa

GUARANTEE_TYPES = ("pure", "approx", "zcdp", "gdp")
STATUSES = ("in_progress", "published", "failed", "withdrawn")

metadata = sa.MetaData()
_Double = sa.Double(asdecimal=False)

caps_table = sa.Table(
    "ledger_caps", metadata,
    sa.Column("dataset", sa.String(200), primary_key=True),
    sa.Column("cap_epsilon", _Double, nullable=False),
    sa.Column("cap_delta", _Double, nullable=False),
    sa.Column("created_at", sa.String(40), nullable=False),
    sa.Column("updated_at", sa.String(40), nullable=False),
    sa.CheckConstraint("cap_epsilon >= 0", name="ck_ledger_caps_epsilon"),
    sa.CheckConstraint("cap_delta >= 0 AND cap_delta <= 1", name="ck_ledger_caps_delta"),
)

cap_changes_table = sa.Table(
    "ledger_cap_changes", metadata,
    sa.Column("change_id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("dataset", sa.String(200), sa.ForeignKey("ledger_caps.dataset"), nullable=False,
              index=True),
    sa.Column("old_epsilon", _Double),  # NULL: the dataset had no cap before
    sa.Column("old_delta", _Double),
    sa.Column("new_epsilon", _Double, nullable=False),
    sa.Column("new_delta", _Double, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("actor", sa.Text, nullable=False),  # who: host:user unless told otherwise
    sa.Column("changed_at", sa.String(40), nullable=False),
)

releases_table = sa.Table(
    "ledger_releases", metadata,
    sa.Column("release_id", sa.String(200), nullable=False),
    sa.Column("dataset", sa.String(200), sa.ForeignKey("ledger_caps.dataset"), nullable=False,
              index=True),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("owner", sa.Text, nullable=False),  # the owner of the last begin_release
    sa.Column("config_sha256", sa.String(128), nullable=False),
    sa.Column("manifest_sha256", sa.String(128)),
    sa.Column("reason", sa.Text),  # the last failure or withdrawal reason
    sa.Column("attempts", sa.Integer, nullable=False),  # begin_release calls: 1 + resumes
    sa.Column("created_at", sa.String(40), nullable=False),
    sa.Column("updated_at", sa.String(40), nullable=False),
    sa.Column("published_at", sa.String(40)),
    sa.Column("withdrawn_at", sa.String(40)),
    sa.Column("lease_owner", sa.Text),  # NULL: no one runs it now
    sa.Column("lease_expires", _Double),  # epoch seconds by the DATABASE's clock
    sa.PrimaryKeyConstraint("release_id", name="pk_ledger_releases"),  # unique release ids
    sa.CheckConstraint("status IN ('in_progress', 'published', 'failed', 'withdrawn')",
                       name="ck_ledger_releases_status"),
)

# Columns added since the first version; a ledger without them is migrated by ALTER TABLE.
ADDED_RELEASE_COLUMNS = ("lease_owner", "lease_expires")

charges_table = sa.Table(
    "ledger_charges", metadata,
    sa.Column("charge_id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("release_id", sa.String(200), sa.ForeignKey("ledger_releases.release_id"),
              nullable=False, index=True),
    sa.Column("seq", sa.Integer, nullable=False),  # position in the release's charge list
    sa.Column("cell", sa.Text, nullable=False),
    sa.Column("step", sa.Text, nullable=False),
    sa.Column("guarantee_type", sa.String(16), nullable=False),
    sa.Column("epsilon", _Double, nullable=False),
    sa.Column("delta", _Double, nullable=False),
    sa.Column("rho", _Double),
    sa.Column("charged_at", sa.String(40), nullable=False),
    sa.UniqueConstraint("release_id", "seq", name="uq_ledger_charges_release_seq"),
    sa.CheckConstraint("epsilon >= 0", name="ck_ledger_charges_epsilon"),
    sa.CheckConstraint("delta >= 0 AND delta <= 1", name="ck_ledger_charges_delta"),
    sa.CheckConstraint("guarantee_type IN ('pure', 'approx', 'zcdp', 'gdp')",
                       name="ck_ledger_charges_type"),
)

# The plan each release was charged under (issue 31). Releases charged before it have no row:
# their first resume compares the charges per step and cell instead, then records the plan.
plans_table = sa.Table(
    "ledger_release_plans", metadata,
    sa.Column("release_id", sa.String(200), sa.ForeignKey("ledger_releases.release_id"),
              primary_key=True),
    sa.Column("plan_sha256", sa.String(64), nullable=False),
    sa.Column("plan", sa.Text, nullable=False),  # canonical JSON (dpatlas.core.plan_record)
    sa.Column("code_version", sa.Text, nullable=False),  # JSON: recorded, never compared
    sa.Column("recorded_at", sa.String(40), nullable=False),
    sa.Column("recorded_by", sa.String(20), nullable=False),  # "charge" or "resume"
)

TABLES = frozenset(t.name for t in metadata.sorted_tables)
_PG_SCHEMA_LOCK = 0x64706C6564676572 & 0x7FFFFFFFFFFFFFFF  # "dpledger": advisory lock for DDL


def inspect_schema(conn: sa.Connection) -> tuple[set[str], set[str]]:
    """The ledger tables this database has, and the columns of its releases table."""
    insp = sa.inspect(conn)
    tables = set(insp.get_table_names()) & TABLES
    columns = ({c["name"] for c in insp.get_columns(releases_table.name)}
               if releases_table.name in tables else set())
    return tables, columns


def migrate(conn: sa.Connection, backend: str) -> None:
    """Create the missing tables and add the missing release columns (in a write transaction)."""
    if backend == "postgresql":  # two processes migrating at once
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_SCHEMA_LOCK)))
    metadata.create_all(conn)  # checkfirst: only the missing tables
    _, have = inspect_schema(conn)
    for name in ADDED_RELEASE_COLUMNS:
        if name not in have:  # additive: the previous version's rows keep their values
            col = releases_table.c[name]
            conn.exec_driver_sql(f"ALTER TABLE {releases_table.name} ADD COLUMN {name} "
                                 f"{col.type.compile(dialect=conn.dialect)}")
