//! The SQL this backend runs, and the idempotent creation of its schema.

use std::future::Future;
use std::pin::Pin;

use distlock_api::LockError;
use sqlx::{Connection, PgConnection};

use crate::error::lock_error;
use crate::POSTGRES_BACKEND;

/// The two-`int4` advisory key that serialises schema creation across clients. The
/// two-key form (`objsubid` 2) never collides with the `bigint` keys of locks.
const SETUP_LOCK: (i32, i32) = (0x6469_7374, 0x6c6f_636b); // "dist", "lock"

/// Every statement, with the fencing sequence's name filled in.
#[derive(Debug)]
pub(crate) struct Statements {
    /// The schema-qualified fencing sequence.
    pub sequence: String,
    /// `$1 int8[]`: try-locks each key; returns `(key, token or NULL when held)`.
    pub try_grant: String,
    /// `$1 int8`: [`Statements::try_grant`] for one key (cheaper): the token or NULL.
    pub try_grant_one: String,
    /// `$1 int8, $2 text` (lock_timeout in ms, `0` for none): waits in the server's
    /// queue; returns `(token, seconds waited on the server)`.
    pub wait_grant: String,
    /// [`Statements::wait_grant`] taking the key shared (`pg_advisory_lock_shared`).
    pub wait_grant_shared: String,
    /// `$1 int8`: `pg_try_advisory_lock_shared`; returns `(token or NULL when refused,
    /// 0)`, shaped as [`Statements::wait_grant`].
    pub try_grant_shared: String,
    /// `$1 int4` count key, `$2 int4` permit count, `$3 int8[]` slot keys: one permit
    /// try. Takes the count id `($1, $2)` shared, then reads `pg_locks` for a count id
    /// `($1, m)` with another `m` held by anyone; if there is none, try-locks the slots
    /// in order, stopping at the first granted. Unless a slot was granted, lets the
    /// count id go again. Returns `(token or NULL, the other count or NULL)`. Each step
    /// is a materialised CTE that reads the one before, so they run in this order.
    pub permit_try: String,
    /// Unlocks every advisory lock of the session: the release of a dedicated
    /// session's only grant (a read, or a permit's slot and count id).
    pub unlock_all: &'static str,
    /// `$1, $2` (`pg_locks` ids): after a lock-timeout error, the token if the lock was
    /// granted to this session after all (the lock is then kept), else NULL.
    pub granted_after_timeout: String,
    /// `$1 int8[]`: unlocks each key; returns `(key, whether it was held)`.
    pub unlock: &'static str,
    /// `$1 int8`: [`Statements::unlock`] for one key.
    pub unlock_one: &'static str,
    /// `$1 int8[]`: unlocks those of the keys this session holds, per `pg_locks`.
    pub unlock_any_held: &'static str,
    /// A round trip proving the session is alive.
    pub ping: &'static str,
    /// `$1, $2, $3` (`pg_locks` `classid`, `objid` or NULL for any, `objsubid`): whether
    /// any session of this database holds such an advisory lock.
    pub held_by_anyone: &'static str,
    /// `$1 int8`: transaction-scoped try-lock; the token, or NULL when held.
    pub xact_try: String,
    /// `$1 int8, $2 text` (lock_timeout in ms, `0` for none): transaction-scoped wait;
    /// the token.
    pub xact_wait: String,
    /// The schema-qualified table of election leaders: one row per election name.
    pub election_table: String,
    /// `$1 text` name, `$2 bytea` candidate, `$3 int8` term: records this session as the
    /// name's leader (run by the session that was just granted the election's lock);
    /// overwrites a stale row of a lower term.
    pub seat: String,
    /// `$1 text[]` names, `$2 int8[]` terms: deletes those leaders' rows (each only in
    /// its own term).
    pub unseat: String,
    /// `$1 text` name, `$2, $3` (`pg_locks` ids of its advisory key): the row's
    /// `(candidate, term)` if the session that wrote it holds the election's lock now.
    pub leader: String,
}

