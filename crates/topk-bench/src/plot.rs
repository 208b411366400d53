//! Plots of a results folder (PNG and SVG, drawn with plotters):
//!
//! - `latency_k{K}`: latency against N, one panel per D, for ours, the
//!   anchors, the CPU baseline and the memory floor;
//! - `batch_q{Q}_k{K}`: the same for batches of Q queries per call (time per
//!   call; no floor: a batch reads the corpus once but is bound by its
//!   arithmetic);
//! - `speedup_heatmap`: our speedup over the main rival across (N, D), one
//!   panel per K;
//! - `floor`: measured time against the memory floor for every single-query
//!   configuration.
//!
//! Text is rendered with a font compiled into the binary (DejaVu Sans), so
//! the PNGs look the same on a machine without any system fonts.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::ranged1d::SegmentValue;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::{BenchError, Result};
use crate::join::{
    contenders, Row, CPU_ROUNDTRIP, TOPK_CPU, TOPK_DEVICE, TOPK_GPU, TORCH_BF16, TORCH_TF32,
};

static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// Font family every text element uses (registered from [`FONT`]).
const FAMILY: &str = "sans-serif";

type Drawn = std::result::Result<(), String>;

/// Registers the bundled font once; afterwards [`FAMILY`] resolves to it.
fn ensure_font() -> Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED
        .get_or_init(|| plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_ok());
    if ok {
        Ok(())
    } else {
        Err(BenchError::Plot {
            path: PathBuf::from("assets/DejaVuSans.ttf"),
            message: "the bundled font could not be loaded".into(),
        })
    }
}

/// Colour of each contender, the same on every plot.
fn colour(c: &str) -> RGBColor {
    match c {
        TOPK_GPU | TOPK_CPU => RGBColor(0x1f, 0x77, 0xb4),
        TOPK_DEVICE => RGBColor(0x17, 0xbe, 0xcf),
        "torch" => RGBColor(0xd6, 0x27, 0x28),
        TORCH_TF32 => RGBColor(0xe3, 0x77, 0xc2),
        TORCH_BF16 => RGBColor(0xbc, 0xbd, 0x22),
        CPU_ROUNDTRIP => RGBColor(0x7f, 0x7f, 0x7f),
        "numpy" => RGBColor(0x2c, 0xa0, 0x2c),
        "faiss-1t" => RGBColor(0xff, 0x7f, 0x0e),
        "faiss-2t" => RGBColor(0x94, 0x67, 0xbd),
        _ => RGBColor(0x8c, 0x56, 0x4b),
    }
}

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// The legend every chart of this module uses: upper left, on a light box.
fn draw_legend<'a, DB, CT>(chart: &mut ChartContext<'a, DB, CT>) -> std::result::Result<(), String>
where
    DB: DrawingBackend + 'a,
    CT: CoordTranslate,
{
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .label_font((FAMILY, 13))
        .draw()
        .map_err(err)
}

/// A figure that can be drawn on any plotters backend.
trait Figure {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Drawn;
}

/// Draws `fig` as `out/stem.png` and `out/stem.svg`.
fn render(out: &Path, stem: &str, size: (u32, u32), fig: &impl Figure) -> Result<Vec<PathBuf>> {
    let png = out.join(format!("{stem}.png"));
    let svg = out.join(format!("{stem}.svg"));
    let fail = |p: &Path, message: String| BenchError::Plot {
        path: p.to_path_buf(),
        message,
    };
    {
        let root = BitMapBackend::new(&png, size).into_drawing_area();
        fig.draw(&root).map_err(|m| fail(&png, m))?;
        root.present().map_err(|e| fail(&png, e.to_string()))?;
    }
    {
        let root = SVGBackend::new(&svg, size).into_drawing_area();
        fig.draw(&root).map_err(|m| fail(&svg, m))?;
        root.present().map_err(|e| fail(&svg, e.to_string()))?;
    }
    Ok(vec![png, svg])
}

