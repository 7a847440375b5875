"""The login `ablate sql` reads PostgreSQL with: its own role and credentials (ABLATE_READ_URL), which can only read.

With the writer's login, `SET LOCAL ROLE ablate_reader` is a wall that SQL can climb back over: a statement
the guard cannot see (SQL text inside a string that a server function runs later) may call
`set_config('role', <the login>, true)` and act as the writer. A login that is `ablate_reader` itself (or a
role whose only membership is `ablate_reader`), and neither superuser nor able to write, has no role above
it to return to. `ablate db upgrade` makes it where its login may (else prints the SQL for an administrator);
docker-compose.yml makes it at the database's first start.
"""

from __future__ import annotations

from functools import cache

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from ablate.config.errors import AblateError
from ablate.store.engine import describe_url, make_engine, redact, resolve_url
from ablate.store.migrate import READER_ROLE
from ablate.config.settings import environment

ENV = "ABLATE_READ_URL"

# what the login is: (can do more than read, roles it belongs to besides the reader role, can write to runs)
_WHO = f"""
SELECT r.rolname, r.rolsuper OR r.rolcreaterole OR r.rolcreatedb OR r.rolbypassrls OR r.rolreplication,
       ARRAY(SELECT g.rolname FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid
             WHERE m.member = r.oid AND g.rolname <> '{READER_ROLE}'),
       ARRAY(SELECT g.rolname FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid
             JOIN pg_roles rr ON rr.oid = m.member WHERE rr.rolname = '{READER_ROLE}'),
       has_table_privilege(r.oid, 'runs', 'INSERT, UPDATE, DELETE, TRUNCATE'),
       session_user = current_user
FROM pg_roles r WHERE r.rolname = current_user
"""


def read_url() -> str | None:
    return environment().read_url


def advice(url: str | None) -> str | None:
    """What `ablate sql` says on PostgreSQL without ABLATE_READ_URL (the writer's login ran the statement)."""
    if read_url() is None and resolve_url(url).startswith("postgresql"):
        return (f"`ablate sql` used the writer's login, switched to the role {READER_ROLE}; set {ENV} to a login that "
                "can only read (docker-compose.yml does; `ablate db upgrade` with it set makes the login) so that no "
                "SQL can switch back")
    return None


def engine_for(url: str | None) -> sa.Engine | None:
    """On PostgreSQL with ABLATE_READ_URL set: an engine on the read-only login, checked to be one and to open
    the same database as `url` (--db / ABLATE_DB_URL, when that is PostgreSQL). None otherwise."""
    wanted = read_url()
    if wanted is None:
        return None
    target = sa.make_url(resolve_url(url))
    if target.get_backend_name() != "postgresql":
        return None
    mine = sa.make_url(wanted)
    if mine.get_backend_name() != "postgresql":
        raise AblateError(f"{ENV} must be a postgresql:// URL (the read-only login), not {redact(wanted)}")
    if (mine.host or "localhost", mine.port or 5432, mine.database) != (target.host or "localhost", target.port or 5432,
                                                                        target.database):
        raise AblateError(f"{ENV} opens {describe_url(wanted)} but the results database is {describe_url(str(target))}; "
                          f"point both at the same database (or unset {ENV})")
    return _checked(wanted)


@cache
def _checked(url: str) -> sa.Engine:
    engine = make_engine(url, read_only=True)
    try:
        with engine.connect() as conn:
            row = conn.execute(sa.text(_WHO)).one()
    except SQLAlchemyError as exc:
        reason = redact(str(getattr(exc, "orig", None) or exc).strip().splitlines()[0])
        raise AblateError(f"cannot read the results database as {ENV}'s login: {reason}") from None
    name, powers, others, reader_in, writes, same = row
    problems = []
    if powers:
        problems.append("it is a superuser or can create roles or databases")
    if others:
        problems.append(f"it belongs to {', '.join(others)}")
    if reader_in:
        problems.append(f"{READER_ROLE} belongs to {', '.join(reader_in)}")
    if writes:
        problems.append("it can write the runs table")
    if not same:
        problems.append("its session user is not its current user")
    if problems:
        raise AblateError(f"{ENV} logs in as {name}, which is not a read-only login: {'; '.join(problems)}. Use "
                          f"{READER_ROLE} (`ablate db upgrade` with {ENV} set makes it, or prints the SQL for an "
                          "administrator)")
    return engine


def ensure_login(engine: sa.Engine) -> str | None:
    """`ablate db upgrade` on PostgreSQL with ABLATE_READ_URL set: give its user (the reader role, or a role
    whose only membership is the reader role) LOGIN and its password. What was done, or the SQL for an
    administrator when this login may not."""
    wanted = read_url()
    if wanted is None or engine.dialect.name != "postgresql":
        return None
    mine = sa.make_url(wanted)
    user = mine.username or READER_ROLE
    password = mine.password
    ident = engine.dialect.identifier_preparer.quote(user)

    def statements(secret: str | None) -> list[str]:
        login = "LOGIN" + (f" PASSWORD '{secret}'" if secret else "")
        out = [f"{'ALTER' if exists else 'CREATE'} ROLE {ident} {login} NOSUPERUSER NOCREATEDB NOCREATEROLE "
               "NOREPLICATION"]
        return out + ([f"GRANT {READER_ROLE} TO {ident}"] if user != READER_ROLE else [])

    exists = True
    try:
        with engine.begin() as conn:
            exists = bool(conn.execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": user}).scalar())
            for statement in statements(password.replace("'", "''") if password else None):
                conn.exec_driver_sql(statement)
    except SQLAlchemyError:
        shown = "; ".join(statements("<the password in ABLATE_READ_URL>" if password else None))
        return (f"could not make the read-only login {user} (this login may not create or alter roles); an "
                f"administrator runs: {shown}")
    return f"read-only login {user} ready for `ablate sql` ({ENV})"
