//! The server's own compare-and-set and compare-and-delete commands, where it has them:
//! detected once per node, used instead of a script where they do the same work.
//!
//! - `SET key value IFEQ old` (Valkey 8.1, Redis 8.4): the mutex's extend is
//!   `SET {K} <owner> IFEQ <owner> PX <ttl> GET`, which rewrites the same value with a
//!   new expiry only while the owner holds the key, and answers the value it found, so
//!   "extended", "gone" and "held by another owner" stay apart as in the script. A
//!   plain command costs the server a fraction of an `EVALSHA` (see the Redis guide's
//!   "Native commands" for the figures).
//! - `DELIFEQ key value` (Valkey 9.0) and `DELEX key IFEQ value` (Redis 8.4) are
//!   detected and reported, but the release keeps its script: it must delete the key's
//!   `{K}:waiting` marker in the same step and publish a wake-up when a waiter had set
//!   it, which neither command does, and neither tells "gone" from "held by another".
//!
//! Detection asks `COMMAND INFO DELIFEQ DELEX` (an unknown command answers nil) and
//! `COMMAND DOCS SET` (a server whose `SET` takes `IFEQ` lists its token) in one
//! pipeline. A server that refuses `COMMAND` (an ACL without it) has nothing native. A
//! native command refused as a syntax error or an unknown command (a failover or
//! restart onto an older server) did nothing: the caller falls back to the script and
//! forgets the detection, so the next use detects again.

use std::sync::atomic::{AtomicU8, Ordering};

use redis::aio::ConnectionLike;
use redis::{RedisError, ServerError, Value};

/// Which native commands a server has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct NativeCommands {
    /// `SET … IFEQ …`.
    pub(crate) set_ifeq: bool,
    /// `DELIFEQ key value`.
    pub(crate) delifeq: bool,
    /// `DELEX key IFEQ value`.
    pub(crate) delex: bool,
}

/// A node's detection: not yet made, or its result. Shared by the node's clones.
#[derive(Debug, Default)]
pub(crate) struct Detected(AtomicU8);

/// The state bits of [`Detected`]: a result is stored with `KNOWN` set.
const KNOWN: u8 = 1;
const SET_IFEQ: u8 = 2;
const DELIFEQ: u8 = 4;
const DELEX: u8 = 8;

impl Detected {
    /// The stored result, if detection ran since the last [`Detected::forget`].
    pub(crate) fn get(&self) -> Option<NativeCommands> {
        let bits = self.0.load(Ordering::Relaxed);
        (bits & KNOWN != 0).then_some(NativeCommands {
            set_ifeq: bits & SET_IFEQ != 0,
            delifeq: bits & DELIFEQ != 0,
            delex: bits & DELEX != 0,
        })
    }

    /// Stores `found`.
    pub(crate) fn set(&self, found: NativeCommands) {
        let mut bits = KNOWN;
        for (has, bit) in [
            (found.set_ifeq, SET_IFEQ),
            (found.delifeq, DELIFEQ),
            (found.delex, DELEX),
        ] {
            if has {
                bits |= bit;
            }
        }
        self.0.store(bits, Ordering::Relaxed);
    }

    /// Drops the stored result: the server behind the node changed.
    pub(crate) fn forget(&self) {
        self.0.store(0, Ordering::Relaxed);
    }
}

/// Asks the server which native commands it has (two `COMMAND` queries, one round trip).
///
/// # Errors
/// The connection's errors. A refusal of `COMMAND` itself (an ACL, a proxy) is no
/// error: nothing is native then.
pub(crate) async fn detect(conn: &mut impl ConnectionLike) -> Result<NativeCommands, RedisError> {
    let mut pipe = redis::pipe();
    pipe.cmd("COMMAND")
        .arg("INFO")
        .arg("DELIFEQ")
        .arg("DELEX")
        .cmd("COMMAND")
        .arg("DOCS")
        .arg("SET")
        .ignore_errors();
    let answers: Vec<Value> = pipe.query_async(conn).await?;
    Ok(match answers.as_slice() {
        [info, docs] => commands_of(info, docs),
        _ => NativeCommands::default(),
    })
}

/// Reads the answers of `COMMAND INFO DELIFEQ DELEX` and `COMMAND DOCS SET`.
fn commands_of(info: &Value, docs: &Value) -> NativeCommands {
    let known = |entry: Option<&Value>| !matches!(entry, None | Some(Value::Nil));
    let (delifeq, delex) = match info {
        Value::Array(entries) => (known(entries.first()), known(entries.get(1))),
        _ => (false, false),
    };
    NativeCommands {
        set_ifeq: mentions_token(docs, "IFEQ"),
        delifeq,
        delex,
    }
}