impl Statements {
    pub(crate) fn new(schema: &str) -> Self {
        // `schema` was validated as a plain lowercase identifier: no quoting needed.
        let sequence = format!("{schema}.fencing_token");
        Statements {
            try_grant: format!(
                "SELECT t.k, CASE WHEN pg_try_advisory_lock(t.k) THEN nextval('{sequence}') END \
                 FROM unnest($1::int8[]) AS t(k)"
            ),
            wait_grant: format!(
                "WITH cfg AS MATERIALIZED (SELECT set_config('lock_timeout', $2, false) AS v), \
                 lk AS MATERIALIZED (SELECT pg_advisory_lock($1) AS l FROM cfg) \
                 SELECT nextval('{sequence}'), \
                 extract(epoch FROM clock_timestamp() - statement_timestamp())::float8 FROM lk"
            ),
            wait_grant_shared: format!(
                "WITH cfg AS MATERIALIZED (SELECT set_config('lock_timeout', $2, false) AS v), \
                 lk AS MATERIALIZED (SELECT pg_advisory_lock_shared($1) AS l FROM cfg) \
                 SELECT nextval('{sequence}'), \
                 extract(epoch FROM clock_timestamp() - statement_timestamp())::float8 FROM lk"
            ),
            try_grant_shared: format!(
                "SELECT CASE WHEN pg_try_advisory_lock_shared($1) THEN nextval('{sequence}') END, \
                 0::float8"
            ),
            permit_try: format!(
                "WITH cnt AS MATERIALIZED (SELECT pg_try_advisory_lock_shared($1::int4, $2::int4) AS ok), \
                 other AS MATERIALIZED (SELECT cnt.ok, (SELECT min(p.objid)::int8 FROM pg_locks p \
                 WHERE cnt.ok AND p.locktype = 'advisory' AND p.granted AND p.objsubid = 2 \
                 AND p.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                 AND p.classid = $1::int8::oid AND p.objid <> $2::int8::oid \
                 AND p.objid <= {max}::oid) AS in_use FROM cnt), \
                 slot AS MATERIALIZED (SELECT o.ok, o.in_use, CASE WHEN o.ok AND o.in_use IS NULL \
                 THEN (SELECT s.k FROM unnest($3::int8[]) AS s(k) \
                 WHERE pg_try_advisory_lock(s.k) LIMIT 1) END AS k FROM other o), \
                 done AS MATERIALIZED (SELECT s.in_use, s.k, CASE WHEN s.ok AND s.k IS NULL \
                 THEN pg_advisory_unlock_shared($1::int4, $2::int4) END AS u FROM slot s) \
                 SELECT CASE WHEN d.k IS NOT NULL THEN nextval('{sequence}') END, d.in_use \
                 FROM done d",
                max = distlock_api::MAX_PERMITS
            ),
            unlock_all: "SELECT pg_advisory_unlock_all()",
            granted_after_timeout: format!(
                "SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' \
                 AND pid = pg_backend_pid() AND granted AND objsubid = 1 \
                 AND classid = $1::int8::oid AND objid = $2::int8::oid) \
                 THEN nextval('{sequence}') END"
            ),
            try_grant_one: format!(
                "SELECT CASE WHEN pg_try_advisory_lock($1) THEN nextval('{sequence}') END"
            ),
            unlock: "SELECT t.k, pg_advisory_unlock(t.k) FROM unnest($1::int8[]) AS t(k)",
            unlock_one: "SELECT $1::int8, pg_advisory_unlock($1)",
            unlock_any_held: "SELECT t.k, pg_advisory_unlock(t.k) FROM unnest($1::int8[]) AS t(k) \
                 WHERE EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' \
                 AND l.pid = pg_backend_pid() AND l.granted AND l.objsubid = 1 \
                 AND l.classid = ((t.k >> 32) & 4294967295)::oid \
                 AND l.objid = (t.k & 4294967295)::oid)",
            ping: "SELECT 1::int4",
            held_by_anyone: "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' \
                 AND granted AND objsubid = $3::int4 \
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                 AND classid = $1::int8::oid AND ($2::int8 IS NULL OR objid = $2::int8::oid))",
            xact_try: format!(
                "SELECT CASE WHEN pg_try_advisory_xact_lock($1) THEN nextval('{sequence}') END"
            ),
            xact_wait: format!(
                "WITH cfg AS MATERIALIZED (SELECT set_config('lock_timeout', $2, true) AS v), \
                 lk AS MATERIALIZED (SELECT pg_advisory_xact_lock($1) AS l FROM cfg) \
                 SELECT nextval('{sequence}') FROM lk"
            ),
            election_table: format!("{schema}.election"),
            seat: format!(
                "INSERT INTO {schema}.election AS e (name, candidate, term, pid) \
                 VALUES ($1, $2, $3, pg_backend_pid()) ON CONFLICT (name) DO UPDATE \
                 SET candidate = EXCLUDED.candidate, term = EXCLUDED.term, pid = EXCLUDED.pid \
                 WHERE e.term < EXCLUDED.term"
            ),
            unseat: format!(
                "DELETE FROM {schema}.election e USING unnest($1::text[], $2::int8[]) AS u(n, t) \
                 WHERE e.name = u.n AND e.term = u.t"
            ),
            leader: format!(
                "SELECT e.candidate, e.term FROM {schema}.election e WHERE e.name = $1 \
                 AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' \
                 AND l.granted AND l.objsubid = 1 AND l.pid = e.pid \
                 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                 AND l.classid = $2::int8::oid AND l.objid = $3::int8::oid)"
            ),
            sequence,
        }
    }
}

