//! [`BackendReport`]: the figures of one run, as Markdown tables or JSON.

use std::fmt;
use std::time::Duration;

use serde::Serialize;

use crate::measure::{coefficient_of_variation, median, quantile, spread, HotKey};
use crate::BenchConfig;

/// Everything one run measured on one backend.
#[derive(Debug, Clone, Serialize)]
pub struct BackendReport {
    /// Backend name (Redis, Postgres, ZooKeeper).
    pub backend: String,
    /// Server name and version, as the server reports it.
    pub server: String,
    /// Alternating rounds per concurrency.
    pub rounds: usize,
    /// Measured length of one turn, in milliseconds.
    pub slice_ms: u64,
    /// Workers on the hot key.
    pub hot_workers: usize,
    /// A hot-key worker's pause after each release, milliseconds.
    pub think_ms: f64,
    /// The sides measured, distlock first.
    pub sides: Vec<String>,
    /// Uncontended cycles per concurrency.
    pub throughput: Vec<ThroughputRow>,
    /// Acquire latency per concurrency and side.
    pub latency: Vec<LatencyRow>,
    /// The hot key, per side that can wait.
    pub handoff: Vec<HandoffRow>,
    /// The cost of holding many locks with distlock.
    pub holding: Option<HoldingRow>,
    /// Comparators left out and why.
    pub notes: Vec<String>,
    /// Sorted samples for the plots.
    #[serde(skip)]
    pub(crate) samples: Samples,
}

/// Sorted per-operation samples kept for plotting.
#[derive(Debug, Clone, Default)]
pub(crate) struct Samples {
    /// (concurrency, side, sorted acquire latencies)
    pub(crate) latency: Vec<(usize, String, Vec<Duration>)>,
    /// (side, sorted hand-offs)
    pub(crate) handoff: Vec<(String, Vec<Duration>)>,
}

/// Uncontended acquire + release cycles per second at one concurrency.
#[derive(Debug, Clone, Serialize)]
pub struct ThroughputRow {
    /// The keys: `reused` (each worker its own, again and again) or `fresh` (a new key
    /// per cycle).
    pub keys: String,
    /// Concurrent workers.
    pub concurrency: usize,
    /// Each side's rate over the rounds.
    pub rates: Vec<SideRate>,
    /// distlock's rate over each comparator's, per round.
    pub ratios: Vec<Ratio>,
    /// CPU time per cycle, per side.
    pub cpu: Vec<SideCpu>,
}

/// CPU time per cycle of one side (median over rounds), the profile behind a ratio:
/// client and server share the machine's cores.
#[derive(Debug, Clone, Serialize)]
pub struct SideCpu {
    /// The side.
    pub side: String,
    /// This process's CPU per cycle, microseconds.
    pub client_us: f64,
    /// The server's CPU per cycle, microseconds, where it is known (Redis's `INFO
    /// cpu`; the `/proc` times of a server process on this machine).
    pub server_us: Option<f64>,
}

/// One side's cycles per second over the rounds.
#[derive(Debug, Clone, Serialize)]
pub struct SideRate {
    /// The side.
    pub side: String,
    /// Median over rounds.
    pub median: f64,
    /// Slowest round.
    pub min: f64,
    /// Fastest round.
    pub max: f64,
}

/// distlock / a comparator, taken within each round.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    /// The comparator.
    pub versus: String,
    /// Median over rounds.
    pub median: f64,
    /// Lowest round.
    pub min: f64,
    /// Highest round.
    pub max: f64,
}

/// Acquire latency percentiles of one side at one concurrency, over all rounds.
#[derive(Debug, Clone, Serialize)]
pub struct LatencyRow {
    /// The keys, as [`ThroughputRow::keys`].
    pub keys: String,
    /// Concurrent workers.
    pub concurrency: usize,
    /// The side.
    pub side: String,
    /// Acquires sampled.
    pub samples: usize,
    /// Median, microseconds.
    pub p50_us: f64,
    /// 99th percentile, microseconds.
    pub p99_us: f64,
    /// 99.9th percentile, microseconds.
    pub p999_us: f64,
}