/// Draws every plot of a results folder into `dir/plots/`; returns the files.
pub fn plot_dir(dir: &Path, rows: &[Row]) -> Result<Vec<PathBuf>> {
    ensure_font()?;
    let singles: Vec<&Row> = rows.iter().filter(|r| r.key.batch == 1).collect();
    if singles.is_empty() {
        return Err(BenchError::NoResults {
            path: dir.to_path_buf(),
            what: "single-query records to plot".into(),
        });
    }
    let out = dir.join("plots");
    std::fs::create_dir_all(&out).map_err(|e| BenchError::io(&out, e))?;
    let ks: BTreeSet<usize> = singles.iter().map(|r| r.key.k).collect();
    let mut files = Vec::new();
    // One latency figure per (batch size, K): single queries first.
    let groups: BTreeSet<(usize, usize)> = rows.iter().map(|r| (r.key.batch, r.key.k)).collect();
    for &(batch, k) in &groups {
        let rows: Vec<&Row> = rows
            .iter()
            .filter(|r| r.key.batch == batch && r.key.k == k)
            .collect();
        let ds: BTreeSet<usize> = rows.iter().map(|r| r.key.d).collect();
        let width = 480 * ds.len().max(1) as u32 + 40;
        let stem = if batch == 1 {
            format!("latency_k{k}")
        } else {
            format!("batch_q{batch}_k{k}")
        };
        files.extend(render(
            &out,
            &stem,
            (width, 500),
            &Latency { rows, k, batch },
        )?);
    }
    let width = 420 * ks.len().max(1) as u32 + 40;
    if rivals(&singles).is_empty() {
        tracing::info!("no rival in {}: no speedup heatmap", dir.display());
    } else {
        files.extend(render(
            &out,
            "speedup_heatmap",
            (width, 440),
            &Heatmap {
                rows: singles.clone(),
                ks: ks.iter().copied().collect(),
            },
        )?);
    }
    files.extend(render(&out, "floor", (760, 640), &Floor { rows: singles })?);
    Ok(files)
}

/// An axis label: up to three significant digits, µs below a millisecond.
fn fmt_axis(ms: f64) -> String {
    let (v, unit) = if ms < 1.0 {
        (ms * 1e3, "µs")
    } else {
        (ms, "ms")
    };
    let digits = if v >= 100.0 {
        0
    } else if v >= 10.0 {
        1
    } else {
        2
    };
    let text = format!("{v:.digits$}");
    let text = if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    };
    format!("{text} {unit}")
}

fn label_n(n: f64) -> String {
    if n >= 1e6 {
        format!("{}M", n / 1e6)
    } else if n >= 1e3 {
        format!("{}k", n / 1e3)
    } else {
        format!("{n}")
    }
}

/// Latency against N for one K and batch size, a panel per D (the memory
/// floor drawn for single queries only).
struct Latency<'a> {
    rows: Vec<&'a Row>,
    k: usize,
    batch: usize,
}