/// Creates the schema and fencing sequence if missing, and checks the sequence
/// hands out values in call order across sessions (`CACHE 1`).
///
/// Idempotent and safe to run from many clients at once: creation happens under a
/// transaction-scoped advisory lock.
///
/// # Errors
/// [`LockError::Config`] when the objects are missing and this user may not create
/// them, or the sequence has a cache; connection errors otherwise.
pub(crate) fn ensure_schema<'a>(
    conn: &'a mut PgConnection,
    schema: &'a str,
    statements: &'a Statements,
) -> Pin<Box<dyn Future<Output = Result<(), LockError>> + Send + 'a>> {
    // Boxed with its `Send` bound spelled out: sqlx's executor impls otherwise make
    // callers' futures fail "not general enough" checks when they are boxed as `Send`.
    Box::pin(ensure_schema_inner(conn, schema, statements))
}

async fn ensure_schema_inner(
    conn: &mut PgConnection,
    schema: &str,
    statements: &Statements,
) -> Result<(), LockError> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(statements.sequence.clone())
        .persistent(false)
        .fetch_one(&mut *conn)
        .await
        .map_err(lock_error)?;
    if !exists {
        create_schema(conn, schema, statements)
            .await
            .map_err(|e| match e {
                LockError::Backend { source, .. } => LockError::Config {
                    backend: POSTGRES_BACKEND,
                    message: format!(
                        "could not create the fencing sequence {seq}; have an owner run once: \
                         CREATE SCHEMA IF NOT EXISTS {schema}; \
                         CREATE SEQUENCE IF NOT EXISTS {seq} AS bigint MINVALUE 1 NO CYCLE",
                        seq = statements.sequence
                    ),
                    source: Some(source),
                },
                other => other,
            })?;
    }
    let cache: i64 = sqlx::query_scalar(
        "SELECT seqcache FROM pg_catalog.pg_sequence WHERE seqrelid = to_regclass($1)",
    )
    .bind(statements.sequence.clone())
    .persistent(false)
    .fetch_optional(&mut *conn)
    .await
    .map_err(lock_error)?
    .ok_or_else(|| {
        LockError::config(
            POSTGRES_BACKEND,
            format!("{} exists but is not a sequence", statements.sequence),
        )
    })?;
    if cache != 1 {
        return Err(LockError::config(
            POSTGRES_BACKEND,
            format!(
                "the fencing sequence {} has CACHE {cache}; it must be CACHE 1, or tokens from \
                 different sessions would not increase in grant order",
                statements.sequence
            ),
        ));
    }
    Ok(())
}

