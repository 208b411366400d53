//! Markdown tables generated from a results folder: the README headline
//! (between markers) and the CPU comparison table. Numbers come only from
//! the folder's records; the caveats list, computed from the same records,
//! every configuration where a contender beats us.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use crate::error::{BenchError, Result};
use crate::join::{Row, CPU_ROUNDTRIP, TOPK_CPU, TOPK_DEVICE, TOPK_GPU, TORCH_BF16, TORCH_TF32};

/// Marker before the generated README table.
pub const START: &str = "<!-- bench-table:start -->";
/// Marker after the generated README table.
pub const END: &str = "<!-- bench-table:end -->";

/// A latency for humans: µs below a millisecond, ms above.
pub fn fmt_ms(ms: f64) -> String {
    if ms < 1.0 {
        format!("{:.1} µs", ms * 1e3)
    } else if ms < 100.0 {
        format!("{ms:.2} ms")
    } else {
        format!("{ms:.0} ms")
    }
}

fn fmt_n(n: usize) -> String {
    if n >= 1_000_000 && n % 1_000_000 == 0 {
        format!("{}M", n / 1_000_000)
    } else if n >= 1000 && n % 1000 == 0 {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

fn fmt_x(x: Option<f64>) -> String {
    x.map(|v| format!("{v:.2}×")).unwrap_or_else(|| "–".into())
}

fn cell(x: Option<f64>) -> String {
    x.map(fmt_ms).unwrap_or_else(|| "–".into())
}

/// Facts about the run that head a table (from `environment.json`).
#[derive(Debug, Clone, Default)]
pub struct RunFacts {
    /// GPU name, if any.
    pub gpu: Option<String>,
    /// Driver version.
    pub driver: Option<String>,
    /// CPU model.
    pub cpu: Option<String>,
    /// Logical CPUs.
    pub threads: Option<u64>,
    /// Commit.
    pub commit: Option<String>,
    /// Date.
    pub date: Option<String>,
    /// Load average when the run started.
    pub loadavg: Option<String>,
    /// SM clock as read when the run started (often idle), MHz.
    pub clock_sm: Option<String>,
    /// The SM clock's maximum, MHz.
    pub clock_sm_max: Option<String>,
}

impl RunFacts {
    /// Reads `dir/environment.json`; a missing or unreadable file gives no facts.
    pub fn read(dir: &Path) -> RunFacts {
        let Ok(text) = std::fs::read_to_string(dir.join("environment.json")) else {
            return RunFacts::default();
        };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
            return RunFacts::default();
        };
        let s = |p: &str| v.pointer(p).and_then(|x| x.as_str()).map(str::to_owned);
        RunFacts {
            gpu: s("/gpu/name"),
            driver: s("/gpu/driver"),
            cpu: s("/cpu_model"),
            threads: v.pointer("/cpu_threads").and_then(|x| x.as_u64()),
            commit: s("/commit"),
            date: s("/date_utc"),
            loadavg: s("/loadavg"),
            clock_sm: s("/gpu/clock_sm_mhz"),
            clock_sm_max: s("/gpu/clock_sm_max_mhz"),
        }
    }

    fn line(&self) -> String {
        let mut parts = Vec::new();
        if let Some(g) = &self.gpu {
            parts.push(format!(
                "GPU {g}{}",
                self.driver
                    .as_ref()
                    .map(|d| format!(" (driver {d})"))
                    .unwrap_or_default()
            ));
        }
        if let Some(c) = &self.cpu {
            parts.push(format!(
                "CPU {c}{}",
                self.threads
                    .map(|t| format!(", {t} threads"))
                    .unwrap_or_default()
            ));
        }
        match (&self.clock_sm, &self.clock_sm_max) {
            (Some(c), Some(m)) => parts.push(format!(
                "SM clock not locked (maximum {m} MHz; {c} MHz as read when the run started)"
            )),
            (Some(c), None) => parts.push(format!("SM clock {c} MHz as read (not locked)")),
            (None, Some(m)) => parts.push(format!("SM clock not locked (maximum {m} MHz)")),
            (None, None) => {}
        }
        if let Some(d) = &self.date {
            parts.push(format!("measured {d}"));
        }
        if let Some(c) = &self.commit {
            parts.push(format!("commit `{}`", &c[..c.len().min(12)]));
        }
        parts.join("; ")
    }
}

/// An inexact torch setting of the batch table: its contender label, its
/// column and ratio headings, and its name in the caveats.
struct Inexact {
    contender: &'static str,
    column: &'static str,
    versus: &'static str,
    caveat: &'static str,
}

/// torch's tensor-core batch settings, in the table's column order.
const INEXACT: [Inexact; 2] = [
    Inexact {
        contender: TORCH_TF32,
        column: "torch TF32",
        versus: "vs TF32",
        caveat: "torch TF32",
    },
    Inexact {
        contender: TORCH_BF16,
        column: "torch bf16",
        versus: "vs bf16",
        caveat: "torch over a bf16 copy",
    },
];

fn has(rows: &[Row], contender: &str) -> bool {
    rows.iter().any(|r| r.median_ms.contains_key(contender))
}

/// The headline tables of a campaign folder (GPU or CPU-only).
pub fn headline(rows: &[Row], facts: &RunFacts, source: &str) -> String {
    let gpu = has(rows, TOPK_GPU);
    let ours = if gpu { TOPK_GPU } else { TOPK_CPU };
    let torch = has(rows, "torch");
    let rt = has(rows, CPU_ROUNDTRIP);
    let dev = has(rows, TOPK_DEVICE);
    let singles: Vec<&Row> = rows.iter().filter(|r| r.key.batch == 1).collect();
    let ks: BTreeSet<usize> = singles.iter().map(|r| r.key.k).collect();
    let k_head = if ks.contains(&100) {
        100
    } else {
        ks.iter().copied().max().unwrap_or(0)
    };
    let mut md = String::new();
    let _ = writeln!(
        md,
        "Generated by `cargo xtask bench-table {source}` from the committed results; {}.\n",
        facts.line()
    );

    // 1. Single query at the headline K.
    let _ = writeln!(
        md,
        "**Single query, K = {k_head}, end to end** ({}; dot product on L2-normalised Gaussian rows; median of the trials):\n",
        if gpu {
            "query host→device, score, select, results device→host"
        } else {
            "host query on the CPU backend"
        }
    );
    let mut head = vec!["N", "D", "topk", "floor", "topk − floor"];
    if dev {
        head.push("query on device");
    }
    if torch {
        head.extend(["torch.topk", "vs torch"]);
    }
    if rt {
        head.extend(["CPU round trip", "vs CPU"]);
    }
    head.push("exact");
    table_head(&mut md, &head);
    for r in singles.iter().filter(|r| r.key.k == k_head) {
        let m = r.median_ms.get(ours).copied();
        let over = match (m, r.floor_ms) {
            (Some(m), Some(f)) if m >= f => format!("+{}", fmt_ms(m - f)),
            (Some(m), Some(f)) => format!("−{}", fmt_ms(f - m)),
            _ => "–".into(),
        };
        let mut cells = vec![
            fmt_n(r.key.n),
            r.key.d.to_string(),
            cell(m),
            cell(r.floor_ms),
            over,
        ];
        if dev {
            cells.push(cell(r.median_ms.get(TOPK_DEVICE).copied()));
        }
        if torch {
            cells.push(cell(r.median_ms.get("torch").copied()));
            cells.push(fmt_x(r.speedup_vs("torch")));
        }
        if rt {
            cells.push(cell(r.median_ms.get(CPU_ROUNDTRIP).copied()));
            cells.push(fmt_x(r.speedup_vs(CPU_ROUNDTRIP)));
        }
        cells.push(exact_cell(r.exact));
        table_row(&mut md, &cells);
    }

    // 2. The K sweep: the cost of a larger K.
    if ks.len() > 1 {
        let k_lo = *ks.iter().next().unwrap_or(&0);
        let k_hi = *ks.iter().next_back().unwrap_or(&0);
        let _ = writeln!(md, "\n**K sweep** (topk, single query):\n");
        let mut head: Vec<String> = vec!["N".into(), "D".into()];
        head.extend(ks.iter().map(|k| format!("K = {k}")));
        head.push(format!("K={k_hi} / K={k_lo}"));
        let head_ref: Vec<&str> = head.iter().map(String::as_str).collect();
        table_head(&mut md, &head_ref);
        let mut nd: Vec<(usize, usize)> = singles.iter().map(|r| (r.key.n, r.key.d)).collect();
        nd.sort_unstable();
        nd.dedup();
        for (n, d) in nd {
            let at = |k: usize| {
                singles
                    .iter()
                    .find(|r| r.key.n == n && r.key.d == d && r.key.k == k)
                    .and_then(|r| r.median_ms.get(ours).copied())
            };
            let mut cells = vec![fmt_n(n), d.to_string()];
            cells.extend(ks.iter().map(|&k| cell(at(k))));
            let ratio = match (at(k_hi), at(k_lo)) {
                (Some(h), Some(l)) if l > 0.0 => Some(h / l),
                _ => None,
            };
            cells.push(fmt_x(ratio));
            table_row(&mut md, &cells);
        }
    }

    // 3. Batches.
    let batches: Vec<&Row> = rows.iter().filter(|r| r.key.batch > 1).collect();
    if !batches.is_empty() {
        let _ = writeln!(md, "\n**Batches** (Q queries per call):\n");
        let cpu_col = gpu && batches.iter().any(|r| r.cpu_baseline().is_some());
        let on_device = batches
            .iter()
            .any(|r| r.median_ms.contains_key(TOPK_DEVICE));
        let inexact: Vec<&Inexact> = INEXACT.iter().filter(|i| has(rows, i.contender)).collect();
        let mut head = vec!["N", "D", "K", "Q", "topk", "topk queries/s"];
        if on_device {
            head.push("queries on device");
        }
        if torch {
            head.extend(["torch", "vs torch"]);
        }
        for i in &inexact {
            head.extend([i.column, i.versus]);
        }
        if cpu_col {
            head.extend(["CPU (host batch)", "vs CPU"]);
        }
        head.push("exact");
        table_head(&mut md, &head);
        for r in &batches {
            let mut cells = vec![
                fmt_n(r.key.n),
                r.key.d.to_string(),
                r.key.k.to_string(),
                r.key.batch.to_string(),
                cell(r.median_ms.get(ours).copied()),
                r.qps
                    .get(ours)
                    .map(|q| format!("{q:.0}"))
                    .unwrap_or_else(|| "–".into()),
            ];
            if on_device {
                cells.push(cell(r.median_ms.get(TOPK_DEVICE).copied()));
            }
            if torch {
                cells.push(cell(r.median_ms.get("torch").copied()));
                cells.push(fmt_x(r.speedup_vs("torch")));
            }
            for i in &inexact {
                cells.push(cell(r.median_ms.get(i.contender).copied()));
                cells.push(fmt_x(r.speedup_vs(i.contender)));
            }
            if cpu_col {
                let base = r.cpu_baseline();
                cells.push(cell(base.map(|b| b.1)));
                cells.push(fmt_x(base.and_then(|(c, _)| r.speedup_vs(c))));
            }
            cells.push(exact_cell(r.exact));
            table_row(&mut md, &cells);
        }
    }

    // 4. Caveats, computed.
    let _ = writeln!(md, "\n**Caveats** (computed from the same results):\n");
    let mut caveats = Vec::new();
    let losses: Vec<String> = rows
        .iter()
        .filter(|r| r.speedup_vs("torch").is_some_and(|s| s < 1.0))
        .map(config_name)
        .collect();
    if torch {
        if losses.is_empty() {
            caveats.push(
                "torch.topk was not faster than topk in any configuration measured.".to_owned(),
            );
        } else {
            caveats.push(format!(
                "torch.topk is faster than topk in {} configuration(s): {}.",
                losses.len(),
                list(&losses)
            ));
        }
    } else {
        caveats.push(
            "No torch anchor in this folder: the GPU comparison is against the CPU baseline only."
                .to_owned(),
        );
    }
    for i in &INEXACT {
        let timed: Vec<&Row> = rows
            .iter()
            .filter(|r| r.speedup_vs(i.contender).is_some())
            .collect();
        if timed.is_empty() {
            continue;
        }
        let wins = timed
            .iter()
            .filter(|r| r.speedup_vs(i.contender).is_some_and(|s| s >= 1.0))
            .count();
        caveats.push(format!(
            "Against {} (tensor-core products, not exact): topk's batches from host \
             queries are at least as fast in {wins} of {} configuration(s).",
            i.caveat,
            timed.len()
        ));
    }
    let rt_losses: Vec<String> = rows
        .iter()
        .filter(|r| r.speedup_vs(CPU_ROUNDTRIP).is_some_and(|s| s < 1.0))
        .map(config_name)
        .collect();
    if !rt_losses.is_empty() {
        caveats.push(format!(
            "The CPU round trip beats the GPU path in {}: {}.",
            rt_losses.len(),
            list(&rt_losses)
        ));
    }
    if gpu {
        let over: Vec<String> = singles
            .iter()
            .filter(|r| r.key.k <= 1000)
            .filter_map(|r| {
                let m = r.median_ms.get(TOPK_GPU)?;
                let f = r.floor_ms?;
                (m - f > 0.025).then(|| format!("{} (+{:.0} µs)", config_name(r), (m - f) * 1e3))
            })
            .collect();
        if over.is_empty() {
            caveats
                .push("Every single-query configuration is within 25 µs of its HBM floor.".into());
        } else {
            caveats.push(format!(
                "{} single-query configuration(s) are more than 25 µs above the HBM floor: {}.",
                over.len(),
                list(&over)
            ));
        }
        caveats.push(
            "At small N the fixed cost of one call (query transfer, kernel launches, result \
             transfer, stream synchronisation) dominates, so the ratio to the floor is large there \
             even when the absolute time is tens of microseconds."
                .into(),
        );
    } else {
        caveats.push(
            "This folder holds CPU measurements; the floor is N·D·4 bytes over the host read \
             bandwidth measured in the same run."
                .into(),
        );
    }
    let inexact: Vec<String> = rows
        .iter()
        .filter(|r| r.exact == Some(false))
        .map(config_name)
        .collect();
    if inexact.is_empty() {
        caveats.push(
            "Every timed configuration passed the bit-exact gate against the oracle before timing."
                .into(),
        );
    } else {
        caveats.push(format!(
            "{} configuration(s) failed the bit-exact gate and were not timed: {}.",
            inexact.len(),
            list(&inexact)
        ));
    }
    caveats.push(
        "Clocks were read, not locked; single runs, so expect a few percent of noise.".into(),
    );
    for c in caveats {
        let _ = writeln!(md, "- {c}");
    }
    md
}

fn config_name(r: &Row) -> String {
    let mut s = format!("N={} D={} K={}", fmt_n(r.key.n), r.key.d, r.key.k);
    if r.key.batch > 1 {
        let _ = write!(s, " Q={}", r.key.batch);
    }
    s
}

fn list(items: &[String]) -> String {
    const SHOW: usize = 12;
    if items.len() <= SHOW {
        items.join(", ")
    } else {
        format!(
            "{}, and {} more",
            items[..SHOW].join(", "),
            items.len() - SHOW
        )
    }
}

fn exact_cell(e: Option<bool>) -> String {
    match e {
        Some(true) => "yes".into(),
        Some(false) => "**no**".into(),
        None => "–".into(),
    }
}

fn table_head(md: &mut String, head: &[&str]) {
    let _ = writeln!(md, "| {} |", head.join(" | "));
    let _ = writeln!(
        md,
        "|{}|",
        head.iter().map(|_| " ---: ").collect::<Vec<_>>().join("|")
    );
}

fn table_row(md: &mut String, cells: &[String]) {
    let _ = writeln!(md, "| {} |", cells.join(" | "));
}

/// The CPU comparison table: single-query latency and batch throughput of
/// topk's CPU backend beside numpy and faiss-cpu, with the memory floor.
pub fn cpu_compare(rows: &[Row], facts: &RunFacts, notes: &str) -> String {
    let anchors: Vec<&str> = ["numpy", "faiss-1t", "faiss-2t"]
        .into_iter()
        .filter(|a| has(rows, a))
        .collect();
    let mut md = String::new();
    let _ = writeln!(md, "# CPU comparison\n\n{}.\n\n{notes}\n", facts.line());
    let _ = writeln!(md, "## Single query (median latency)\n");
    let mut head = vec!["N", "D", "K", "floor", "topk"];
    head.extend(anchors.iter().copied());
    head.extend(["topk vs best other", "topk / floor", "exact"]);
    table_head(&mut md, &head);
    for r in rows.iter().filter(|r| r.key.batch == 1) {
        let ours = r.median_ms.get(TOPK_CPU).copied();
        let best = anchors
            .iter()
            .filter_map(|a| r.median_ms.get(*a).copied())
            .fold(None, |acc: Option<f64>, x| {
                Some(acc.map_or(x, |a| a.min(x)))
            });
        let mut cells = vec![
            fmt_n(r.key.n),
            r.key.d.to_string(),
            r.key.k.to_string(),
            cell(r.floor_ms),
            cell(ours),
        ];
        cells.extend(anchors.iter().map(|a| cell(r.median_ms.get(*a).copied())));
        cells.push(fmt_x(match (ours, best) {
            (Some(o), Some(b)) if o > 0.0 => Some(b / o),
            _ => None,
        }));
        cells.push(fmt_x(match (ours, r.floor_ms) {
            (Some(o), Some(f)) if f > 0.0 => Some(o / f),
            _ => None,
        }));
        cells.push(exact_cell(r.exact));
        table_row(&mut md, &cells);
    }
    let batches: Vec<&Row> = rows.iter().filter(|r| r.key.batch > 1).collect();
    if !batches.is_empty() {
        let _ = writeln!(
            md,
            "\n## Batch throughput (queries per second at the median)\n"
        );
        let mut head = vec!["N", "D", "K", "Q", "topk"];
        head.extend(anchors.iter().copied());
        head.extend(["topk vs best faiss", "exact"]);
        table_head(&mut md, &head);
        for r in batches {
            let q = |c: &str| r.qps.get(c).copied();
            let qf = |v: Option<f64>| v.map(|x| format!("{x:.0}")).unwrap_or_else(|| "–".into());
            let best_faiss = ["faiss-1t", "faiss-2t"]
                .iter()
                .filter_map(|a| q(a))
                .fold(None, |acc: Option<f64>, x| {
                    Some(acc.map_or(x, |a| a.max(x)))
                });
            let mut cells = vec![
                fmt_n(r.key.n),
                r.key.d.to_string(),
                r.key.k.to_string(),
                r.key.batch.to_string(),
                qf(q(TOPK_CPU)),
            ];
            cells.extend(anchors.iter().map(|a| qf(q(a))));
            cells.push(fmt_x(match (q(TOPK_CPU), best_faiss) {
                (Some(o), Some(b)) if b > 0.0 => Some(o / b),
                _ => None,
            }));
            cells.push(exact_cell(r.exact));
            table_row(&mut md, &cells);
        }
    }
    md
}

/// Replaces what lies between [`START`] and [`END`] in `readme` with `table`,
/// creating the file with just the markers when it does not exist.
pub fn update_readme(readme: &Path, table: &str) -> Result<()> {
    let text = match std::fs::read_to_string(readme) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => format!("{START}\n{END}\n"),
        Err(e) => return Err(BenchError::io(readme, e)),
    };
    let missing = || BenchError::MissingMarkers {
        path: readme.to_path_buf(),
        start: START,
        end: END,
    };
    let s = text.find(START).ok_or_else(missing)?;
    let e = text[s..].find(END).map(|i| s + i).ok_or_else(missing)?;
    let new = format!(
        "{}{START}\n{}\n{}",
        &text[..s],
        table.trim_end(),
        &text[e..]
    );
    crate::record::write_whole(readme, new.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readme_between_markers_is_replaced_twice_stably() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("README.md");
        std::fs::write(&p, format!("# t\n\nbefore\n{START}\nold\n{END}\nafter\n")).unwrap();
        update_readme(&p, "| a |\n").unwrap();
        update_readme(&p, "| a |\n").unwrap();
        let t = std::fs::read_to_string(&p).unwrap();
        assert_eq!(t, format!("# t\n\nbefore\n{START}\n| a |\n{END}\nafter\n"));
    }

    #[test]
    fn missing_readme_is_created_and_bad_markers_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("README.md");
        update_readme(&p, "x").unwrap();
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            format!("{START}\nx\n{END}\n")
        );
        std::fs::write(&p, format!("{END}\n{START}\n")).unwrap();
        let e = update_readme(&p, "x").unwrap_err();
        assert!(e.to_string().contains("markers"), "{e}");
    }

    fn batch_row(times: &[(&str, f64)]) -> Row {
        let key = crate::join::Key {
            n: 100_000,
            d: 1024,
            k: 100,
            batch: 256,
        };
        Row {
            key,
            median_ms: times.iter().map(|&(c, m)| (c.to_owned(), m)).collect(),
            qps: times
                .iter()
                .map(|&(c, m)| (c.to_owned(), 256.0 / (m / 1e3)))
                .collect(),
            floor_ms: Some(0.1),
            exact: Some(true),
            errors: Vec::new(),
        }
    }

    #[test]
    fn batches_show_device_queries_and_the_inexact_torch_columns() {
        let rows = vec![
            batch_row(&[
                (TOPK_GPU, 0.8),
                (TOPK_DEVICE, 0.6),
                ("torch", 1.6),
                (TORCH_TF32, 0.4),
                (TORCH_BF16, 0.2),
            ]),
            batch_row(&[(TOPK_GPU, 2.0), ("torch", 4.0), (TORCH_TF32, 3.0)]),
        ];
        let md = headline(&rows, &RunFacts::default(), "x");
        assert!(
            md.contains("| N | D | K | Q | topk | topk queries/s | queries on device | torch | vs torch | torch TF32 | vs TF32 | torch bf16 | vs bf16 | exact |"),
            "{md}"
        );
        assert!(md.contains("| 100k | 1024 | 100 | 256 | 800.0 µs | 320000 | 600.0 µs | 1.60 ms | 2.00× | 400.0 µs | 0.50× | 200.0 µs | 0.25× |"), "{md}");
        assert!(md.contains("Against torch TF32 (tensor-core products, not exact): topk's batches from host queries are at least as fast in 1 of 2 configuration(s)."), "{md}");
        assert!(md.contains("Against torch over a bf16 copy (tensor-core products, not exact): topk's batches from host queries are at least as fast in 0 of 1 configuration(s)."), "{md}");
    }

    #[test]
    fn the_clock_line_names_the_maximum_and_the_reading_at_the_start() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("environment.json"),
            r#"{"gpu": {"name": "G", "clock_sm_mhz": "345", "clock_sm_max_mhz": "1980"}}"#,
        )
        .unwrap();
        let line = RunFacts::read(dir.path()).line();
        assert_eq!(
            line,
            "GPU G; SM clock not locked (maximum 1980 MHz; 345 MHz as read when the run started)"
        );
        let only_read = RunFacts {
            clock_sm: Some("1755".into()),
            ..RunFacts::default()
        };
        assert_eq!(only_read.line(), "SM clock 1755 MHz as read (not locked)");
    }

    #[test]
    fn units_switch_at_a_millisecond() {
        assert_eq!(fmt_ms(0.0225), "22.5 µs");
        assert_eq!(fmt_ms(1.114), "1.11 ms");
        assert_eq!(fmt_n(1_000_000), "1M");
        assert_eq!(fmt_n(50_000), "50k");
    }
}
