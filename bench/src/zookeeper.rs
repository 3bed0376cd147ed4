//! ZooKeeper comparators: the raw bound (an ephemeral-sequential create + delete
//! through zookeeper-client) and zookeeper-client's own lock recipe; and the
//! server-side connection count (`mntr`).

use std::time::Duration;

use async_trait::async_trait;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use zookeeper_client as zk;

use crate::side::{BoxError, Contender, Side, PATIENCE};

/// `host:port[,…][/chroot]` from a `zookeeper://` or `zk://` URL (the query dropped).
pub(crate) fn connect_string(url: &str) -> Result<String, BoxError> {
    let rest = url
        .strip_prefix("zookeeper://")
        .or_else(|| url.strip_prefix("zk://"))
        .ok_or("not a zookeeper:// or zk:// URL")?;
    Ok(rest.split('?').next().unwrap_or(rest).to_owned())
}

async fn client(url: &str) -> Result<zk::Client, BoxError> {
    Ok(zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(&connect_string(url)?)
        .await?)
}

/// Sends a four-letter word to the first host of `url` and returns the answer.
async fn four_letter_word(url: &str, word: &str) -> Result<String, BoxError> {
    let hosts = connect_string(url)?;
    let first = hosts.split(['/', ',']).next().unwrap_or(&hosts).to_owned();
    let mut stream = tokio::net::TcpStream::connect(&first).await?;
    stream.write_all(word.as_bytes()).await?;
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut answer))
        .await
        .map_err(|_| format!("{word}: no answer"))??;
    Ok(answer)
}

/// Live client connections on the server (`mntr`'s `zk_num_alive_connections`).
pub(crate) async fn alive_connections(url: &str) -> Result<u64, BoxError> {
    let answer = four_letter_word(url, "mntr").await?;
    answer
        .lines()
        .find_map(|line| line.strip_prefix("zk_num_alive_connections"))
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| format!("mntr has no zk_num_alive_connections: {answer}").into())
}

/// The server's version (`srvr`), for the report.
pub(crate) async fn server_version(url: &str) -> Result<String, BoxError> {
    let answer = four_letter_word(url, "srvr").await?;
    Ok(answer
        .lines()
        .find_map(|line| line.strip_prefix("Zookeeper version: "))
        .map(|v| {
            // "3.8.0-${mvngit.commit.id}, built on …" in Debian's build: keep "3.8.0".
            let v = v.split([',', '-']).next().unwrap_or(v);
            format!("ZooKeeper {}", v.trim())
        })
        .unwrap_or_else(|| "ZooKeeper (version unknown)".into()))
}

/// A bare session shared by every worker, like distlock's.
pub(crate) struct Raw {
    client: zk::Client,
}

impl Raw {
    pub(crate) async fn connect(url: &str) -> Result<Self, BoxError> {
        Ok(Raw {
            client: client(url).await?,
        })
    }
}

#[async_trait]
impl Side for Raw {
    fn name(&self) -> &'static str {
        "raw"
    }

    fn waits(&self) -> bool {
        false
    }

    async fn contender(&self, _worker: usize) -> Result<Box<dyn Contender>, BoxError> {
        Ok(Box::new(RawContender {
            client: self.client.clone(),
            create: zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all()),
        }))
    }
}

struct RawContender {
    client: zk::Client,
    create: zk::CreateOptions<'static>,
}

#[async_trait]
impl Contender for RawContender {
    async fn cycle(&mut self, key: &str, held: &mut (dyn FnMut() + Send)) -> Result<(), BoxError> {
        let dir = format!("/bench/raw/{key}");
        let prefix = format!("{dir}/lock-");
        let sequence = match self.client.create(&prefix, b"", &self.create).await {
            Ok((_, sequence)) => sequence,
            Err(zk::Error::NoNode) => {
                // First use of this key: make its directory (not timed as a cycle of
                // its own, but it is inside this one; the warm-up absorbs it).
                let dir_options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                self.client.mkdir(&dir, &dir_options).await?;
                self.client.create(&prefix, b"", &self.create).await?.1
            }
            Err(e) => return Err(e.into()),
        };
        held();
        self.client
            .delete(&format!("{prefix}{sequence}"), None)
            .await?;
        Ok(())
    }
}

/// zookeeper-client's lock recipe (`Client::lock` with a Curator-compatible prefix):
/// one session shared by the workers of one client. Its release is dropping the
/// lock, which deletes the node in the background.
pub(crate) struct Recipe {
    client: zk::Client,
}

impl Recipe {
    pub(crate) async fn connect(url: &str) -> Result<Self, BoxError> {
        Ok(Recipe {
            client: client(url).await?,
        })
    }
}

#[async_trait]
impl Side for Recipe {
    fn name(&self) -> &'static str {
        "zookeeper-client lock"
    }

    async fn contender(&self, _worker: usize) -> Result<Box<dyn Contender>, BoxError> {
        Ok(Box::new(RecipeContender {
            client: self.client.clone(),
        }))
    }
}

struct RecipeContender {
    client: zk::Client,
}

#[async_trait]
impl Contender for RecipeContender {
    async fn cycle(&mut self, key: &str, held: &mut (dyn FnMut() + Send)) -> Result<(), BoxError> {
        let dir = format!("/bench/recipe/{key}");
        let options = zk::LockOptions::new(zk::Acls::anyone_all())
            .with_ancestor_options(zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()))?;
        let lock = tokio::time::timeout(
            PATIENCE,
            self.client
                .lock(zk::LockPrefix::new_curator(&dir, "lock-")?, b"", options),
        )
        .await
        .map_err(|_| "zookeeper-client lock: acquire timed out")??;
        held();
        drop(lock);
        Ok(())
    }
}