async fn create_schema(
    conn: &mut PgConnection,
    schema: &str,
    statements: &Statements,
) -> Result<(), LockError> {
    let mut tx = conn.begin().await.map_err(lock_error)?;
    sqlx::query("SELECT pg_advisory_xact_lock($1, $2)")
        .bind(SETUP_LOCK.0)
        .bind(SETUP_LOCK.1)
        .persistent(false)
        .execute(&mut *tx)
        .await
        .map_err(lock_error)?;
    for ddl in [
        format!("CREATE SCHEMA IF NOT EXISTS {schema}"),
        format!(
            "CREATE SEQUENCE IF NOT EXISTS {} AS bigint MINVALUE 1 NO CYCLE CACHE 1",
            statements.sequence
        ),
        format!(
            "COMMENT ON SEQUENCE {} IS 'distlock fencing tokens: every lock grant takes nextval; \
             must stay CACHE 1'",
            statements.sequence
        ),
    ] {
        sqlx::query(&ddl)
            .persistent(false)
            .execute(&mut *tx)
            .await
            .map_err(lock_error)?;
    }
    tx.commit().await.map_err(lock_error)
}

/// Creates the election table if missing: `(name text PRIMARY KEY, candidate bytea,
/// term bigint, pid int4)`, serialised as [`ensure_schema`]'s creation is. Run on the
/// first use of an election handle, so that clients that never elect need no right to
/// create it.
///
/// # Errors
/// [`LockError::Config`] when the table is missing and this user may not create it;
/// connection errors otherwise.
pub(crate) fn ensure_election_table<'a>(
    conn: &'a mut PgConnection,
    schema: &'a str,
    statements: &'a Statements,
) -> Pin<Box<dyn Future<Output = Result<(), LockError>> + Send + 'a>> {
    Box::pin(async move {
        let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(statements.election_table.clone())
            .persistent(false)
            .fetch_one(&mut *conn)
            .await
            .map_err(lock_error)?;
        if exists {
            return Ok(());
        }
        let ddl = format!(
            "CREATE TABLE IF NOT EXISTS {} (name text PRIMARY KEY, candidate bytea NOT NULL, \
             term bigint NOT NULL, pid int4 NOT NULL)",
            statements.election_table
        );
        let create = async {
            let mut tx = conn.begin().await.map_err(lock_error)?;
            sqlx::query("SELECT pg_advisory_xact_lock($1, $2)")
                .bind(SETUP_LOCK.0)
                .bind(SETUP_LOCK.1)
                .persistent(false)
                .execute(&mut *tx)
                .await
                .map_err(lock_error)?;
            for statement in [
                ddl.clone(),
                format!(
                    "COMMENT ON TABLE {} IS 'distlock election leaders: a row counts only while \
                     its pid holds the election''s advisory lock'",
                    statements.election_table
                ),
            ] {
                sqlx::query(&statement)
                    .persistent(false)
                    .execute(&mut *tx)
                    .await
                    .map_err(lock_error)?;
            }
            tx.commit().await.map_err(lock_error)
        };
        create.await.map_err(|e| match e {
            LockError::Backend { source, .. } => LockError::Config {
                backend: POSTGRES_BACKEND,
                message: format!(
                    "could not create the election table {}; have an owner run once: \
                     CREATE SCHEMA IF NOT EXISTS {schema}; {ddl}",
                    statements.election_table
                ),
                source: Some(source),
            },
            other => other,
        })
    })
}
