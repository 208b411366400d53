//! The recall–QPS figures (`recall_qps.svg` / `.png`).

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;

use crate::report::{fmt_qps, Point, Summary};
use crate::{AnyResult, CPU_HNSW, EXACT_GPU, GPU_GRAPH, GPU_GRAPH_GPU_BUILT, GPU_GRAPH_WIDE};

static FONT: &[u8] = include_bytes!("../../../topk-bench/assets/DejaVuSans.ttf");
const FAMILY: &str = "sans-serif";

/// Registers the bundled font once (plotters lays text out with it).
fn ensure_font() -> AnyResult<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED
        .get_or_init(|| plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_ok());
    if ok {
        Ok(())
    } else {
        Err("the bundled font could not be loaded".into())
    }
}

fn colour(method: &str) -> RGBColor {
    match method {
        GPU_GRAPH => RGBColor(0x1f, 0x77, 0xb4),
        GPU_GRAPH_GPU_BUILT => RGBColor(0x2c, 0xa0, 0x2c),
        GPU_GRAPH_WIDE => RGBColor(0x94, 0x67, 0xbd),
        CPU_HNSW => RGBColor(0xff, 0x7f, 0x0e),
        EXACT_GPU => RGBColor(0xd6, 0x27, 0x28),
        _ => RGBColor(0x7f, 0x7f, 0x7f),
    }
}

/// Draws the recall–QPS figure of `s` as `stem.svg` and `stem.png` in `dir`.
pub(crate) fn plot(dir: &Path, stem: &str, s: &Summary, target: f64) -> AnyResult<()> {
    if s.points.is_empty() {
        return Ok(());
    }
    ensure_font()?;
    let size = (960, 640);
    let svg = dir.join(format!("{stem}.svg"));
    let png = dir.join(format!("{stem}.png"));
    {
        let root = SVGBackend::new(&svg, size).into_drawing_area();
        draw_recall_qps(&root, s, target).map_err(|m| format!("{}: {m}", svg.display()))?;
    }
    {
        let root = BitMapBackend::new(&png, size).into_drawing_area();
        draw_recall_qps(&root, s, target).map_err(|m| format!("{}: {m}", png.display()))?;
    }
    Ok(())
}

/// recall@k against QPS (log scale): one series per method for the
/// smallest and the largest batch size, and the recall target as a line.
fn draw_recall_qps<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    s: &Summary,
    target: f64,
) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let b_min = s.points.iter().map(|p| p.batch).min().unwrap_or(1);
    let b_max = s.points.iter().map(|p| p.batch).max().unwrap_or(1);
    let shown: Vec<&Point> = s
        .points
        .iter()
        .filter(|p| p.batch == b_min || p.batch == b_max)
        .filter(|p| p.qps.is_finite() && p.qps > 0.0)
        .collect();
    if shown.is_empty() {
        return Ok(());
    }
    let lo = shown.iter().map(|p| p.qps).fold(f64::INFINITY, f64::min) * 0.6;
    // Room on the right for the legend.
    let hi = shown.iter().map(|p| p.qps).fold(0.0, f64::max) * 30.0;
    let rmin = shown.iter().map(|p| p.recall).fold(1.0, f64::min);
    let ymin = ((rmin - 0.02).min(target - 0.02) * 20.0).floor() / 20.0;
    let ymin = ymin.clamp(0.0, 0.95);
    root.fill(&WHITE).map_err(e)?;
    let mut chart = ChartBuilder::on(root)
        .caption(
            format!("{}: recall@k against queries per second", s.dataset),
            (FAMILY, 20),
        )
        .margin(14)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d((lo..hi).log_scale(), ymin..1.005)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("queries per second (log scale)")
        .y_desc("recall@k")
        .label_style((FAMILY, 13))
        .axis_desc_style((FAMILY, 15))
        .x_label_formatter(&|v| fmt_qps(*v))
        .y_label_formatter(&|v| format!("{v:.2}"))
        .draw()
        .map_err(e)?;
    chart
        .draw_series(LineSeries::new(
            vec![(lo, target), (hi, target)],
            BLACK.mix(0.3).stroke_width(1),
        ))
        .map_err(e)?;
    let methods = [
        GPU_GRAPH,
        GPU_GRAPH_WIDE,
        GPU_GRAPH_GPU_BUILT,
        CPU_HNSW,
        EXACT_GPU,
    ];
    let batches = if b_min == b_max {
        vec![(b_max, true)]
    } else {
        vec![(b_max, true), (b_min, false)]
    };
    for &m in &methods {
        for &(b, solid) in &batches {
            let mut pts: Vec<(f64, f64)> = shown
                .iter()
                .filter(|p| p.method == m && p.batch == b)
                .map(|p| (p.qps, p.recall))
                .collect();
            if pts.is_empty() {
                continue;
            }
            pts.sort_by(|x, y| x.1.total_cmp(&y.1));
            let c = colour(m);
            let style = if solid {
                c.stroke_width(2)
            } else {
                c.mix(0.6).stroke_width(1)
            };
            let label = format!("{m}, batch {b}");
            chart
                .draw_series(LineSeries::new(pts.clone(), style))
                .map_err(e)?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
            if solid {
                chart
                    .draw_series(pts.iter().map(|&p| Circle::new(p, 4, c.filled())))
                    .map_err(e)?;
            } else {
                chart
                    .draw_series(
                        pts.iter()
                            .map(|&p| TriangleMarker::new(p, 5, c.mix(0.6).stroke_width(1))),
                    )
                    .map_err(e)?;
            }
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .label_font((FAMILY, 13))
        .draw()
        .map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}