/// One side on the hot key.
#[derive(Debug, Clone, Serialize)]
pub struct HandoffRow {
    /// The side.
    pub side: String,
    /// Hand-offs measured.
    pub handoffs: usize,
    /// Median release-to-next-grant, microseconds.
    pub p50_us: f64,
    /// 99th percentile, microseconds.
    pub p99_us: f64,
    /// Grants that went straight back to the worker that had just released.
    pub regrants: u64,
    /// Median wait of a grant (acquire called → granted), microseconds.
    pub wait_p50_us: f64,
    /// 99th percentile wait, microseconds.
    pub wait_p99_us: f64,
    /// Grants per second over the run.
    pub acquisitions_per_s: f64,
    /// Fewest grants any worker had.
    pub min_per_worker: u64,
    /// Most grants any worker had.
    pub max_per_worker: u64,
    /// Coefficient of variation of grants per worker (0 is perfectly fair).
    pub cv: f64,
}

/// Holding many locks at once with one distlock client.
#[derive(Debug, Clone, Serialize)]
pub struct HoldingRow {
    /// Locks held at once.
    pub locks: usize,
    /// Client connections on the server before connecting (the probe's own included).
    pub connections_before: u64,
    /// Client connections on the server while all locks were held (probe included).
    pub connections_held: u64,
    /// Growth of the process's resident memory, KiB.
    pub rss_delta_kib: i64,
    /// Time to acquire them all (64 at a time), seconds.
    pub acquire_s: f64,
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

impl BackendReport {
    pub(crate) fn new(backend: &str, server: String, config: &BenchConfig, sides: &[&str]) -> Self {
        BackendReport {
            backend: backend.to_owned(),
            server,
            rounds: config.rounds,
            slice_ms: u64::try_from(config.slice.as_millis()).unwrap_or(u64::MAX),
            hot_workers: config.hot_workers,
            think_ms: config.think.as_secs_f64() * 1e3,
            sides: sides.iter().map(|s| (*s).to_owned()).collect(),
            throughput: Vec::new(),
            latency: Vec::new(),
            handoff: Vec::new(),
            holding: None,
            notes: Vec::new(),
            samples: Samples::default(),
        }
    }

    /// `rates[side][round]`, `None` where the side did not run.
    pub(crate) fn add_throughput(
        &mut self,
        keys: &str,
        concurrency: usize,
        rates: &[Vec<Option<f64>>],
        cpu: &[(Vec<f64>, Vec<f64>)],
    ) {
        let mut row = ThroughputRow {
            keys: keys.to_owned(),
            concurrency,
            rates: Vec::new(),
            ratios: Vec::new(),
            cpu: Vec::new(),
        };
        for (side, (client, server)) in self.sides.iter().zip(cpu) {
            if client.is_empty() {
                continue;
            }
            row.cpu.push(SideCpu {
                side: side.clone(),
                client_us: median(client),
                server_us: (!server.is_empty()).then(|| median(server)),
            });
        }
        let ours = rates.first().cloned().unwrap_or_default();
        for (side, side_rates) in self.sides.iter().zip(rates) {
            let values: Vec<f64> = side_rates.iter().flatten().copied().collect();
            if values.is_empty() {
                continue;
            }
            let (min, max) = spread(&values);
            row.rates.push(SideRate {
                side: side.clone(),
                median: median(&values),
                min,
                max,
            });
        }
        for (side, side_rates) in self.sides.iter().zip(rates).skip(1) {
            let ratios: Vec<f64> = ours
                .iter()
                .zip(side_rates)
                .filter_map(|(o, s)| Some((*o)? / (*s)?))
                .collect();
            if ratios.is_empty() {
                continue;
            }
            let (min, max) = spread(&ratios);
            row.ratios.push(Ratio {
                versus: side.clone(),
                median: median(&ratios),
                min,
                max,
            });
        }
        self.throughput.push(row);
    }

