//! The statements of the transaction-pooling design, as text for the simple query
//! protocol.
//!
//! Behind a transaction pooler (PgBouncer's `pool_mode = transaction`) a prepared
//! statement, named or unnamed, may be parsed on one server connection and run on
//! another: sqlx parses (and syncs) before it binds, so even its unnamed statements
//! can be split outside a transaction. The simple query protocol sends one message
//! per round trip, so every statement here is plain text with its values written in:
//! integers as decimal, text and bytes as hex `bytea` literals (no quoting to get
//! wrong), and the schema, validated as a plain lowercase identifier.

use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;

use sqlx::postgres::{PgPool, PgRow};
use sqlx::{Executor as _, PgConnection};

use crate::config::CLIENT_CHECK_INTERVAL_MS;
use crate::keys::pg_locks_ids;
use crate::mailbox::Probe;

/// The rows of plain-text `sql` (one or more statements) run on `conn`. Boxed with its
/// `Send` bound spelled out: sqlx's executor impls otherwise make callers' futures
/// fail "not general enough" checks when they are boxed as `Send`.
pub(crate) fn run<'a>(
    conn: &'a mut PgConnection,
    sql: &'a str,
) -> Pin<Box<dyn Future<Output = Result<Vec<PgRow>, sqlx::Error>> + Send + 'a>> {
    conn.fetch_all(sqlx::raw_sql(sql))
}

/// [`run`] on a connection of `pool`.
pub(crate) fn run_on<'a>(
    pool: &'a PgPool,
    sql: &'a str,
) -> Pin<Box<dyn Future<Output = Result<Vec<PgRow>, sqlx::Error>> + Send + 'a>> {
    pool.fetch_all(sqlx::raw_sql(sql))
}

/// The `bytea` literal of `bytes`: `'\x…'::bytea`.
fn bytea(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(bytes.len() * 2 + 12);
    text.push_str("'\\x");
    for b in bytes {
        let _ = write!(text, "{b:02x}");
    }
    text.push_str("'::bytea");
    text
}

/// The `text` literal of `s`, through its UTF-8 bytes.
fn text(s: &str) -> String {
    format!("convert_from({}, 'UTF8')", bytea(s.as_bytes()))
}

/// How a grant takes its advisory lock.
#[derive(Debug, Clone)]
pub(crate) enum XactGrab {
    /// `pg_advisory_xact_lock` (the mutex, a writer, a leadership).
    Exclusive,
    /// `pg_advisory_xact_lock_shared` (a reader).
    Shared,
    /// A permit: the count id `(count_key, max)` shared, then the first free slot.
    Permit {
        count_key: i32,
        max: u32,
        slots: Vec<i64>,
    },
}

/// The statements of one client, with its schema filled in.
#[derive(Debug)]
pub(crate) struct XactSql {
    /// The schema-qualified fencing sequence.
    sequence: String,
    /// The schema-qualified election table.
    election: String,
    /// `BEGIN` and the transaction's settings.
    begin: String,
}

impl XactSql {
    /// `schema` must be validated (see `PostgresConfig::validate`).
    pub(crate) fn new(schema: &str, session_timeout_ms: u128) -> Self {
        XactSql {
            sequence: format!("{schema}.fencing_token"),
            election: format!("{schema}.election"),
            // The server ends a transaction left idle this long (a frozen or cut-off
            // holder), closing its server connection and so its lock; checks a waiter's
            // client every second; no session-wide lock timeout.
            begin: format!(
                "BEGIN; SET LOCAL idle_in_transaction_session_timeout = {session_timeout_ms}; \
                 SET LOCAL client_connection_check_interval = {CLIENT_CHECK_INTERVAL_MS}; \
                 SET LOCAL lock_timeout = 0; "
            ),
        }
    }