impl Figure for Latency<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Drawn {
        root.fill(&WHITE).map_err(err)?;
        let title = if self.batch == 1 {
            format!("Single-query latency vs N, K = {} (log-log)", self.k)
        } else {
            format!(
                "Batch latency vs N, Q = {} queries per call, K = {} (log-log)",
                self.batch, self.k
            )
        };
        let single = self.batch == 1;
        let root = root.titled(&title, (FAMILY, 22)).map_err(err)?;
        let ds: Vec<usize> = self
            .rows
            .iter()
            .map(|r| r.key.d)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let owned: Vec<Row> = self.rows.iter().map(|r| (*r).clone()).collect();
        let names = contenders(&owned);
        let panels = root.split_evenly((1, ds.len().max(1)));
        for (panel, &d) in panels.iter().zip(&ds) {
            let rows: Vec<&Row> = self.rows.iter().copied().filter(|r| r.key.d == d).collect();
            let all: Vec<f64> = rows
                .iter()
                .flat_map(|r| {
                    let floor = r.floor_ms.filter(|_| single);
                    r.median_ms.values().copied().chain(floor)
                })
                .filter(|v| *v > 0.0)
                .collect();
            let (ymin, ymax) = bounds(&all);
            let xs: Vec<f64> = rows.iter().map(|r| r.key.n as f64).collect();
            let (xmin, xmax) = bounds(&xs);
            let mut chart = ChartBuilder::on(panel)
                .caption(format!("D = {d}"), (FAMILY, 18))
                .margin(12)
                .x_label_area_size(42)
                .y_label_area_size(70)
                .build_cartesian_2d((xmin..xmax).log_scale(), (ymin..ymax).log_scale())
                .map_err(err)?;
            chart
                .configure_mesh()
                .x_desc("N (rows)")
                .y_desc(if single {
                    "median latency"
                } else {
                    "median time per call"
                })
                .x_labels(6)
                .y_labels(8)
                .x_label_formatter(&|x| label_n(*x))
                .y_label_formatter(&|y| fmt_axis(*y))
                .label_style((FAMILY, 13))
                .axis_desc_style((FAMILY, 14))
                .draw()
                .map_err(err)?;
            for name in &names {
                let pts: Vec<(f64, f64)> = rows
                    .iter()
                    .filter_map(|r| r.median_ms.get(name).map(|&m| (r.key.n as f64, m)))
                    .collect();
                if pts.is_empty() {
                    continue;
                }
                // Beside the GPU path, the CPU one is the baseline: grey, as
                // the round trip is on single-query plots.
                let c = if name == TOPK_CPU && names.iter().any(|n| n == TOPK_GPU) {
                    colour(CPU_ROUNDTRIP)
                } else {
                    colour(name)
                };
                chart
                    .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
                    .map_err(err)?
                    .label(name.as_str())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2))
                    });
                chart
                    .draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled())))
                    .map_err(err)?;
            }
            let floor: Vec<(f64, f64)> = rows
                .iter()
                .filter(|_| single)
                .filter_map(|r| r.floor_ms.map(|f| (r.key.n as f64, f)))
                .collect();
            if !floor.is_empty() {
                chart
                    .draw_series(DashedLineSeries::new(floor, 6, 4, BLACK.stroke_width(1)))
                    .map_err(err)?
                    .label("memory floor")
                    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK));
            }
            draw_legend(&mut chart)?;
        }
        Ok(())
    }
}

/// A log-scale range around positive values, with a margin.
fn bounds(v: &[f64]) -> (f64, f64) {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(0.0, f64::max);
    if !lo.is_finite() || hi <= 0.0 {
        return (1e-3, 1.0);
    }
    if lo == hi {
        return (lo / 2.0, hi * 2.0);
    }
    (lo / 1.4, hi * 1.4)
}

/// What a speedup is measured against: torch when it ran, else the CPU
/// round trip, else the fastest of the CPU anchors in each cell.
fn rivals(rows: &[&Row]) -> Vec<&'static str> {
    let has = |c: &str| rows.iter().any(|r| r.median_ms.contains_key(c));
    if has("torch") {
        return vec!["torch"];
    }
    if has(CPU_ROUNDTRIP) {
        return vec![CPU_ROUNDTRIP];
    }
    ["numpy", "faiss-1t", "faiss-2t"]
        .into_iter()
        .filter(|c| has(c))
        .collect()
}

/// The speedup of ours over the fastest rival that ran this row.
fn best_speedup(row: &Row, rivals: &[&str]) -> Option<f64> {
    rivals
        .iter()
        .filter_map(|c| row.speedup_vs(c))
        .fold(None, |acc: Option<f64>, s| {
            Some(acc.map_or(s, |a| a.min(s)))
        })
}

/// Speedup over the rival across (N, D), a panel per K.
struct Heatmap<'a> {
    rows: Vec<&'a Row>,
    ks: Vec<usize>,
}

