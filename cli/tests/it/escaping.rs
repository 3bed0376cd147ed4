//! Nothing a key or a server holds reaches the operator's terminal raw (issue 20, item
//! 3): `status` and `exec` print keys, and text read from servers (a foreign holder's
//! value on Redis), with control characters escaped, and `status --json` stays valid
//! JSON that gives the key back exactly.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::process::{Command, Output};
use std::time::Duration;

use distlock::{LockKey, LockOptions};
use distlock_test_servers::{skip_or_panic, RedisServer};

/// A key that recolours a terminal, moves its cursor, reverses text and breaks lines.
const HOSTILE_KEY: &str = "esc\u{1b}[31mred\u{1b}[2J\u{9b}1m\u{202e}txt\nline\"q\\";

fn distlock(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_distlock"))
        .env_remove("DISTLOCK_BACKEND")
        .args(args)
        .output()
        .expect("the distlock binary runs")
}

/// Asserts that `bytes` carry no character a terminal would act on: no C0 control but
/// the line breaks between lines, no DEL, no C1 control, no bidi override.
fn assert_inert(what: &str, bytes: &[u8]) {
    let text = String::from_utf8(bytes.to_vec()).expect("UTF-8 output");
    for c in text.chars() {
        assert!(
            c == '\n' || !(c.is_control() || ('\u{202a}'..='\u{202e}').contains(&c)),
            "{what} carries {c:?} raw: {text:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_exec_escape_a_hostile_key_on_the_file_backend() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let locks = distlock::connect(&url).await.unwrap().lock();
    let key = LockKey::new(HOSTILE_KEY).unwrap();
    let guard = locks
        .acquire(&key, &LockOptions::new(Duration::from_secs(60)))
        .await
        .unwrap();

    let table = distlock(&["status", "--backend", &url, HOSTILE_KEY]);
    assert!(table.status.success(), "{:?}", table);
    assert_inert("status", &table.stdout);
    let shown = String::from_utf8_lossy(&table.stdout);
    assert!(
        shown.contains(&format!("{HOSTILE_KEY:?}")),
        "the key is shown quoted and escaped: {shown}"
    );

    let json = distlock(&["status", "--backend", &url, "--json", HOSTILE_KEY]);
    assert!(json.status.success(), "{:?}", json);
    assert_inert("status --json", &json.stdout);
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).expect("valid JSON");
    assert_eq!(value["key"], HOSTILE_KEY, "{value}");
    assert_eq!(value["held"], true, "{value}");

    // exec's own lines: the error for a held key, and the --verbose summary.
    let busy = distlock(&[
        "exec",
        "--backend",
        &url,
        "--no-wait",
        HOSTILE_KEY,
        "--",
        "true",
    ]);
    assert_eq!(busy.status.code(), Some(75), "{busy:?}");
    assert_inert("exec's error", &busy.stderr);
    guard.release().await.unwrap();
    let verbose = distlock(&["exec", "-v", "--backend", &url, HOSTILE_KEY, "--", "true"]);
    assert_eq!(verbose.status.code(), Some(0), "{verbose:?}");
    assert_inert("exec --verbose", &verbose.stderr);
    assert!(String::from_utf8_lossy(&verbose.stderr).contains(&format!("key={HOSTILE_KEY:?}")));
}

/// Sets Redis key `key` to `value` (expiring in a minute) over RESP, as a foreign
/// client would: no distlock code involved.
fn redis_set(port: u16, key: &str, value: &str) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut command = String::from("*5\r\n");
    for arg in ["SET", key, value, "PX", "60000"] {
        command.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream.write_all(command.as_bytes()).unwrap();
    let mut reply = [0u8; 5];
    stream.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"+OK\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_escapes_a_foreign_holders_value_read_from_redis() {
    let server = match RedisServer::start().await {
        Ok(server) => server,
        Err(e) => return skip_or_panic("status_escapes_a_foreign_holders_value", &e),
    };
    // A foreign lock on `{K}` (the layout redis-py and redsync share) whose value
    // would clear the screen and turn it red.
    redis_set(server.port(), "{jobs/foreign}", "\u{1b}[2J\u{1b}[31mgotcha");
    let url = server.url();
    let table = distlock(&["status", "--backend", &url, "jobs/foreign"]);
    assert!(table.status.success(), "{table:?}");
    assert_inert("status", &table.stdout);
    let shown = String::from_utf8_lossy(&table.stdout);
    assert!(shown.contains("held"), "{shown}");
    assert!(
        shown.contains("\\u{1b}"),
        "the holder is shown escaped: {shown}"
    );

    let json = distlock(&["status", "--backend", &url, "--json", "jobs/foreign"]);
    assert!(json.status.success(), "{json:?}");
    assert_inert("status --json", &json.stdout);
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).expect("valid JSON");
    let holder = value["holder"].as_str().expect("a holder");
    assert!(
        holder.contains('\u{1b}'),
        "JSON keeps the exact text: {value}"
    );
}
