"""``slurm-elastic db version|upgrade``: inspect, create or migrate the state DB schema.

The database is named by ``--url`` (any SQLAlchemy URL), else ``$SLURM_ELASTIC_DB_URL``, else the default SQLite
file. Stop the controller(s) before ``upgrade``; a controller refuses to run on an older or newer schema.
Exit status: 0 ok, 1 error (one line on stderr), 2 usage.
"""

from __future__ import annotations

import click

from slurm_elastic.errors import SlurmElasticError
from slurm_elastic.store import CURRENT_SCHEMA_VERSION, DEFAULT_DB_URL, SqlStore
from slurm_elastic.store.engine import make_engine, parse_url, redacted
from slurm_elastic.store.models import check_prefix, models_for

_url = click.option("--url", envvar="SLURM_ELASTIC_DB_URL", default=DEFAULT_DB_URL, show_default=True,
                    help="SQLAlchemy URL of the state DB (env SLURM_ELASTIC_DB_URL).")
_prefix = click.option("--table-prefix", default="", show_default=True, help="Prefix of the table names.")


def _fail(ctx: click.Context, verb: str, err: Exception) -> None:
    click.echo(f"slurm-elastic db {verb}: error: {err}", err=True)
    ctx.exit(1)


@click.group("db")
def db_cmd() -> None:
    """State DB schema: show its version, create or upgrade it."""


@db_cmd.command("version")
@_url
@_prefix
@click.pass_context
def version_cmd(ctx: click.Context, url: str, table_prefix: str) -> None:
    """Print the schema version of the database and the one this slurm-elastic needs."""
    try:
        engine = make_engine(url)
        try:
            store = SqlStore(engine, models_for(check_prefix(table_prefix)))
            found = store.schema_version()
        finally:
            engine.dispose()
    except SlurmElasticError as e:
        _fail(ctx, "version", e)
        return
    shown = "none (empty database)" if found is None else str(found)
    click.echo(f"database:  {redacted(parse_url(url))}")
    click.echo(f"schema:    {shown}")
    click.echo(f"supported: {CURRENT_SCHEMA_VERSION}")
    if found is not None and found > CURRENT_SCHEMA_VERSION:
        click.echo("slurm-elastic db version: error: the database is newer than this slurm-elastic", err=True)
        ctx.exit(1)


@db_cmd.command("upgrade")
@_url
@_prefix
@click.pass_context
def upgrade_cmd(ctx: click.Context, url: str, table_prefix: str) -> None:
    """Create the schema in an empty database, or migrate an older one step by step."""
    try:
        engine = make_engine(url)
        try:
            report = SqlStore(engine, models_for(check_prefix(table_prefix))).ensure_schema(create=True,
                                                                                             upgrade=True)
        finally:
            engine.dispose()
    except SlurmElasticError as e:
        _fail(ctx, "upgrade", e)
        return
    where = redacted(parse_url(url))
    if report.created:
        click.echo(f"created schema version {report.after} in {where}")
    elif report.applied:
        click.echo(f"upgraded schema from version {report.before} to {report.after} in {where}")
    else:
        click.echo(f"schema already at version {report.after} in {where}")
