//! Why no server answered the session handshake: a look at each server of the
//! connect string, told in words and sorted into refusals that pass (the server is
//! restarting or not serving yet) and refusals that do not (another kind of server,
//! TLS on one side only).
//!
//! The client's eager connect ends with `NoHosts` whatever went wrong; the reason is
//! found by connecting again and asking `srvr`, which every ZooKeeper server answers
//! from the moment it listens (with "not currently serving requests" until it serves
//! sessions, or a note that the command is not whitelisted).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};

/// The longest a probe waits for a TCP connect, and then for an answer to `srvr`.
pub(crate) const PROBE_PATIENCE: Duration = Duration::from_secs(1);

/// A refusal retrying cannot fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lasting {
    /// TLS on one side only.
    TlsMismatch,
    /// Something else listens there.
    NotZooKeeper,
}

/// What one server said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Finding {
    /// A refusal that may pass: retry.
    Passing(String),
    /// A refusal retrying cannot fix.
    Lasting(Lasting, String),
}

impl Finding {
    fn words(&self) -> &str {
        match self {
            Finding::Passing(words) | Finding::Lasting(_, words) => words,
        }
    }
}

/// What the servers of a connect string said, in words (one server: its reason; more:
/// `host: reason` for each), and the lasting refusal when every server's is lasting.
pub(crate) struct Findings {
    pub(crate) words: String,
    pub(crate) lasting: Option<Lasting>,
}

/// Probes every `host:port` of `hosts` (a connect string) until `deadline`.
pub(crate) async fn probe_all(hosts: &str, tls: bool, deadline: Instant) -> Findings {
    let list: Vec<&str> = hosts.split(',').map(str::trim).collect();
    let mut findings = Vec::with_capacity(list.len());
    for host in &list {
        findings.push(probe(host, tls, deadline).await);
    }
    let lasting = findings.iter().try_fold(None, |_, finding| match finding {
        Finding::Lasting(kind, _) => Some(Some(*kind)),
        Finding::Passing(_) => None,
    });
    let lasting = lasting.flatten();
    let words = match findings.as_slice() {
        [one] => one.words().to_owned(),
        many => list
            .iter()
            .zip(many)
            .map(|(host, finding)| format!("{host}: {}", finding.words()))
            .collect::<Vec<_>>()
            .join("; "),
    };
    Findings { words, lasting }
}

/// Connects to `host` and asks `srvr`.
pub(crate) async fn probe(host: &str, tls: bool, deadline: Instant) -> Finding {
    let patience = deadline.min(Instant::now() + PROBE_PATIENCE);
    let mut stream = match timeout_at(patience, TcpStream::connect(host)).await {
        Err(_) => return Finding::Passing("no answer to a TCP connect".to_owned()),
        Ok(Err(error)) => return Finding::Passing(distlock_api::in_words(&error)),
        Ok(Ok(stream)) => stream,
    };
    let patience = deadline.min(Instant::now() + PROBE_PATIENCE);
    let mut reply = Vec::new();
    let asked = timeout_at(patience, async {
        stream.write_all(b"srvr\n").await?;
        let mut chunk = [0u8; 512];
        loop {
            let n = stream.read(&mut chunk).await?;
            if n == 0 || reply.len() >= 4096 {
                return Ok::<_, std::io::Error>(());
            }
            reply.extend_from_slice(&chunk[..n]);
        }
    })
    .await;
    let finding = classify(&reply, tls, asked.is_err());
    if reply.is_empty() && !tls && asked.is_ok() && speaks_tls(host, deadline).await {
        return Finding::Lasting(
            Lasting::TlsMismatch,
            "the server speaks TLS on this port: use a zookeeper+tls:// URL".to_owned(),
        );
    }
    finding
}

/// A TLS 1.2 ClientHello (no extensions, three common cipher suites): enough for a
/// TLS server to answer with a handshake record or an alert, either of which shows
/// that it speaks TLS.
fn client_hello() -> Vec<u8> {
    let mut body = vec![0x03, 0x03]; // TLS 1.2
    body.extend_from_slice(&[0x5a; 32]); // random
    body.push(0x00); // no session id
    body.extend_from_slice(&[0x00, 0x06, 0xc0, 0x2b, 0xc0, 0x2f, 0x13, 0x01]); // suites
    body.extend_from_slice(&[0x01, 0x00]); // no compression
    let mut handshake = vec![0x01, 0x00, 0x00, body.len() as u8]; // ClientHello
    handshake.extend_from_slice(&body);
    let mut record = vec![0x16, 0x03, 0x01, 0x00, handshake.len() as u8];
    record.extend_from_slice(&handshake);
    record
}