    /// Begins the lease's transaction and tries `grab` on `hash` in it. One row: non-NULL
    /// when granted (for a permit, the slot taken), the
    /// other permit count in use (permits only, else `NULL`), and the server process id.
    pub(crate) fn begin_try(&self, grab: &XactGrab, hash: i64) -> String {
        let body = match grab {
            XactGrab::Exclusive => {
                format!(
                "SELECT CASE WHEN pg_try_advisory_xact_lock({hash}) THEN 1::int8 END, NULL::int8, \
                 pg_backend_pid()"
            )
            }
            XactGrab::Shared => format!(
                "SELECT CASE WHEN pg_try_advisory_xact_lock_shared({hash}) THEN 1::int8 END, NULL::int8, \
                 pg_backend_pid()"
            ),
            XactGrab::Permit {
                count_key,
                max,
                slots,
            } => {
                let slots: Vec<String> = slots.iter().map(i64::to_string).collect();
                // As the session design's permit try, without the unlock of the count
                // id (a refused try rolls the transaction back).
                format!(
                    "WITH cnt AS MATERIALIZED (SELECT pg_try_advisory_xact_lock_shared({count_key}, {max}) AS ok), \
                     other AS MATERIALIZED (SELECT cnt.ok, (SELECT min(p.objid)::int8 FROM pg_locks p \
                     WHERE cnt.ok AND p.locktype = 'advisory' AND p.granted AND p.objsubid = 2 \
                     AND p.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                     AND p.classid = {count_key}::int8::oid AND p.objid <> {max}::int8::oid \
                     AND p.objid <= {limit}::oid) AS in_use FROM cnt), \
                     slot AS MATERIALIZED (SELECT o.in_use, CASE WHEN o.ok AND o.in_use IS NULL \
                     THEN (SELECT s.k FROM unnest(ARRAY[{slots}]::int8[]) AS s(k) \
                     WHERE pg_try_advisory_xact_lock(s.k) LIMIT 1) END AS k FROM other o) \
                     SELECT s.k, s.in_use, pg_backend_pid() FROM slot s",
                    slots = slots.join(","),
                    limit = distlock_api::MAX_PERMITS,
                )
            }
        };
        format!("{}{body}", self.begin)
    }

    /// In the open transaction: waits in the server's queue for `hash` (shared or
    /// not) under `lock_timeout` (ms, `0` for none). One row: seconds waited.
    pub(crate) fn wait(&self, shared: bool, hash: i64, lock_timeout_ms: u64) -> String {
        let function = if shared {
            "pg_advisory_xact_lock_shared"
        } else {
            "pg_advisory_xact_lock"
        };
        format!(
            "SET LOCAL lock_timeout = {lock_timeout_ms}; \
             WITH lk AS MATERIALIZED (SELECT {function}({hash}) AS l) \
             SELECT extract(epoch FROM clock_timestamp() - statement_timestamp())::float8 FROM lk"
        )
    }

    /// A fencing token in a transaction of its own, committed with
    /// `synchronous_commit = on` before it is handed out: a token survives a server
    /// crash. Taken after the lock is granted, so tokens rise per key in grant order.
    pub(crate) fn token(&self) -> String {
        format!(
            "BEGIN; SET LOCAL synchronous_commit = on; SELECT nextval('{}'); COMMIT",
            self.sequence
        )
    }

    /// Records the server process `pid` as the leader of `name` in `term` (overwriting
    /// a stale row of a lower term).
    pub(crate) fn seat(&self, name: &str, candidate: &[u8], term: i64, pid: i32) -> String {
        format!(
            "INSERT INTO {table} AS e (name, candidate, term, pid) \
             VALUES ({name}, {candidate}, {term}, {pid}) ON CONFLICT (name) DO UPDATE \
             SET candidate = EXCLUDED.candidate, term = EXCLUDED.term, pid = EXCLUDED.pid \
             WHERE e.term < EXCLUDED.term",
            table = self.election,
            name = text(name),
            candidate = bytea(candidate),
        )
    }

    /// Deletes the row of `name`'s leader in `term`.
    pub(crate) fn unseat(&self, name: &str, term: i64) -> String {
        format!(
            "DELETE FROM {} WHERE name = {} AND term = {term}",
            self.election,
            text(name)
        )
    }

    /// The leader row of `name` (`candidate`, `term`) while its process holds the
    /// election's lock `hash`.
    pub(crate) fn leader(&self, name: &str, hash: i64) -> String {
        let (high, low) = pg_locks_ids(hash);
        format!(
            "SELECT e.candidate, e.term FROM {table} e WHERE e.name = {name} \
             AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' \
             AND l.granted AND l.objsubid = 1 AND l.pid = e.pid \
             AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND l.classid = {high}::int8::oid AND l.objid = {low}::int8::oid)",
            table = self.election,
            name = text(name),
        )
    }

    /// Whether anyone holds an advisory lock matching `probe`.
    pub(crate) fn held_by_anyone(&self, probe: Probe) -> String {
        let objid = match probe.objid {
            Some(objid) => format!("AND objid = {objid}::int8::oid"),
            None => String::new(),
        };
        format!(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' \
             AND granted AND objsubid = {subid} \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND classid = {classid}::int8::oid {objid})",
            subid = probe.objsubid,
            classid = probe.classid,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_carry_no_quotes_of_the_input() {
        assert_eq!(bytea(b"a'b"), "'\\x612762'::bytea");
        assert_eq!(text("x"), "convert_from('\\x78'::bytea, 'UTF8')");
        let sql = XactSql::new("distlock", 2000);
        let seat = sql.seat("it's; DROP TABLE x", b"\0'", 7, 42);
        assert!(!seat.contains("DROP"), "{seat}");
        assert!(sql.begin_try(&XactGrab::Exclusive, -5).contains("(-5)"));
    }
}
