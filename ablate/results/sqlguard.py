"""The statement guard of `ablate sql`: exactly one read-only statement, and no call that acts on the session or server.

The text is tokenized the way the server's lexer reads it (strings, quoted identifiers, PostgreSQL dollar
quotes and E'' strings, nested comments), so nothing hidden in a string or comment counts, and nothing
outside one escapes the checks. The database still enforces read-only on its side; this is the first wall.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ablate.config.errors import AblateError

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


# Functions `ablate sql` may call, by name (any schema): aggregates, window functions and pure functions of
# values (numbers, text, dates, JSON, arrays) of PostgreSQL and SQLite. Anything else called is refused: a
# function that takes SQL text (ts_stat, query_to_xml, ...) runs it where no guard can read it. What a query
# reads is the reader login's to limit; this list only keeps a query from running code the guard cannot see.
ALLOWED_CALLS = frozenset("""
count sum avg min max total group_concat string_agg array_agg json_agg jsonb_agg json_object_agg jsonb_object_agg
json_group_array json_group_object bool_and bool_or every bit_and bit_or bit_xor stddev stddev_pop stddev_samp
variance var_pop var_samp corr covar_pop covar_samp regr_slope regr_intercept regr_r2 regr_count regr_avgx regr_avgy
regr_sxx regr_syy regr_sxy percentile_cont percentile_disc mode any_value
row_number rank dense_rank percent_rank cume_dist ntile lag lead first_value last_value nth_value
coalesce nullif ifnull iif greatest least
abs round floor ceil ceiling trunc exp ln log log10 log2 power pow sqrt cbrt sign mod div pi degrees radians
sin cos tan asin acos atan atan2 sinh cosh tanh width_bucket random gcd lcm factorial scale min_scale trim_scale
lower upper length char_length character_length octet_length bit_length substr substring replace trim ltrim rtrim
btrim concat concat_ws instr position strpos split_part left right lpad rpad repeat reverse initcap format printf
regexp_replace regexp_match regexp_matches regexp_like regexp_split_to_array regexp_split_to_table regexp_substr
regexp_count regexp_instr starts_with translate ascii chr char unicode hex unhex md5 to_hex encode decode quote
string_to_array array_to_string overlay like glob typeof pg_typeof zeroblob randomblob
now date time datetime julianday unixepoch strftime timediff date_trunc date_part extract age to_char to_date
to_timestamp to_number make_date make_time make_interval make_timestamp make_timestamptz justify_days
justify_hours justify_interval clock_timestamp statement_timestamp transaction_timestamp date_bin isfinite timezone
json jsonb json_extract json_array json_object json_type json_valid json_each json_tree json_array_length
json_quote json_insert json_replace json_set json_remove json_patch jsonb_extract_path jsonb_extract_path_text
json_extract_path json_extract_path_text jsonb_array_elements json_array_elements jsonb_array_elements_text
json_array_elements_text jsonb_each json_each_text jsonb_each_text jsonb_object_keys json_object_keys
jsonb_typeof json_typeof jsonb_array_length to_json to_jsonb jsonb_build_object json_build_object
jsonb_build_array json_build_array jsonb_pretty jsonb_path_query jsonb_path_query_first jsonb_path_query_array
jsonb_path_exists jsonb_path_match jsonb_strip_nulls json_strip_nulls jsonb_set jsonb_insert row_to_json
array_to_json
unnest generate_series array_length cardinality array_position array_positions array_remove array_replace
array_append array_prepend array_cat array_lower array_upper array_dims
pg_sleep current_setting current_database current_schema version sqlite_version pg_size_pretty
""".split())

# Words a parenthesis may follow that are not calls: keywords (`IN (`, `OVER (`, `AS (`), type names with a
# modifier (`numeric(10, 2)`) and TABLESAMPLE methods
NOT_CALLS = frozenset("""
select from where and or not in exists any all some as on using join lateral values over filter within group by
order partition having limit offset fetch union intersect except then when else case is like ilike similar
between distinct with recursive materialized cast row array escape regexp match tablesample bernoulli system
repeatable rows range groups preceding following current window zone returning explain
numeric decimal varchar char character varying bit varbit timestamp timestamptz time timetz interval float
double precision int integer bigint smallint real text boolean nchar national
""".split())


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
        if called and t.kind in ("word", "quoted") and t.name() not in ALLOWED_CALLS and not _not_a_call(tokens, k):
            raise _refuse(f"{t.name()}() at character {t.start + 1} is not a function `ablate sql` calls: it calls "
                          "aggregates, window functions and functions of values (numbers, text, dates, JSON, "
                          "arrays), listed in ablate/sqlguard.py (ALLOWED_CALLS)")


def _not_a_call(tokens: list[Token], k: int) -> bool:
    """Whether `tokens[k]`, followed by `(`, is not a function call: a keyword or a type name, a name after AS or
    `::` (an alias's column list, a type with a modifier), or a CTE's name with its column list
    (`WITH t(a, b) AS (SELECT ...)`)."""
    t, before = tokens[k], tokens[k - 1] if k else None
    if t.kind == "word" and t.text.lower() in NOT_CALLS:
        return True
    if before is not None and (before.upper == "AS" or (before.kind == "punct" and before.text == ":")):
        return True
    # a CTE's column list holds names only, and its body is a statement (a function's column definition list,
    # `FROM f(x) AS (a text)`, holds types: it is a call)
    if before is None or not (before.upper in ("WITH", "RECURSIVE") or before.text == ","):
        return False
    j = k + 2
    while j < len(tokens) and (tokens[j].kind in ("word", "quoted") or tokens[j].text == ","):
        j += 1
    if j >= len(tokens) or tokens[j].text != ")" or tokens[j].kind != "punct":
        return False
    rest = tokens[j + 1:j + 6]
    if not rest or rest[0].upper != "AS":
        return False
    i = 1
    while i < len(rest) and rest[i].upper in ("NOT", "MATERIALIZED"):
        i += 1
    return (i + 1 < len(rest) and rest[i].kind == "punct" and rest[i].text == "("
            and (rest[i + 1].upper in EXPLAINABLE or rest[i + 1].text == "("))


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
