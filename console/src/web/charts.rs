//! Inline SVG pictures of use over time (no script, no image fetch): the Nodes list's
//! sparkline and the node page's per-GPU chart with its axis labels. Points are
//! `(unix seconds, value)`; the y axis runs from 0 to a given top (the capacity), so a line
//! near the top means nearly full.

use crate::render::bytes;

use super::escape::esc;

const SPARK_W: f64 = 120.0;
const SPARK_H: f64 = 24.0;
const CHART_W: f64 = 480.0;
const CHART_H: f64 = 160.0;
/// The chart's left and bottom margins (room for the axis labels).
const LEFT: f64 = 56.0;
const BOTTOM: f64 = 20.0;

/// `x,y` pairs of `points` scaled into the box (`x0`, `y0`, `w`, `h`), time from `start` to
/// `end`, values from 0 to `top`.
fn polyline(
    points: &[(f64, f64)],
    start: f64,
    end: f64,
    top: f64,
    b: (f64, f64, f64, f64),
) -> String {
    let (x0, y0, w, h) = b;
    let span = (end - start).max(1.0);
    let top = if top > 0.0 { top } else { 1.0 };
    points
        .iter()
        .map(|(t, v)| {
            let x = x0 + ((t - start) / span).clamp(0.0, 1.0) * w;
            let y = y0 + h - (v / top).clamp(0.0, 1.0) * h;
            format!("{x:.1},{y:.1}")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The sparkline of memory used (bytes) over `start..end`, scaled to `capacity`.
pub fn sparkline(points: &[(f64, f64)], start: f64, end: f64, capacity: u64) -> String {
    let last = points.last().map(|p| bytes(p.1.max(0.0) as u64));
    let label = match last {
        Some(l) => format!(
            "GPU memory used over the last hour, now {l} of {}",
            bytes(capacity)
        ),
        None => "GPU memory used over the last hour: no samples".to_string(),
    };
    format!(
        "<svg class=\"sparkline\" data-points=\"{n}\" viewBox=\"0 0 {SPARK_W} {SPARK_H}\" width=\"{SPARK_W}\" height=\"{SPARK_H}\" role=\"img\" aria-label=\"{label}\"><title>{label}</title><rect x=\"0\" y=\"0\" width=\"{SPARK_W}\" height=\"{SPARK_H}\" class=\"frame\"/><polyline class=\"line\" fill=\"none\" points=\"{pts}\"/></svg>",
        n = points.len(),
        label = esc(&label),
        pts = polyline(points, start, end, capacity as f64, (0.0, 1.0, SPARK_W, SPARK_H - 2.0)),
    )
}

/// The chart of GPU `uuid`'s memory used over `start..end` with its axes: bytes from 0 to
/// `capacity` on the left, minutes before now along the bottom.
pub fn chart(uuid: &str, points: &[(f64, f64)], start: f64, end: f64, capacity: u64) -> String {
    let plot = (LEFT, 8.0, CHART_W - LEFT - 8.0, CHART_H - BOTTOM - 8.0);
    let (x0, y0, w, h) = plot;
    let minutes = ((end - start) / 60.0).round() as u64;
    let empty = if points.is_empty() {
        format!(
            "<text class=\"empty\" x=\"{:.0}\" y=\"{:.0}\" text-anchor=\"middle\">no samples</text>",
            x0 + w / 2.0,
            y0 + h / 2.0
        )
    } else {
        String::new()
    };
    format!(
        "<svg class=\"chart\" data-gpu=\"{uuid}\" data-points=\"{n}\" viewBox=\"0 0 {CHART_W} {CHART_H}\" width=\"{CHART_W}\" height=\"{CHART_H}\" role=\"img\" aria-label=\"GPU {uuid}: memory used over the last {minutes} minutes\"><title>GPU {uuid}: memory used over the last {minutes} minutes</title>\
<line class=\"axis\" x1=\"{x0}\" y1=\"{y0}\" x2=\"{x0}\" y2=\"{yb}\"/><line class=\"axis\" x1=\"{x0}\" y1=\"{yb}\" x2=\"{xr}\" y2=\"{yb}\"/>\
<text class=\"axis-label\" x=\"{lx}\" y=\"{ty}\" text-anchor=\"end\">{top}</text><text class=\"axis-label\" x=\"{lx}\" y=\"{yb}\" text-anchor=\"end\">0</text>\
<text class=\"axis-label\" x=\"{x0}\" y=\"{bx}\" text-anchor=\"start\">-{minutes}m</text><text class=\"axis-label\" x=\"{xr}\" y=\"{bx}\" text-anchor=\"end\">now</text>\
<polyline class=\"line\" fill=\"none\" points=\"{pts}\"/>{empty}</svg>",
        uuid = esc(uuid),
        n = points.len(),
        yb = y0 + h,
        xr = x0 + w,
        lx = x0 - 4.0,
        ty = y0 + 8.0,
        bx = CHART_H - 4.0,
        top = esc(&bytes(capacity)),
        pts = polyline(points, start, end, capacity as f64, plot),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_are_scaled_to_the_box_and_counted() {
        let s = sparkline(&[(0.0, 0.0), (60.0, 50.0), (120.0, 100.0)], 0.0, 120.0, 100);
        assert!(
            s.starts_with("<svg class=\"sparkline\" data-points=\"3\""),
            "{s}"
        );
        // x from 0 to 120, y from the bottom (23) to the top (1).
        assert!(s.contains("points=\"0.0,23.0 60.0,12.0 120.0,1.0\""), "{s}");
        let c = chart("GPU-<x>", &[], 0.0, 3600.0, 141 << 30);
        assert!(c.contains("data-gpu=\"GPU-&lt;x&gt;\""), "{c}");
        assert!(
            c.contains(">141Gi</text>") && c.contains(">-60m</text>") && c.contains(">now</text>")
        );
        assert!(c.contains("no samples"));
    }
}
