"""The statement guard of `ablate sql`: exactly one read-only statement, and no call that acts on the session or server.

The text is tokenized the way the server's lexer reads it (strings, quoted identifiers, PostgreSQL dollar
quotes and E'' strings, nested comments), so nothing hidden in a string or comment counts, and nothing
outside one escapes the checks. The database still enforces read-only on its side; this is the first wall.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ablate.errors import AblateError

READ_ONLY = ("SELECT", "WITH", "VALUES", "TABLE", "EXPLAIN")
EXPLAINABLE = ("SELECT", "WITH", "VALUES", "TABLE")
ONE_STATEMENT = "`ablate sql` runs one read-only statement (SELECT, WITH, VALUES, TABLE, EXPLAIN)"

SESSION = frozenset({"BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT", "SAVEPOINT", "RELEASE", "SET", "RESET",
                     "PREPARE", "EXECUTE", "DEALLOCATE", "DISCARD", "LISTEN", "UNLISTEN", "NOTIFY", "LOCK", "DO",
                     "CALL", "LOAD", "CHECKPOINT"})
STORAGE = frozenset({"ATTACH", "DETACH", "PRAGMA", "VACUUM", "REINDEX", "ANALYZE", "ANALYSE", "CLUSTER"})
EXPLAIN_OPTIONS = frozenset({"ANALYZE", "ANALYSE", "VERBOSE", "QUERY", "PLAN"})
WRITES = frozenset({"INSERT", "UPDATE", "DELETE", "MERGE"})  # inside a WITH they would write (FOR UPDATE aside)

# (names, name prefixes, why): functions `ablate sql` never calls, whatever role it runs as
DENIED_CALLS: tuple[tuple[frozenset[str], tuple[str, ...], str], ...] = (
    (frozenset({"set_config"}), (), "changes the session"),
    (frozenset({"pg_terminate_backend", "pg_cancel_backend", "pg_notify", "pg_log_backend_memory_contexts"}), (),
     "acts on other sessions"),
    (frozenset({"pg_read_file", "pg_read_binary_file", "pg_stat_file", "lowrite", "readfile", "writefile"}),
     ("pg_ls_", "lo_", "pg_file_"), "reads or writes files on the database server"),
    (frozenset({"load_extension", "fts3_tokenizer"}), (), "loads code into the database"),
    (frozenset({"dblink", "query_to_xml", "query_to_xmlschema", "query_to_xml_and_xmlschema", "cursor_to_xml",
                "cursor_to_xmlschema"}), ("dblink_",), "runs SQL text of its own"),
    (frozenset(), ("pg_advisory_", "pg_try_advisory_"), "takes locks other sessions wait on"),
    (frozenset({"nextval", "setval", "txid_current", "pg_current_xact_id"}), (), "changes sequences or transactions"),
    (frozenset({"pg_reload_conf", "pg_rotate_logfile", "pg_logical_emit_message", "pg_switch_wal",
                "pg_promote", "pg_drop_replication_slot", "pg_replication_slot_advance", "pg_wal_replay_pause",
                "pg_wal_replay_resume", "pg_backup_start", "pg_backup_stop", "pg_start_backup", "pg_stop_backup",
                "pg_import_system_collations"}),
     ("pg_create_", "pg_copy_", "pg_stat_reset", "pg_replication_origin_", "pg_logical_slot_"),
     "changes the server"),
)


@dataclass(frozen=True)
class Token:
    kind: str  # word, quoted (identifier), string, number, punct
    text: str
    start: int  # offsets in the query text
    end: int

    @property
    def upper(self) -> str:
        return self.text.upper() if self.kind == "word" else ""

    def name(self) -> str:
        """The identifier it names (quotes removed), lower-cased."""
        if self.kind == "quoted":
            return self.text[1:-1].replace(self.text[-1] * 2, self.text[-1]).lower()
        return self.text.lower()


_WORD = re.compile(r"[A-Za-z_\u0080-\uffff][\w$\u0080-\uffff]*")
_NUMBER = re.compile(r"(\d[\d_]*(\.[\d_]*)?|\.\d[\d_]*)([eE][+-]?\d+)?")
_DOLLAR = re.compile(r"\$([A-Za-z_\u0080-\uffff][\w]*)?\$")


def _refuse(what: str) -> AblateError:
    return AblateError(f"refused: {what}")


def tokenize(sql: str, dialect: str = "postgresql") -> list[Token]:
    """The tokens of `sql` outside comments and whitespace, as `dialect`'s lexer reads them."""
    pg = dialect == "postgresql"
    out: list[Token] = []
    i, n = 0, len(sql)

    def closing(quote: str, start: int, backslash: bool = False) -> int:
        """The end of a quoted run from `start` (its opening quote); a doubled quote stays inside."""
        j = start + 1
        while j < n:
            if backslash and sql[j] == "\\":
                j += 2
            elif sql[j] == quote:
                if j + 1 < n and sql[j + 1] == quote and quote != "]":
                    j += 2
                else:
                    return j + 1
            else:
                j += 1
        kind = "identifier" if quote in '"`]' else "string"
        raise _refuse(f"the query has a {kind} opened at character {start + 1} that is never closed; close it with {quote}")

    while i < n:
        c = sql[i]
        if c in " \t\n\r\f\v":  # the servers' whitespace; other characters (even U+00A0) are identifier text
            i += 1
        elif sql.startswith("--", i):
            newline = re.compile(r"[\r\n]").search(sql, i)
            i = newline.end() if newline else n
        elif sql.startswith("/*", i):
            depth, j = 1, i + 2
            while depth and j < n:
                if pg and sql.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif sql.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            if depth:
                raise _refuse(f"the query has a comment opened at character {i + 1} that is never closed; close it with */")
            i = j
        elif c == "'":
            j = closing("'", i)
            out.append(Token("string", sql[i:j], i, j))
            i = j
        elif pg and c in "eE" and sql.startswith("'", i + 1):
            j = closing("'", i + 1, backslash=True)
            out.append(Token("string", sql[i:j], i, j))
            i = j
        elif pg and c in "uU" and sql.startswith('&"', i + 1):
            raise _refuse(f'U&"..." identifiers (character {i + 1}); write the name plainly or in "double quotes"')
        elif c == '"' or (not pg and c in "`["):
            j = closing("]" if c == "[" else c, i)
            out.append(Token("quoted", sql[i:j], i, j))
            i = j
        elif pg and c == "$" and (m := _DOLLAR.match(sql, i)):
            end = sql.find(m.group(0), m.end())
            if end < 0:
                raise _refuse(f"the query has a {m.group(0)}-quoted string opened at character {i + 1} that is never "
                              f"closed; close it with {m.group(0)}")
            out.append(Token("string", sql[i:end + len(m.group(0))], i, end + len(m.group(0))))
            i = end + len(m.group(0))
        elif m := _WORD.match(sql, i):
            out.append(Token("word", m.group(0), i, m.end()))
            i = m.end()
        elif m := _NUMBER.match(sql, i):
            out.append(Token("number", m.group(0), i, m.end()))
            i = m.end()
        else:
            out.append(Token("punct", c, i, i + 1))
            i += 1
    return out