/// Red below 1× (we lose), white at 1×, green above (we win), saturating at 8× / ⅛×.
fn speedup_colour(s: f64) -> RGBColor {
    let t = (s.log2() / 3.0).clamp(-1.0, 1.0);
    let mix =
        |a: u8, b: u8, t: f64| (f64::from(a) + (f64::from(b) - f64::from(a)) * t).round() as u8;
    if t >= 0.0 {
        RGBColor(mix(255, 0x2c, t), mix(255, 0xa0, t), mix(255, 0x2c, t))
    } else {
        RGBColor(mix(255, 0xd6, -t), mix(255, 0x27, -t), mix(255, 0x28, -t))
    }
}

impl Figure for Heatmap<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Drawn {
        root.fill(&WHITE).map_err(err)?;
        let rivals = rivals(&self.rows);
        let title = format!(
            "Speedup of topk over {} (their time / ours), single query",
            match rivals.as_slice() {
                [one] => (*one).to_owned(),
                many => format!("the fastest of {}", many.join(", ")),
            }
        );
        let root = root.titled(&title, (FAMILY, 20)).map_err(err)?;
        let ns: Vec<usize> = self
            .rows
            .iter()
            .map(|r| r.key.n)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let ds: Vec<usize> = self
            .rows
            .iter()
            .map(|r| r.key.d)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let panels = root.split_evenly((1, self.ks.len().max(1)));
        for (panel, &k) in panels.iter().zip(&self.ks) {
            let mut chart = ChartBuilder::on(panel)
                .caption(format!("K = {k}"), (FAMILY, 18))
                .margin(10)
                .x_label_area_size(40)
                .y_label_area_size(50)
                // A segmented range over 0..m has the m + 1 segments 0..=m.
                .build_cartesian_2d(
                    (0..ns.len().saturating_sub(1)).into_segmented(),
                    (0..ds.len().saturating_sub(1)).into_segmented(),
                )
                .map_err(err)?;
            let ns_l = ns.clone();
            let ds_l = ds.clone();
            chart
                .configure_mesh()
                .disable_mesh()
                .x_desc("N")
                .y_desc("D")
                .x_labels(ns.len())
                .y_labels(ds.len())
                .x_label_formatter(&move |v| match v {
                    SegmentValue::CenterOf(i) => {
                        ns_l.get(*i).map(|n| label_n(*n as f64)).unwrap_or_default()
                    }
                    _ => String::new(),
                })
                .y_label_formatter(&move |v| match v {
                    SegmentValue::CenterOf(i) => {
                        ds_l.get(*i).map(|d| d.to_string()).unwrap_or_default()
                    }
                    _ => String::new(),
                })
                .label_style((FAMILY, 13))
                .axis_desc_style((FAMILY, 14))
                .draw()
                .map_err(err)?;
            for (i, &n) in ns.iter().enumerate() {
                for (j, &d) in ds.iter().enumerate() {
                    let s = self
                        .rows
                        .iter()
                        .find(|r| r.key.n == n && r.key.d == d && r.key.k == k)
                        .and_then(|r| best_speedup(r, &rivals));
                    let fill = s.map(speedup_colour).unwrap_or(RGBColor(0xee, 0xee, 0xee));
                    let (x0, y0) = (SegmentValue::Exact(i), SegmentValue::Exact(j));
                    let (x1, y1) = (SegmentValue::Exact(i + 1), SegmentValue::Exact(j + 1));
                    chart
                        .draw_series(std::iter::once(Rectangle::new(
                            [(x0, y0), (x1, y1)],
                            fill.filled(),
                        )))
                        .map_err(err)?;
                    let text = s.map(|s| format!("{s:.2}×")).unwrap_or_else(|| "–".into());
                    let style = TextStyle::from((FAMILY, 15).into_font()).color(&BLACK).pos(
                        plotters::style::text_anchor::Pos::new(
                            plotters::style::text_anchor::HPos::Center,
                            plotters::style::text_anchor::VPos::Center,
                        ),
                    );
                    chart
                        .draw_series(std::iter::once(Text::new(
                            text,
                            (SegmentValue::CenterOf(i), SegmentValue::CenterOf(j)),
                            style,
                        )))
                        .map_err(err)?;
                }
            }
        }
        Ok(())
    }
}