/// Whether `reply` (a `COMMAND DOCS` answer, RESP2 arrays or RESP3 maps) holds the
/// string `token` as a whole value (an argument's token), not inside prose.
fn mentions_token(reply: &Value, token: &str) -> bool {
    match reply {
        Value::BulkString(bytes) => bytes.eq_ignore_ascii_case(token.as_bytes()),
        Value::SimpleString(text) => text.eq_ignore_ascii_case(token),
        Value::Array(items) | Value::Set(items) => {
            items.iter().any(|item| mentions_token(item, token))
        }
        Value::Map(pairs) => pairs
            .iter()
            .any(|(k, v)| mentions_token(k, token) || mentions_token(v, token)),
        _ => false,
    }
}

/// Whether a native command's error reply says the server does not know the command
/// or the option (so it did nothing, and the script must do the work).
pub(crate) fn not_understood(error: &ServerError) -> bool {
    let text = format!("{} {}", error.code(), error.details().unwrap_or_default());
    let text = text.to_ascii_lowercase();
    text.contains("syntax error") || text.contains("unknown command")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn reads_what_servers_answer() {
        // Redis 7.0: neither command, and SET's docs without an IFEQ token.
        let old_docs = Value::Array(vec![
            bulk("set"),
            Value::Array(vec![
                bulk("history"),
                Value::Array(vec![
                    bulk("7.0.0"),
                    bulk("Allowed the `NX` and `GET` options to be used together."),
                ]),
                bulk("arguments"),
                Value::Array(vec![bulk("token"), bulk("NX")]),
            ]),
        ]);
        let none = Value::Array(vec![Value::Nil, Value::Nil]);
        assert_eq!(commands_of(&none, &old_docs), NativeCommands::default());
        // Valkey 8.1: SET takes IFEQ (RESP3 maps), no DELIFEQ yet.
        let docs = Value::Map(vec![(
            bulk("set"),
            Value::Map(vec![(
                bulk("arguments"),
                Value::Array(vec![Value::Map(vec![
                    (bulk("name"), bulk("comparison-value")),
                    (bulk("token"), bulk("IFEQ")),
                ])]),
            )]),
        )]);
        let found = commands_of(&none, &docs);
        assert!(found.set_ifeq && !found.delifeq && !found.delex);
        // Valkey 9.0: DELIFEQ known.
        let info = Value::Array(vec![Value::Array(vec![bulk("delifeq")]), Value::Nil]);
        assert!(commands_of(&info, &docs).delifeq);
        // Prose naming IFEQ is not the token.
        let prose = Value::Array(vec![bulk("Added the `IFEQ` option.")]);
        assert!(!commands_of(&none, &prose).set_ifeq);
        // A refused COMMAND (an error in its place) means nothing native.
        let refused = Value::ServerError(parse_error("NOPERM no permission"));
        assert_eq!(commands_of(&refused, &refused), NativeCommands::default());
    }

    /// A server error reply `text`, as the driver parses it.
    fn parse_error(text: &str) -> ServerError {
        match redis::parse_redis_value(format!("-{text}\r\n").as_bytes()) {
            Ok(Value::ServerError(error)) => error,
            other => panic!("not an error reply: {other:?}"),
        }
    }

    #[test]
    fn only_refusals_of_the_syntax_fall_back() {
        assert!(not_understood(&parse_error("ERR syntax error")));
        assert!(not_understood(&parse_error(
            "ERR unknown command 'DELIFEQ', with args beginning with: 'k'"
        )));
        assert!(!not_understood(&parse_error(
            "WRONGTYPE Operation against a key holding the wrong kind of value"
        )));
        assert!(!not_understood(&parse_error(
            "READONLY You can't write against a read only replica."
        )));
    }

    #[test]
    fn detection_round_trips_and_forgets() {
        let detected = Detected::default();
        assert_eq!(detected.get(), None);
        let found = NativeCommands {
            set_ifeq: true,
            delifeq: false,
            delex: true,
        };
        detected.set(found);
        assert_eq!(detected.get(), Some(found));
        detected.set(NativeCommands::default());
        assert_eq!(detected.get(), Some(NativeCommands::default()));
        detected.forget();
        assert_eq!(detected.get(), None);
    }
}