/// Whether `host` answers a TLS ClientHello with a TLS record.
async fn speaks_tls(host: &str, deadline: Instant) -> bool {
    let patience = deadline.min(Instant::now() + PROBE_PATIENCE);
    let answered = timeout_at(patience, async {
        let mut stream = TcpStream::connect(host).await?;
        stream.write_all(&client_hello()).await?;
        let mut head = [0u8; 2];
        stream.read_exact(&mut head).await?;
        Ok::<_, std::io::Error>(head)
    })
    .await;
    matches!(answered, Ok(Ok([0x15 | 0x16, 0x03])))
}

/// Sorts a reply to `srvr` (`cut`: no end of the reply within the probe's patience).
fn classify(reply: &[u8], tls: bool, cut: bool) -> Finding {
    let text = String::from_utf8_lossy(reply);
    let zookeeper = text.contains("Zookeeper version")
        || text.contains("not currently serving requests")
        || text.contains("not in the whitelist")
        || text.contains("not executed because");
    if reply.starts_with(&[0x15, 0x03]) || reply.starts_with(&[0x16, 0x03]) {
        return if tls {
            Finding::Passing(
                "the TLS session failed (check that the URL's ca= file signs the server's \
                 certificate, issued for this host name, and whether the server wants a \
                 client certificate: cert=, key=)"
                    .to_owned(),
            )
        } else {
            Finding::Lasting(
                Lasting::TlsMismatch,
                "the server speaks TLS on this port: use a zookeeper+tls:// URL".to_owned(),
            )
        };
    }
    if zookeeper && tls {
        return Finding::Lasting(
            Lasting::TlsMismatch,
            "the server answers in plaintext on this port, not TLS: use a zookeeper:// URL, \
             or the port of the server's secureClientPort"
                .to_owned(),
        );
    }
    if text.contains("not currently serving requests") {
        return Finding::Passing("the server is not serving requests yet".to_owned());
    }
    if zookeeper {
        return Finding::Passing(
            "the server is up but did not answer the session handshake".to_owned(),
        );
    }
    if reply.is_empty() {
        let what = if cut {
            "the server accepted the connection but did not answer"
        } else {
            "the server closed the connection without answering"
        };
        let hint = if tls {
            " (over TLS: is this the server's secureClientPort, and does the URL's ca= \
             file sign its certificate, issued for this host name?)"
        } else {
            " (if it serves TLS on this port, use a zookeeper+tls:// URL)"
        };
        return Finding::Passing(format!("{what}{hint}"));
    }
    let first_line: String = text
        .lines()
        .next()
        .unwrap_or("")
        .chars()
        .filter(|c| !c.is_control())
        .take(80)
        .collect();
    Finding::Lasting(
        Lasting::NotZooKeeper,
        format!(
            "not a ZooKeeper server: it answered the four-letter word `srvr` with {first_line:?}"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_sort_into_passing_and_lasting() {
        let not_serving = b"This ZooKeeper instance is not currently serving requests\n";
        assert!(matches!(
            classify(not_serving, false, false),
            Finding::Passing(_)
        ));
        assert!(matches!(
            classify(b"Zookeeper version: 3.8.4\nMode: standalone\n", true, false),
            Finding::Lasting(Lasting::TlsMismatch, _)
        ));
        assert!(matches!(
            classify(b"-ERR unknown command 'srvr'\r\n", false, false),
            Finding::Lasting(Lasting::NotZooKeeper, w) if w.contains("not a ZooKeeper server")
        ));
        assert!(matches!(
            classify(&[0x15, 0x03, 0x03, 0x00, 0x02], false, false),
            Finding::Lasting(Lasting::TlsMismatch, _)
        ));
        assert!(matches!(classify(b"", false, true), Finding::Passing(_)));
    }
}
