//! A self-contained SVG of a [`BackendReport`]: cumulative distributions (log-scale
//! time axis) of acquire latency and of the hot key's hand-off, distlock against the
//! raw bound and the peers. Written by hand: a few polylines and labels need no font
//! or plotting libraries.

use std::fmt::Write as _;
use std::time::Duration;

use crate::report::BackendReport;

const PANEL_W: f64 = 420.0;
const PANEL_H: f64 = 300.0;
const MARGIN_L: f64 = 55.0;
const MARGIN_T: f64 = 50.0;
const MARGIN_B: f64 = 45.0;
const GAP: f64 = 30.0;
const LEGEND_H: f64 = 30.0;
/// Points per curve at most; enough for a smooth line at this size.
const POINTS: usize = 300;

/// One curve: a side's sorted samples.
struct Series<'a> {
    side: &'a str,
    samples: &'a [Duration],
}

fn style(side: &str, index: usize) -> (&'static str, &'static str, f64) {
    const PEERS: [&str; 4] = ["#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e"];
    match side {
        "distlock" => ("#d62728", "", 2.5),
        "raw" => ("#555555", "6 4", 1.5),
        _ => (PEERS[index % PEERS.len()], "", 1.5),
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Draws one panel at `(x0, y0)`.
fn panel(out: &mut String, x0: f64, y0: f64, title: &str, series: &[Series<'_>], sides: &[String]) {
    let (w, h) = (PANEL_W - MARGIN_L - 10.0, PANEL_H - MARGIN_T - MARGIN_B);
    let (left, top) = (x0 + MARGIN_L, y0 + MARGIN_T);
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" font-size="14" font-weight="bold">{}</text>"#,
        x0 + MARGIN_L,
        y0 + 25.0,
        escape(title)
    );
    let micros = |d: &Duration| (d.as_secs_f64() * 1e6).max(1.0);
    let all = series.iter().flat_map(|s| s.samples.iter().map(micros));
    let (lo, hi) = all.fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if hi <= 0.0 {
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" font-size="12">no samples</text>"#,
            left + 10.0,
            top + h / 2.0
        );
        return;
    }
    let (dec_lo, dec_hi) = (
        lo.log10().floor(),
        hi.log10().ceil().max(lo.log10().floor() + 1.0),
    );
    let x_of = |v: f64| left + (v.log10() - dec_lo) / (dec_hi - dec_lo) * w;
    let y_of = |q: f64| top + (1.0 - q) * h;
    // Frame, grid and axis labels.
    let _ = writeln!(
        out,
        r##"<rect x="{left:.1}" y="{top:.1}" width="{w:.1}" height="{h:.1}" fill="none" stroke="#999"/>"##
    );
    let mut decade = dec_lo;
    while decade <= dec_hi + 1e-9 {
        let x = x_of(10f64.powf(decade));
        let label = match decade as i32 {
            0 => "1 µs".to_owned(),
            1 => "10 µs".to_owned(),
            2 => "100 µs".to_owned(),
            3 => "1 ms".to_owned(),
            4 => "10 ms".to_owned(),
            5 => "100 ms".to_owned(),
            6 => "1 s".to_owned(),
            d => format!("1e{d} µs"),
        };
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{top:.1}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" font-size="11" text-anchor="middle">{label}</text>"##,
            top + h,
            top + h + 15.0
        );
        decade += 1.0;
    }
    for q in [0.0, 0.25, 0.5, 0.75, 0.9, 1.0] {
        let y = y_of(q);
        let _ = writeln!(
            out,
            r##"<line x1="{left:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{q}</text>"##,
            left + w,
            left - 5.0,
            y + 4.0
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">time (log scale); y: fraction of operations at or below</text>"#,
        left + w / 2.0,
        top + h + 32.0
    );
    for s in series {
        if s.samples.is_empty() {
            continue;
        }
        let index = sides.iter().position(|n| n == s.side).unwrap_or(0);
        let (colour, dash, width) = style(s.side, index);
        let n = s.samples.len();
        let step = (n / POINTS).max(1);
        let mut points = String::new();
        for (i, d) in s.samples.iter().enumerate() {
            if i % step == 0 || i == n - 1 {
                let _ = write!(
                    points,
                    "{:.1},{:.1} ",
                    x_of(micros(d)),
                    y_of((i + 1) as f64 / n as f64)
                );
            }
        }
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="{width}" stroke-dasharray="{dash}" points="{}"/>"#,
            points.trim_end()
        );
    }
}

/// The report's plots as one self-contained SVG document: acquire latency at each
/// reported concurrency and the hot key's hand-off, one panel each, one curve per side.
pub fn svg(report: &BackendReport) -> String {
    let mut panels: Vec<(String, Vec<Series<'_>>)> = Vec::new();
    let mut concurrencies: Vec<usize> = report.samples.latency.iter().map(|l| l.0).collect();
    concurrencies.dedup();
    for c in concurrencies {
        let series = report
            .samples
            .latency
            .iter()
            .filter(|l| l.0 == c)
            .map(|l| Series {
                side: &l.1,
                samples: &l.2,
            })
            .collect();
        let workers = if c == 1 {
            "1 worker".to_owned()
        } else {
            format!("{c} workers")
        };
        panels.push((format!("Acquire latency, {workers}, uncontended"), series));
    }
    let handoff = report
        .samples
        .handoff
        .iter()
        .map(|(side, samples)| Series { side, samples })
        .collect();
    panels.push(("Hot key: hand-off, release → next holder".into(), handoff));

    let width = MARGIN_L + panels.len() as f64 * (PANEL_W + GAP);
    let height = PANEL_H + LEGEND_H + 40.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif">"#
    );
    let _ = writeln!(
        out,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{MARGIN_L}" y="22" font-size="16" font-weight="bold">distlock on {} ({}): cumulative distributions, further left is faster</text>"#,
        escape(&report.backend),
        escape(&report.server)
    );
    for (i, (title, series)) in panels.iter().enumerate() {
        panel(
            &mut out,
            i as f64 * (PANEL_W + GAP),
            20.0,
            title,
            series,
            &report.sides,
        );
    }
    let mut x = MARGIN_L;
    let y = PANEL_H + 45.0;
    for (index, side) in report.sides.iter().enumerate() {
        let (colour, dash, width) = style(side, index);
        let _ = writeln!(
            out,
            r#"<line x1="{x:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{colour}" stroke-width="{width}" stroke-dasharray="{dash}"/><text x="{:.1}" y="{:.1}" font-size="12">{}</text>"#,
            x + 30.0,
            x + 36.0,
            y + 4.0,
            escape(side)
        );
        x += 60.0 + 7.0 * side.len() as f64;
    }
    out.push_str("</svg>\n");
    out
}