def statements(tokens: list[Token]) -> list[list[Token]]:
    """Tokens split at `;` (outside strings and comments); empty statements left out."""
    out: list[list[Token]] = [[]]
    for t in tokens:
        if t.kind == "punct" and t.text == ";":
            out.append([])
        else:
            out[-1].append(t)
    return [s for s in out if s]


def _first_word(tokens: list[Token], at: int = 0) -> tuple[int, Token | None]:
    """The first token from `at` after opening parentheses (`(SELECT 1) UNION (SELECT 2)`)."""
    while at < len(tokens) and tokens[at].text == "(" and tokens[at].kind == "punct":
        at += 1
    return at, tokens[at] if at < len(tokens) else None


def first_keyword(sql: str, dialect: str = "postgresql") -> str:
    """The statement's first keyword, upper-cased ('' when it starts otherwise)."""
    _, first = _first_word(tokenize(sql, dialect))
    return first.upper if first is not None else ""


def _check_start(tokens: list[Token]) -> None:
    at, first = _first_word(tokens)
    keyword = first.upper if first is not None else ""
    if keyword == "EXPLAIN":
        at += 1
        if at < len(tokens) and tokens[at].text == "(":  # EXPLAIN (ANALYZE, BUFFERS) ...
            depth = 0
            for at in range(at, len(tokens)):
                depth += {"(": 1, ")": -1}.get(tokens[at].text, 0) if tokens[at].kind == "punct" else 0
                if depth == 0:
                    break
            at += 1
        while at < len(tokens) and tokens[at].upper in EXPLAIN_OPTIONS:
            at += 1
        _, inner = _first_word(tokens, at)
        if inner is None or inner.upper not in EXPLAINABLE:
            shown = inner.text if inner is not None else "nothing"
            raise _refuse(f"EXPLAIN of {shown}; `ablate sql` explains read-only statements only "
                          f"({', '.join(EXPLAINABLE)})")
        return
    if keyword in READ_ONLY:
        return
    if first is None:
        raise _refuse(f"the query has no statement; {ONE_STATEMENT}")
    shown = first.text
    if keyword == "COPY":
        raise _refuse(f"COPY reads and writes files and runs programs on the database server; {ONE_STATEMENT}. "
                      "To export rows, pass --format csv")
    if keyword in SESSION:
        raise _refuse(f"{shown} controls the transaction or the session; {ONE_STATEMENT}, "
                      "in a read-only transaction of its own")
    if keyword in STORAGE:
        raise _refuse(f"{shown} changes how the database is opened or stored; {ONE_STATEMENT}")
    raise _refuse(f"{shown} is not a read-only statement; {ONE_STATEMENT}")


def _check_body(tokens: list[Token]) -> None:
    for k, t in enumerate(tokens):
        before = tokens[k - 1].upper if k else ""
        if t.upper in WRITES and not (t.upper == "UPDATE" and before in ("FOR", "KEY")):
            raise _refuse(f"{t.text} at character {t.start + 1} changes the database (a data-modifying WITH); "
                          f"{ONE_STATEMENT}")
        if t.upper == "INTO":
            raise _refuse(f"SELECT ... INTO (character {t.start + 1}) creates a table; {ONE_STATEMENT}")
        called = k + 1 < len(tokens) and tokens[k + 1].kind == "punct" and tokens[k + 1].text == "("
        dotted = k > 0 and tokens[k - 1].kind == "punct" and tokens[k - 1].text == "."  # also row.f calls f(row)
        if t.kind in ("word", "quoted") and (called or dotted):
            name = t.name()
            for names, prefixes, why in DENIED_CALLS:
                if name in names or name.startswith(prefixes):
                    raise _refuse(f"{name}() {why}; `ablate sql` may not call it")


def check(sql: str, dialect: str = "postgresql") -> str:
    """The one read-only statement in `sql` (without its trailing `;`), or AblateError saying what was refused."""
    tokens = tokenize(sql, dialect)
    found = statements(tokens)
    if not found:
        raise _refuse(f"the query is empty; {ONE_STATEMENT}")
    if len(found) > 1:
        raise _refuse(f"{ONE_STATEMENT}; got {len(found)} statements")
    (statement,) = found
    _check_start(statement)
    _check_body(statement)
    return sql[statement[0].start:statement[-1].end]
