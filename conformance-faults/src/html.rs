//! The HTML form of fault reports: one page, no external CSS or JS, a table per
//! backend and an inline SVG timeline of grants per scenario (one lane per client,
//! overlapping grants drawn red).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::checkers::{Grant, Violation};
use super::report::{FaultReport, FaultResult};

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "body{font-family:sans-serif;margin:2em;color:#222}\
table{border-collapse:collapse;margin-bottom:1em}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}\
.PASS{color:#176b2c}.FAIL{color:#b00020;font-weight:bold}.SHOWN{color:#a65e00;font-weight:bold}.SKIP{color:#777}\
svg{border:1px solid #ddd;background:#fafafa}.ok{fill:#4a7fd0}.bad{fill:#d0302a}text{font-size:10px;fill:#444}";

impl FaultReport {
    /// A self-contained HTML page: the table, and per scenario a timeline of grants.
    pub fn to_html(&self) -> String {
        html_page(std::slice::from_ref(self))
    }
}

/// One self-contained HTML page for several backends' reports.
pub fn html_page(reports: &[FaultReport]) -> String {
    let mut out = String::from(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>distlock fault conformance</title><style>",
    );
    out.push_str(STYLE);
    out.push_str("</style></head><body><h1>distlock fault conformance</h1>\n");
    out.push_str("<p>Each timeline has one lane per client; a bar is a grant's claimed validity window on the harness clock. Red bars overlap another client's grant of the same key.</p>\n");
    for report in reports {
        let _ = writeln!(out, "<h2>{}</h2>", escape(&report.backend));
        out.push_str("<table><tr><th>scenario</th><th>result</th><th>operations</th><th>violations</th><th>guarantee claimed</th><th>detail</th></tr>\n");
        for r in &report.results {
            let label = r.verdict.label();
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td class=\"{label}\">{label}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(r.name),
                r.operations,
                r.violations,
                escape(&r.claim_text()),
                escape(r.verdict.detail())
            );
        }
        out.push_str("</table>\n");
        for r in report.results.iter().filter(|r| !r.grants.is_empty()) {
            let _ = writeln!(
                out,
                "<h3>{} — {}</h3>",
                escape(&report.backend),
                escape(r.name)
            );
            out.push_str(&timeline(r));
        }
    }
    out.push_str("</body></html>\n");
    out
}

/// The owners of grants that overlap another.
fn overlapping(r: &FaultResult) -> Vec<&str> {
    r.findings
        .exclusion
        .iter()
        .flat_map(|v| match v {
            Violation::Overlap { first, second } => {
                vec![first.owner.as_str(), second.owner.as_str()]
            }
            _ => Vec::new(),
        })
        .collect()
}

fn timeline(r: &FaultResult) -> String {
    const WIDTH: f64 = 900.0;
    const LANE: f64 = 16.0;
    const LEFT: f64 = 70.0;
    let bad = overlapping(r);
    let lanes: BTreeMap<usize, Vec<&Grant>> = r.grants.iter().fold(BTreeMap::new(), |mut m, g| {
        m.entry(g.client).or_insert_with(Vec::new).push(g);
        m
    });
    let start = r.grants.iter().map(|g| g.start_us).min().unwrap_or(0);
    let end = r
        .grants
        .iter()
        .map(|g| g.end_us)
        .max()
        .unwrap_or(start)
        .max(start + 1);
    let scale = (WIDTH - LEFT - 10.0) / (end - start) as f64;
    let height = LANE * lanes.len() as f64 + 24.0;
    let mut svg =
        format!("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\">");
    for (lane, (client, grants)) in lanes.iter().enumerate() {
        let y = 4.0 + LANE * lane as f64;
        let _ = write!(
            svg,
            "<text x=\"2\" y=\"{}\">client {client}</text>",
            y + 10.0
        );
        for g in grants {
            let x = LEFT + (g.start_us - start) as f64 * scale;
            let w = ((g.end_us - g.start_us) as f64 * scale).max(1.0);
            let class = if bad.contains(&g.owner.as_str()) {
                "bad"
            } else {
                "ok"
            };
            let _ = write!(
                svg,
                "<rect class=\"{class}\" x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{}\"><title>client {client}, token {}, {:.1}..{:.1} ms</title></rect>",
                LANE - 4.0,
                g.token.map_or_else(|| "-".to_owned(), |t| t.to_string()),
                (g.start_us - start) as f64 / 1000.0,
                (g.end_us - start) as f64 / 1000.0
            );
        }
    }
    let _ = writeln!(
        svg,
        "<text x=\"{LEFT}\" y=\"{}\">0 ms</text><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.0} ms</text></svg>",
        height - 4.0,
        WIDTH - 10.0,
        height - 4.0,
        (end - start) as f64 / 1000.0
    );
    svg
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkers::{grants, Findings};
    use crate::harness::{Claim, Fault};
    use crate::history::{Event, Op, Phase};
    use crate::report::FaultVerdict;

    #[test]
    fn overlapping_grants_are_drawn_red_and_text_is_escaped() {
        let grant = |client, owner: &str, from, to| {
            let mut e = Event::new(client, "k", Op::Acquire, Phase::Ok)
                .owner(owner)
                .token(1)
                .valid_until_us(to);
            e.at_us = from;
            e
        };
        let events = vec![
            grant(0, "a", 0, 1_000),
            grant(1, "b", 500, 1_500),
            grant(2, "c", 2_000, 3_000),
        ];
        let findings = Findings::of(&events);
        assert_eq!(findings.exclusion.len(), 1);
        let report = FaultReport {
            backend: "x<y>".to_owned(),
            results: vec![FaultResult {
                name: "planted",
                fault: Fault::Partition,
                verdict: FaultVerdict::Shown("a & b".to_owned()),
                operations: 3,
                violations: 1,
                grants: grants(&events),
                findings,
                claim: Claim::NotClaimed("test".to_owned()),
                elapsed_ms: 1,
            }],
        };
        let html = html_page(&[report]);
        assert_eq!(html.matches("class=\"bad\"").count(), 2, "{html}");
        assert_eq!(html.matches("class=\"ok\"").count(), 1, "{html}");
        assert!(html.contains("x&lt;y&gt;") && html.contains("a &amp; b"));
    }
}
