//! Inline pictures of use (no script, no image fetch): the lists' sparklines and share bars,
//! the node page's chart per GPU with labelled axes and units, and the slice map (a bar per
//! GPU split into each claim's booking with its measured use drawn inside). Points are
//! `(unix seconds, value)` exactly as Prometheus's range query answered them; every chart
//! carries them in `data-values` with its `data-start`, `data-end` and `data-step`, so a
//! reader can ask Prometheus the same and compare. A chart without points says "no data
//! yet" instead of drawing an empty frame.

use std::fmt::Write;

use crate::render::bytes;
use crate::usage::Span;

use super::escape::{esc, seg};

const SPARK_W: f64 = 96.0;
const SPARK_H: f64 = 20.0;
const CHART_W: f64 = 480.0;
const CHART_H: f64 = 170.0;
/// The chart's left and bottom margins (room for the axis labels and titles).
const LEFT: f64 = 64.0;
const BOTTOM: f64 = 34.0;

/// What a chart's values are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Bytes.
    Bytes,
    /// CPU cores (Prometheus's rate of CPU seconds), shown in millicores.
    Cores,
}

impl Unit {
    /// A value as the tables show it (`12Gi`, `250m`).
    pub fn show(self, v: f64) -> String {
        match self {
            Unit::Bytes => bytes(v.max(0.0).round() as u64),
            Unit::Cores => format!("{}m", (v.max(0.0) * 1000.0).round() as u64),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Unit::Bytes => "bytes",
            Unit::Cores => "CPU cores",
        }
    }
}

/// One series to draw over `span`, from 0 to `top` (its capacity; the largest value when
/// the capacity is not known).
#[derive(Debug, Clone, Copy)]
pub struct Plot<'a> {
    pub span: Span,
    pub points: &'a [(f64, f64)],
    pub top: Option<f64>,
    pub unit: Unit,
}

impl Plot<'_> {
    fn top(&self) -> f64 {
        let max = self.points.iter().map(|p| p.1).fold(0.0, f64::max);
        match self.top {
            Some(t) if t > 0.0 => t.max(max),
            _ if max > 0.0 => max,
            _ => 1.0,
        }
    }

    /// The data attributes every drawn chart carries.
    fn data(&self) -> String {
        let values: Vec<String> = self
            .points
            .iter()
            .map(|(t, v)| format!("{t}:{v}"))
            .collect();
        format!(
            "data-start=\"{}\" data-end=\"{}\" data-step=\"{}\" data-points=\"{}\" data-top=\"{}\" data-values=\"{}\"",
            self.span.start,
            self.span.end,
            self.span.step,
            self.points.len(),
            self.top(),
            values.join(" ")
        )
    }
}