/// Measured latency against the memory floor.
struct Floor<'a> {
    rows: Vec<&'a Row>,
}

impl Figure for Floor<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Drawn {
        root.fill(&WHITE).map_err(err)?;
        let ours = if self.rows.iter().any(|r| r.median_ms.contains_key(TOPK_GPU)) {
            TOPK_GPU
        } else {
            TOPK_CPU
        };
        let pts: Vec<(f64, f64, usize)> = self
            .rows
            .iter()
            .filter_map(|r| Some((r.floor_ms?, *r.median_ms.get(ours)?, r.key.k)))
            .filter(|(f, m, _)| *f > 0.0 && *m > 0.0)
            .collect();
        let all: Vec<f64> = pts.iter().flat_map(|p| [p.0, p.1]).collect();
        let (lo, hi) = bounds(&all);
        let mut chart = ChartBuilder::on(root)
            .caption(
                format!("{ours}: measured vs memory floor (N·D·4 B / bandwidth)"),
                (FAMILY, 18),
            )
            .margin(14)
            .x_label_area_size(45)
            .y_label_area_size(75)
            .build_cartesian_2d((lo..hi).log_scale(), (lo..hi).log_scale())
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("floor")
            .y_desc("measured median")
            .x_label_formatter(&|x| fmt_axis(*x))
            .x_labels(8)
            .y_label_formatter(&|y| fmt_axis(*y))
            .label_style((FAMILY, 13))
            .axis_desc_style((FAMILY, 14))
            .draw()
            .map_err(err)?;
        let line: Vec<(f64, f64)> = (0..=60)
            .map(|i| lo * (hi / lo).powf(f64::from(i) / 60.0))
            .map(|x| (x, x))
            .collect();
        chart
            .draw_series(LineSeries::new(line.clone(), BLACK.stroke_width(1)))
            .map_err(err)?
            .label("measured = floor")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK));
        if ours == TOPK_GPU {
            let plus: Vec<(f64, f64)> = line
                .iter()
                .map(|&(x, _)| (x, x + 0.025))
                .filter(|&(_, y)| y <= hi)
                .collect();
            chart
                .draw_series(DashedLineSeries::new(
                    plus,
                    6,
                    4,
                    BLACK.mix(0.6).stroke_width(1),
                ))
                .map_err(err)?
                .label("floor + 25 µs")
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK.mix(0.6)));
        }
        let ks: BTreeSet<usize> = pts.iter().map(|p| p.2).collect();
        let palette = [
            RGBColor(0x1f, 0x77, 0xb4),
            RGBColor(0xff, 0x7f, 0x0e),
            RGBColor(0x2c, 0xa0, 0x2c),
            RGBColor(0xd6, 0x27, 0x28),
            RGBColor(0x94, 0x67, 0xbd),
        ];
        for (i, &k) in ks.iter().enumerate() {
            let c = palette[i % palette.len()];
            chart
                .draw_series(
                    pts.iter()
                        .filter(|p| p.2 == k)
                        .map(|p| Circle::new((p.0, p.1), 4, c.filled())),
                )
                .map_err(err)?
                .label(format!("K = {k}"))
                .legend(move |(x, y)| Circle::new((x + 9, y), 4, c.filled()));
        }
        draw_legend(&mut chart)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_labels_are_short() {
        assert_eq!(fmt_axis(10.0), "10 ms");
        assert_eq!(fmt_axis(0.025), "25 µs");
        assert_eq!(fmt_axis(1.5), "1.5 ms");
        assert_eq!(fmt_axis(250.0), "250 ms");
    }

    #[test]
    fn speedup_colours_are_white_at_parity_and_saturate() {
        assert_eq!(speedup_colour(1.0), RGBColor(255, 255, 255));
        assert_eq!(speedup_colour(8.0), speedup_colour(100.0));
        assert_eq!(speedup_colour(0.125), speedup_colour(0.001));
    }
}