    /// `latencies[side]`: every acquire's latency over the rounds; `plotted`: whether
    /// they go into the plot too.
    pub(crate) fn add_latency(
        &mut self,
        keys: &str,
        concurrency: usize,
        latencies: Vec<Vec<Duration>>,
        plotted: bool,
    ) {
        for (side, mut samples) in self.sides.clone().into_iter().zip(latencies) {
            if samples.is_empty() {
                continue;
            }
            samples.sort();
            self.latency.push(LatencyRow {
                keys: keys.to_owned(),
                concurrency,
                side: side.clone(),
                samples: samples.len(),
                p50_us: us(quantile(&samples, 0.50)),
                p99_us: us(quantile(&samples, 0.99)),
                p999_us: us(quantile(&samples, 0.999)),
            });
            if plotted {
                self.samples.latency.push((concurrency, side, samples));
            }
        }
    }

    pub(crate) fn add_handoff(&mut self, side: &str, hot: HotKey) {
        let mut handoffs = hot.handoffs;
        handoffs.sort();
        let mut waits = hot.waits;
        waits.sort();
        let grants: u64 = hot.per_worker.iter().sum();
        let seconds = hot.elapsed.as_secs_f64();
        self.handoff.push(HandoffRow {
            side: side.to_owned(),
            handoffs: handoffs.len(),
            regrants: hot.regrants,
            wait_p50_us: us(quantile(&waits, 0.50)),
            wait_p99_us: us(quantile(&waits, 0.99)),
            p50_us: us(quantile(&handoffs, 0.50)),
            p99_us: us(quantile(&handoffs, 0.99)),
            acquisitions_per_s: if seconds > 0.0 {
                grants.saturating_sub(1) as f64 / seconds
            } else {
                0.0
            },
            min_per_worker: hot.per_worker.iter().copied().min().unwrap_or(0),
            max_per_worker: hot.per_worker.iter().copied().max().unwrap_or(0),
            cv: coefficient_of_variation(&hot.per_worker),
        });
        self.samples.handoff.push((side.to_owned(), handoffs));
    }
}

/// `12 345` style thousands.
fn thousands(v: f64) -> String {
    let digits = format!("{:.0}", v.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

fn ms(micros: f64) -> String {
    if micros >= 100_000.0 {
        format!("{:.0}", micros / 1e3)
    } else if micros >= 1_000.0 {
        format!("{:.1}", micros / 1e3)
    } else {
        format!("{:.3}", micros / 1e3)
    }
}

/// How a key mode is named in headings.
fn keys_heading(mode: &str) -> &'static str {
    match mode {
        "fresh" => "a fresh key per cycle",
        _ => "each worker reusing its own key",
    }
}

impl BackendReport {
    /// The throughput, CPU and latency tables of one key mode.
    fn fmt_uncontended(&self, f: &mut fmt::Formatter<'_>, mode: &str) -> fmt::Result {
        let throughput: Vec<&ThroughputRow> =
            self.throughput.iter().filter(|r| r.keys == mode).collect();
        writeln!(
            f,
            "\n### Uncontended cycles/s, {} (median of {} alternating rounds of {} ms; ratio: median (min–max) of per-round ratios)\n",
            keys_heading(mode),
            self.rounds,
            self.slice_ms
        )?;
        let others: Vec<&String> = self.sides.iter().skip(1).collect();
        write!(f, "| concurrency |")?;
        for side in &self.sides {
            write!(f, " {side} |")?;
        }
        for other in &others {
            write!(f, " distlock/{other} |")?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "|---:|{}",
            "---:|".repeat(self.sides.len() + others.len())
        )?;
        for row in &throughput {
            write!(f, "| {} |", row.concurrency)?;
            for side in &self.sides {
                match row.rates.iter().find(|r| &r.side == side) {
                    Some(r) => write!(f, " {} |", thousands(r.median))?,
                    None => write!(f, " – |")?,
                }
            }
            for other in &others {
                match row.ratios.iter().find(|r| &r.versus == *other) {
                    Some(r) => write!(f, " {:.2} ({:.2}–{:.2}) |", r.median, r.min, r.max)?,
                    None => write!(f, " – |")?,
                }
            }
            writeln!(f)?;
        }

        writeln!(
            f,
            "\n### CPU per cycle, {}, µs (median over rounds; client = this whole process + server: Redis `INFO cpu`, another local server's process tree from /proc, else n/a)\n",
            keys_heading(mode)
        )?;
        write!(f, "| concurrency |")?;
        for side in &self.sides {
            write!(f, " {side} |")?;
        }
        writeln!(f)?;
        writeln!(f, "|---:|{}", "---:|".repeat(self.sides.len()))?;
        for row in &throughput {
            write!(f, "| {} |", row.concurrency)?;
            for side in &self.sides {
                match row.cpu.iter().find(|c| &c.side == side) {
                    Some(SideCpu {
                        client_us,
                        server_us: Some(server),
                        ..
                    }) => write!(f, " {client_us:.1} + {server:.1} |")?,
                    Some(c) => write!(f, " {:.1} + n/a |", c.client_us)?,
                    None => write!(f, " – |")?,
                }
            }
            writeln!(f)?;
        }
        writeln!(
            f,
            "\n### Acquire latency, {} (ms, every acquire of the rounds above)\n",
            keys_heading(mode)
        )?;
        writeln!(f, "| concurrency | side | p50 | p99 | p99.9 | samples |")?;
        writeln!(f, "|---:|---|---:|---:|---:|---:|")?;
        for row in self.latency.iter().filter(|r| r.keys == mode) {
            writeln!(
                f,
                "| {} | {} | {} | {} | {} | {} |",
                row.concurrency,
                row.side,
                ms(row.p50_us),
                ms(row.p99_us),
                ms(row.p999_us),
                thousands(row.samples as f64)
            )?;
        }
        Ok(())
    }
}

impl fmt::Display for BackendReport {
    /// Markdown: a heading, then one table per measurement.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "## {} ({})", self.backend, self.server)?;
        let mut modes: Vec<&str> = Vec::new();
        for row in &self.throughput {
            if !modes.contains(&row.keys.as_str()) {
                modes.push(&row.keys);
            }
        }
        for mode in modes {
            self.fmt_uncontended(f, mode)?;
        }
        writeln!(
            f,
            "\n### Hot key ({} workers on one key, each its own client (`{}`: all sharing one), pausing {} ms after each release; hand-off = holder's release starting → another worker granted; wait = acquire called → granted; ms)\n",
            self.hot_workers,
            crate::OURS_SHARED,
            self.think_ms
        )?;
        writeln!(
            f,
            "| side | hand-offs | p50 | p99 | p50 vs distlock | wait p50 | wait p99 | acquisitions/s | re-grants to the releaser | per worker min–max | CV |"
        )?;
        writeln!(f, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")?;
        let ours_p50 = self
            .handoff
            .iter()
            .find(|r| r.side == "distlock")
            .map(|r| r.p50_us);
        for row in &self.handoff {
            let versus = match ours_p50 {
                Some(o) if o > 0.0 => format!("{:.1}×", row.p50_us / o),
                _ => "–".into(),
            };
            writeln!(
                f,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {}–{} | {:.2} |",
                row.side,
                row.handoffs,
                ms(row.p50_us),
                ms(row.p99_us),
                versus,
                ms(row.wait_p50_us),
                ms(row.wait_p99_us),
                thousands(row.acquisitions_per_s),
                row.regrants,
                row.min_per_worker,
                row.max_per_worker,
                row.cv
            )?;
        }

        if let Some(h) = &self.holding {
            writeln!(f, "\n### Cost of holding (one distlock client)\n")?;
            writeln!(
                f,
                "| locks held | server connections before → while held | client RSS growth | time to acquire all |"
            )?;
            writeln!(f, "|---:|---:|---:|---:|")?;
            writeln!(
                f,
                "| {} | {} → {} ({:+}) | {:.1} MiB | {:.2} s |",
                thousands(h.locks as f64),
                h.connections_before,
                h.connections_held,
                h.connections_held as i64 - h.connections_before as i64,
                h.rss_delta_kib as f64 / 1024.0,
                h.acquire_s
            )?;
        }
        for note in &self.notes {
            writeln!(f, "\nNote: {note}")?;
        }
        Ok(())
    }
}