/// `x,y` pairs of `points` scaled into the box (`x0`, `y0`, `w`, `h`).
fn polyline(plot: &Plot, b: (f64, f64, f64, f64)) -> String {
    let (x0, y0, w, h) = b;
    let (start, end) = (plot.span.start as f64, plot.span.end as f64);
    let span = (end - start).max(1.0);
    let top = plot.top();
    plot.points
        .iter()
        .map(|(t, v)| {
            let x = x0 + ((t - start) / span).clamp(0.0, 1.0) * w;
            let y = y0 + h - (v / top).clamp(0.0, 1.0) * h;
            format!("{x:.2},{y:.2}")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn minutes(span: Span) -> u64 {
    (span.end.saturating_sub(span.start) as f64 / 60.0).round() as u64
}

/// The "no data yet" state of chart `what`.
fn no_data(class: &str, what: &str, sentence: &str) -> String {
    format!(
        "<span class=\"{class} no-data\" data-chart=\"{}\" data-points=\"0\">{}</span>",
        esc(what),
        esc(sentence)
    )
}

/// A list's sparkline of `what` (`gpu-memory`, `cpu`, `memory`), `label` naming it.
pub fn sparkline(what: &str, label: &str, plot: &Plot) -> String {
    if plot.points.is_empty() {
        return no_data("sparkline", what, "no data yet");
    }
    let last = plot.points.last().map_or(0.0, |p| p.1);
    let pts = polyline(plot, (0.0, 1.0, SPARK_W, SPARK_H - 2.0));
    let title = format!(
        "{label} over the last {} minutes, now {}{}",
        minutes(plot.span),
        plot.unit.show(last),
        plot.top
            .map(|t| format!(" of {}", plot.unit.show(t)))
            .unwrap_or_default()
    );
    format!(
        "<svg class=\"sparkline\" data-chart=\"{what}\" {data} viewBox=\"0 0 {SPARK_W} {SPARK_H}\" width=\"{SPARK_W}\" height=\"{SPARK_H}\" role=\"img\" aria-label=\"{title}\"><title>{title}</title><rect x=\"0\" y=\"0\" width=\"{SPARK_W}\" height=\"{SPARK_H}\" class=\"frame\"/><polyline class=\"line\" fill=\"none\" points=\"{pts}\"/>{dot}</svg>",
        what = esc(what),
        data = plot.data(),
        title = esc(&title),
        dot = last_dot(&pts),
    )
}

/// A dot on the last point of `pts` (a line of one point draws nothing).
fn last_dot(pts: &str) -> String {
    pts.rsplit(' ')
        .next()
        .and_then(|p| p.split_once(','))
        .map_or(String::new(), |(x, y)| {
            format!("<circle class=\"dot\" cx=\"{x}\" cy=\"{y}\" r=\"1.8\"/>")
        })
}

/// A small bar of `part` of `whole` (`None`: nothing to show).
pub fn share_bar(part: Option<f64>, whole: Option<f64>) -> String {
    match (part, whole) {
        (Some(p), Some(w)) if w > 0.0 => {
            let pct = (p / w * 100.0).clamp(0.0, 100.0);
            format!(
                "<span class=\"share\" data-share=\"{pct:.1}\" title=\"{pct:.0}% of capacity\"><i style=\"width:{pct:.1}%\"></i></span>"
            )
        }
        _ => String::new(),
    }
}

/// Clock time (UTC) of unix seconds, `HH:MM`.
fn clock(t: u64) -> String {
    format!("{:02}:{:02}", (t / 3600) % 24, (t / 60) % 60)
}

/// The chart of one series with its axes: `unit` from 0 to the top on the left (with the
/// middle), UTC clock times along the bottom, both titled. `attr`: the attribute naming
/// what is drawn (`data-gpu="UUID"`).
pub fn chart(attr: (&str, &str), title: &str, plot: &Plot) -> String {
    let (name, value) = attr;
    if plot.points.is_empty() {
        return format!(
            "<div class=\"chart no-data\" {name}=\"{}\" data-points=\"0\">no data yet: Prometheus has no samples of {} in the last {} minutes</div>",
            esc(value),
            esc(title),
            minutes(plot.span)
        );
    }
    let box_ = (LEFT, 8.0, CHART_W - LEFT - 10.0, CHART_H - BOTTOM - 8.0);
    let (x0, y0, w, h) = box_;
    let top = plot.top();
    let (yb, xr) = (y0 + h, x0 + w);
    let mut svg = format!(
        "<svg class=\"chart\" {name}=\"{v}\" {data} viewBox=\"0 0 {CHART_W} {CHART_H}\" width=\"{CHART_W}\" height=\"{CHART_H}\" role=\"img\" aria-label=\"{t}\"><title>{t}</title>",
        v = esc(value),
        data = plot.data(),
        t = esc(&format!("{title} over the last {} minutes", minutes(plot.span))),
    );
    let _ = write!(
        svg,
        "<line class=\"axis\" x1=\"{x0}\" y1=\"{y0}\" x2=\"{x0}\" y2=\"{yb}\"/><line class=\"axis\" x1=\"{x0}\" y1=\"{yb}\" x2=\"{xr}\" y2=\"{yb}\"/>"
    );
    for (frac, v) in [(1.0, top), (0.5, top / 2.0), (0.0, 0.0)] {
        let y = yb - frac * h;
        let _ = write!(
            svg,
            "<line class=\"grid\" x1=\"{x0}\" y1=\"{y}\" x2=\"{xr}\" y2=\"{y}\"/><text class=\"axis-label y\" x=\"{:.0}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            x0 - 4.0,
            y + 3.0,
            esc(&plot.unit.show(v))
        );
    }
    let (s, e) = (plot.span.start, plot.span.end);
    for (frac, t, anchor) in [
        (0.0, s, "start"),
        (0.5, s + (e - s) / 2, "middle"),
        (1.0, e, "end"),
    ] {
        let _ = write!(
            svg,
            "<text class=\"axis-label x\" x=\"{:.1}\" y=\"{:.0}\" text-anchor=\"{anchor}\">{}</text>",
            x0 + frac * w,
            yb + 13.0,
            clock(t)
        );
    }
    let _ = write!(
        svg,
        "<text class=\"axis-title\" x=\"{:.1}\" y=\"{:.0}\" text-anchor=\"middle\">time (UTC)</text><text class=\"axis-title\" x=\"10\" y=\"{:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 10 {:.1})\">{}</text><polyline class=\"line\" fill=\"none\" points=\"{}\"/></svg>",
        x0 + w / 2.0,
        CHART_H - 3.0,
        y0 + h / 2.0,
        y0 + h / 2.0,
        esc(&format!("{title} ({})", plot.unit.name())),
        polyline(plot, box_),
    );
    svg
}

/// One booking in a slice map: a claim (or container) with its pods.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    /// `namespace/claim`.
    pub name: String,
    pub namespace: String,
    /// The first pod holding it (the link); `None`: no pod yet.
    pub pod: Option<String>,
    pub booked: u64,
    /// Measured use inside the booking; `None`: not measured.
    pub used: Option<u64>,
}

/// The slice map of one resource of one GPU: a bar of `capacity` split into the bookings
/// (widths in percent of the capacity, each linked to its pod's row on the Pods page) with
/// the measured use drawn inside, then the free part. `compact`: no labels (the Nodes list).
pub fn slice_map(
    resource: &str,
    capacity: u64,
    segments: &[Segment],
    show: impl Fn(u64) -> String,
    compact: bool,
) -> String {
    let pct = |v: u64| {
        if capacity == 0 {
            0.0
        } else {
            v as f64 / capacity as f64 * 100.0
        }
    };
    let class = if compact {
        "slice-map compact"
    } else {
        "slice-map"
    };
    let mut out = format!(
        "<div class=\"{class}\" data-resource=\"{}\" data-capacity=\"{capacity}\">",
        esc(resource)
    );
    let mut booked = 0;
    for s in segments {
        booked += s.booked;
        let used = s.used.map_or(String::new(), |u| {
            let inner = if s.booked == 0 {
                0.0
            } else {
                (u as f64 / s.booked as f64 * 100.0).clamp(0.0, 100.0)
            };
            format!("<i class=\"used\" data-used=\"{u}\" style=\"width:{inner:.2}%\"></i>")
        });
        let title = format!(
            "{} ({}): {} booked, {} used",
            s.name,
            s.pod.as_deref().unwrap_or("no pod"),
            show(s.booked),
            s.used.map_or("not measured".to_string(), &show)
        );
        let label = if compact {
            String::new()
        } else {
            format!("<span class=\"label\">{}</span>", esc(&s.name))
        };
        let href = s.pod.as_ref().map_or(String::new(), |p| {
            format!(
                " href=\"/pods?namespace={}#pod-{}-{}\"",
                esc(&seg(&s.namespace)),
                esc(&s.namespace),
                esc(p)
            )
        });
        let _ = write!(
            out,
            "<a class=\"segment\" data-claim=\"{}\" data-pod=\"{}\" data-booked=\"{}\"{href} style=\"width:{:.4}%\" title=\"{}\">{used}{label}</a>",
            esc(&s.name),
            esc(s.pod.as_deref().unwrap_or("")),
            s.booked,
            pct(s.booked),
            esc(&title),
        );
    }
    let free = capacity.saturating_sub(booked);
    let _ = write!(
        out,
        "<span class=\"free\" data-free=\"{free}\" style=\"width:{:.4}%\" title=\"{} free\">{}</span></div>",
        pct(free),
        esc(&show(free)),
        if compact {
            String::new()
        } else {
            format!("<span class=\"label\">{} free</span>", esc(&show(free)))
        }
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPAN: Span = Span {
        start: 0,
        end: 120,
        step: 60,
    };

    #[test]
    fn points_are_scaled_to_the_box_and_carried_exactly() {
        let pts = [(0.0, 0.0), (60.0, 50.0), (120.0, 100.0)];
        let plot = Plot {
            span: SPAN,
            points: &pts,
            top: Some(100.0),
            unit: Unit::Bytes,
        };
        let s = sparkline("gpu-memory", "GPU memory used", &plot);
        assert!(s.starts_with("<svg class=\"sparkline\" data-chart=\"gpu-memory\" data-start=\"0\" data-end=\"120\" data-step=\"60\" data-points=\"3\""), "{s}");
        assert!(s.contains("data-values=\"0:0 60:50 120:100\""), "{s}");
        // x from 0 to 96, y from the bottom (19) to the top (1).
        assert!(
            s.contains("points=\"0.00,19.00 48.00,10.00 96.00,1.00\""),
            "{s}"
        );
        let c = chart(("data-gpu", "GPU-<x>"), "GPU memory used", &plot);
        assert!(c.contains("data-gpu=\"GPU-&lt;x&gt;\""), "{c}");
        assert!(
            c.contains(">100</text>") && c.contains(">00:00</text>") && c.contains(">00:02</text>"),
            "{c}"
        );
        assert!(
            c.contains(">time (UTC)</text>") && c.contains(">GPU memory used (bytes)</text>"),
            "{c}"
        );
    }

    #[test]
    fn no_points_say_no_data_yet_instead_of_an_empty_frame() {
        let plot = Plot {
            span: Span {
                start: 0,
                end: 3600,
                step: 60,
            },
            points: &[],
            top: Some(1.0),
            unit: Unit::Cores,
        };
        assert_eq!(
            sparkline("cpu", "CPU", &plot),
            "<span class=\"sparkline no-data\" data-chart=\"cpu\" data-points=\"0\">no data yet</span>"
        );
        let c = chart(("data-gpu", "GPU-a"), "GPU memory used", &plot);
        assert!(
            c.starts_with(
                "<div class=\"chart no-data\" data-gpu=\"GPU-a\" data-points=\"0\">no data yet"
            ),
            "{c}"
        );
        assert!(!c.contains("<svg"));
    }

    #[test]
    fn a_slice_map_splits_the_capacity_into_bookings_and_the_free_part() {
        let segs = [
            Segment {
                name: "ml/train".into(),
                namespace: "ml".into(),
                pod: Some("train-0".into()),
                booked: 20,
                used: Some(5),
            },
            Segment {
                name: "ml/pair".into(),
                namespace: "ml".into(),
                pod: None,
                booked: 30,
                used: None,
            },
        ];
        let m = slice_map("memory", 100, &segs, |v| v.to_string(), false);
        assert!(m.contains("data-claim=\"ml/train\" data-pod=\"train-0\" data-booked=\"20\" href=\"/pods?namespace=ml#pod-ml-train-0\" style=\"width:20.0000%\""), "{m}");
        assert!(
            m.contains("<i class=\"used\" data-used=\"5\" style=\"width:25.00%\">"),
            "{m}"
        );
        assert!(
            m.contains("data-booked=\"30\" style=\"width:30.0000%\""),
            "{m}"
        );
        assert!(
            m.contains("data-free=\"50\" style=\"width:50.0000%\""),
            "{m}"
        );
    }
}
