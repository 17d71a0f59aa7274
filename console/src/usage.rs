//! Real use from Prometheus's HTTP API (`/api/v1/query`) over the metrics `gpuslice serve`
//! exports: per GPU the memory in use and utilisation (NVML), per slice its limit, the
//! shim's and the driver's memory figures and the achieved compute share; and range queries
//! (`/api/v1/query_range`) for the web console's charts of use over time. Only `http://`
//! URLs; one query per call.

use std::collections::BTreeMap;
use std::time::Duration;

use gpuslice_config::quantity::format_bytes;
use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper::body::Bytes;
use hyper::Uri;
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};

/// The query of every figure the console shows.
pub const QUERY: &str = r#"{__name__=~"gpuslice_gpu_memory_used_bytes|gpuslice_gpu_utilization_ratio|gpuslice_slice_memory_limit_bytes|gpuslice_slice_memory_used_bytes|gpuslice_slice_nvml_memory_used_bytes|gpuslice_slice_compute_limit_ratio|gpuslice_slice_compute_used_ratio|gpuslice_slice_nvml_compute_used_ratio"}"#;

/// How long one query may take.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// The most bytes of one answer the console reads: a wrong or hostile `--prometheus` could
/// otherwise push gigabytes within [`TIMEOUT`]. One series of [`QUERY`]'s answer is about
/// 560 bytes of JSON and a slice has six: 64 MiB holds some 19,000 slices (2,000 GPUs at
/// 8 slices each, with room).
pub const MAX_ANSWER: usize = 64 << 20;

/// Prometheus could not be asked, or answered something else than a vector.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    #[error("--prometheus `{url}` is not an http:// URL ({detail}); accepted: http://HOST:PORT[/PATH], e.g. http://127.0.0.1:9090")]
    Url { url: String, detail: String },
    #[error("Prometheus at {url} is unreachable: {detail}")]
    Unreachable { url: String, detail: String },
    #[error("Prometheus at {url} answered HTTP {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    #[error("Prometheus at {url} has no gpuslice_gpu_* series: it scrapes no `gpuslice serve` (docs/observability.md)")]
    NoSeries { url: String },
    #[error("Prometheus at {url} answered more than {} (the most the console reads of one answer)", format_bytes(*limit as u64))]
    TooLarge { url: String, limit: usize },
    #[error("Prometheus at {url} answered no vector ({detail})")]
    Answer { url: String, detail: String },
    #[error("window `{value}` is not a duration; accepted: a whole number with s, m, h or d from 1m to 30d, e.g. 1h")]
    Window { value: String },
}

/// The time span of a chart: `start..=end` unix seconds, one point per `step` seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub start: u64,
    pub end: u64,
    pub step: u64,
}

/// The most points a chart asks for (a 480-pixel chart shows no more).
pub const CHART_POINTS: u64 = 60;
/// The points of a list's sparkline (96 pixels wide): 1h at 2 minutes.
pub const SPARK_POINTS: u64 = 30;
/// The finest step: no scrape interval in use is shorter.
pub const MIN_STEP: u64 = 15;

impl Span {
    /// The last `window` seconds before `now`, with [`step_for`]'s step; `end` and `start`
    /// on multiples of the step, so that two loads in one step ask Prometheus the same.
    pub fn last(window: u64, now: u64) -> Span {
        Span::last_points(window, now, CHART_POINTS)
    }

    /// [`Span::last`] with `points` points (a list's sparklines need fewer than a chart).
    pub fn last_points(window: u64, now: u64, points: u64) -> Span {
        let step = window.div_ceil(points.max(1)).max(MIN_STEP);
        let end = now - now % step;
        Span {
            start: end.saturating_sub(window),
            end,
            step,
        }
    }
}

/// The step of a chart over `window` seconds: [`CHART_POINTS`] points, never finer than
/// [`MIN_STEP`] (1h: 60s, 6h: 6m, 1d: 24m).
pub fn step_for(window: u64) -> u64 {
    window.div_ceil(CHART_POINTS).max(MIN_STEP)
}

/// Parses a window (`30m`, `1h`, `6h`, `1d`, `90s`) into seconds, 1 minute to 30 days.
pub fn parse_window(value: &str) -> Result<u64, UsageError> {
    let err = || UsageError::Window {
        value: value.to_string(),
    };
    let v = value.trim();
    let unit = v.chars().last().ok_or_else(err)?;
    let n: u64 = v[..v.len() - unit.len_utf8()].parse().map_err(|_| err())?;
    let secs = match unit {
        's' => n,
        'm' => n.checked_mul(60).ok_or_else(err)?,
        'h' => n.checked_mul(3600).ok_or_else(err)?,
        'd' => n.checked_mul(86400).ok_or_else(err)?,
        _ => return Err(err()),
    };
    if !(60..=30 * 86400).contains(&secs) {
        return Err(err());
    }
    Ok(secs)
}

/// A window in the shortest spelling [`parse_window`] reads back (`1h`, `90m`, `45s`).
pub fn format_window(secs: u64) -> String {
    for (unit, n) in [("d", 86400), ("h", 3600), ("m", 60)] {
        if secs.is_multiple_of(n) {
            return format!("{}{unit}", secs / n);
        }
    }
    format!("{secs}s")
}

/// Measured use of one GPU, keyed by its UUID.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuUsage {
    pub memory_used: Option<u64>,
    /// 0–1.
    pub utilization: Option<f64>,
}

/// One slice's series (one reservation on one GPU).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SliceUsage {
    pub node: String,
    pub reservation: String,
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub uuid: String,
    pub index: String,
    pub memory_limit: Option<u64>,
    pub memory_used: Option<u64>,
    pub nvml_memory_used: Option<u64>,
    /// 0–1.
    pub compute_limit: Option<f64>,
    /// 0–1, as the container's usage file says.
    pub compute_used: Option<f64>,
    /// 0–1, the driver's figure for the slice's processes (what the enforcer meters).
    pub nvml_compute_used: Option<f64>,
}

/// What Prometheus said.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub gpus: BTreeMap<String, GpuUsage>,
    pub slices: Vec<SliceUsage>,
}

#[derive(Debug, Deserialize)]
struct Answer {
    status: String,
    #[serde(default)]
    error: Option<String>,
    data: Option<Data>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Data {
    result_type: String,
    result: Vec<Sample>,
}

/// One sample of an instant vector: labels and `[time, "value"]`.
#[derive(Debug, Deserialize)]
pub struct Sample {
    pub metric: BTreeMap<String, String>,
    pub value: (f64, String),
}

/// Folds the samples of [`QUERY`] into per-GPU and per-slice figures.
pub fn fold(samples: &[Sample]) -> Usage {
    let mut usage = Usage::default();
    let mut slices: BTreeMap<(String, String, String), SliceUsage> = BTreeMap::new();
    for s in samples {
        let label = |k: &str| s.metric.get(k).cloned().unwrap_or_default();
        let Ok(v) = s.value.1.parse::<f64>() else {
            continue;
        };
        if !v.is_finite() {
            continue;
        }
        let bytes = (v.max(0.0)).round() as u64;
        let name = label("__name__");
        if let Some(metric) = name.strip_prefix("gpuslice_gpu_") {
            let g = usage.gpus.entry(label("uuid")).or_default();
            match metric {
                "memory_used_bytes" => g.memory_used = Some(bytes),
                "utilization_ratio" => g.utilization = Some(v),
                _ => {}
            }
        } else if let Some(metric) = name.strip_prefix("gpuslice_slice_") {
            let key = (label("node"), label("reservation"), label("uuid"));
            let sl = slices.entry(key).or_insert_with(|| SliceUsage {
                node: label("node"),
                reservation: label("reservation"),
                namespace: label("namespace"),
                pod: label("pod"),
                container: label("container"),
                uuid: label("uuid"),
                index: label("index"),
                ..SliceUsage::default()
            });
            match metric {
                "memory_limit_bytes" => sl.memory_limit = Some(bytes),
                "memory_used_bytes" => sl.memory_used = Some(bytes),
                "nvml_memory_used_bytes" => sl.nvml_memory_used = Some(bytes),
                "compute_limit_ratio" => sl.compute_limit = Some(v),
                "compute_used_ratio" => sl.compute_used = Some(v),
                "nvml_compute_used_ratio" => sl.nvml_compute_used = Some(v),
                _ => {}
            }
        }
    }
    usage.slices = slices.into_values().collect();
    usage
}

/// Parses an answer of `/api/v1/query`.
pub fn parse_answer(url: &str, body: &[u8]) -> Result<Vec<Sample>, UsageError> {
    let answer = |detail: String| UsageError::Answer {
        url: url.to_string(),
        detail,
    };
    let a: Answer = serde_json::from_slice(body).map_err(|e| answer(e.to_string()))?;
    if a.status != "success" {
        return Err(answer(a.error.unwrap_or(a.status)));
    }
    let data = a.data.ok_or_else(|| answer("no data".into()))?;
    if data.result_type != "vector" {
        return Err(answer(format!("result type {}", data.result_type)));
    }
    Ok(data.result)
}

/// Runs one instant query against the Prometheus at `base` (`http://host:port[/prefix]`).
pub async fn query(base: &str, promql: &str) -> Result<Vec<Sample>, UsageError> {
    let encoded: String = form_urlencoded::byte_serialize(promql.as_bytes()).collect();
    let body = get(base, &format!("/api/v1/query?query={encoded}")).await?;
    parse_answer(base, &body)
}

/// One series of a range query: its labels and `(unix seconds, value)` points in time
/// order (values that are not finite numbers left out).
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub metric: BTreeMap<String, String>,
    pub points: Vec<(f64, f64)>,
}

#[derive(Debug, Deserialize)]
struct RangeAnswer {
    status: String,
    #[serde(default)]
    error: Option<String>,
    data: Option<RangeData>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RangeData {
    result_type: String,
    result: Vec<RangeSample>,
}

#[derive(Debug, Deserialize)]
struct RangeSample {
    metric: BTreeMap<String, String>,
    values: Vec<(f64, String)>,
}

/// Parses an answer of `/api/v1/query_range` (a matrix).
pub fn parse_range_answer(url: &str, body: &[u8]) -> Result<Vec<Series>, UsageError> {
    let answer = |detail: String| UsageError::Answer {
        url: url.to_string(),
        detail,
    };
    let a: RangeAnswer = serde_json::from_slice(body).map_err(|e| answer(e.to_string()))?;
    if a.status != "success" {
        return Err(answer(a.error.unwrap_or(a.status)));
    }
    let data = a.data.ok_or_else(|| answer("no data".into()))?;
    if data.result_type != "matrix" {
        return Err(answer(format!("result type {}", data.result_type)));
    }
    Ok(data
        .result
        .into_iter()
        .map(|s| Series {
            metric: s.metric,
            points: s
                .values
                .into_iter()
                .filter_map(|(t, v)| {
                    v.parse::<f64>()
                        .ok()
                        .filter(|v| v.is_finite())
                        .map(|v| (t, v))
                })
                .collect(),
        })
        .collect())
}

/// Runs one range query over `span`.
pub async fn query_range(base: &str, promql: &str, span: Span) -> Result<Vec<Series>, UsageError> {
    let encoded: String = form_urlencoded::byte_serialize(promql.as_bytes()).collect();
    let Span { start, end, step } = span;
    let body = get(
        base,
        &format!("/api/v1/query_range?query={encoded}&start={start}&end={end}&step={step}"),
    )
    .await?;
    parse_range_answer(base, &body)
}

/// GETs `path_and_query` of the Prometheus at `base`: the body of a 200 answer, or of
/// Prometheus's JSON error answer (400/422), which the parsers turn into the error.
async fn get(base: &str, path_and_query: &str) -> Result<Bytes, UsageError> {
    let url_err = |detail: String| UsageError::Url {
        url: base.to_string(),
        detail,
    };
    let uri: Uri = base
        .parse()
        .map_err(|e: hyper::http::uri::InvalidUri| url_err(e.to_string()))?;
    if uri.scheme_str() != Some("http") {
        return Err(url_err(format!(
            "scheme {}",
            uri.scheme_str().unwrap_or("missing")
        )));
    }
    let authority = uri
        .authority()
        .ok_or_else(|| url_err("no host".into()))?
        .clone();
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let port = authority.port_u16().unwrap_or(80);
    let prefix = uri.path().trim_end_matches('/');
    let path = format!("{prefix}{path_and_query}");
    let unreachable = |detail: String| UsageError::Unreachable {
        url: base.to_string(),
        detail,
    };
    let work = async {
        let stream = tokio::net::TcpStream::connect((host, port))
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        tokio::spawn(conn);
        let req = hyper::Request::get(path)
            .header(hyper::header::HOST, authority.as_str())
            .header(hyper::header::ACCEPT, "application/json")
            .body(Empty::<Bytes>::new())
            .map_err(|e| url_err(e.to_string()))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let status = resp.status().as_u16();
        let body = Limited::new(resp.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<LengthLimitError>() {
                    UsageError::TooLarge {
                        url: base.to_string(),
                        limit: MAX_ANSWER,
                    }
                } else {
                    unreachable(e.to_string())
                }
            })?
            .to_bytes();
        // Prometheus answers 400/422 with its JSON error; anything else is not Prometheus.
        let prometheus_error = serde_json::from_slice::<serde_json::Value>(&body)
            .is_ok_and(|v| v.get("status").and_then(|s| s.as_str()) == Some("error"));
        if status != 200 && !prometheus_error {
            return Err(UsageError::Status {
                url: base.to_string(),
                status,
                body: String::from_utf8_lossy(&body).chars().take(200).collect(),
            });
        }
        Ok(body)
    };
    tokio::time::timeout(TIMEOUT, work)
        .await
        .map_err(|_| unreachable(format!("no answer within {}s", TIMEOUT.as_secs())))?
}

/// The use the console shows, from the Prometheus at `base`. A Prometheus without any of
/// the exporter's GPU series is not a source of use (it scrapes no `gpuslice serve`).
pub async fn fetch(base: &str) -> Result<Usage, UsageError> {
    let usage = fold(&query(base, QUERY).await?);
    if usage.gpus.is_empty() {
        return Err(UsageError::NoSeries {
            url: base.to_string(),
        });
    }
    Ok(usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Prometheus that answers each of `bodies`' connections with its body, in order.
    fn serve(bodies: Vec<Vec<u8>>) -> String {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            for body in bodies {
                let (mut s, _) = listener.accept().unwrap();
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap_or(0) == 1 {
                    head.push(byte[0]);
                }
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                // The console stops reading past its limit: a failed write is expected.
                let _ = s
                    .write_all(answer.as_bytes())
                    .and_then(|_| s.write_all(&body));
            }
        });
        url
    }

    #[tokio::test]
    async fn an_answer_over_the_limit_is_refused_naming_it() {
        let empty = br#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        // Valid JSON padded with whitespace to exactly the limit, then one byte more.
        let mut at_limit = empty.to_vec();
        at_limit.resize(MAX_ANSWER, b' ');
        let mut over = at_limit.clone();
        over.push(b' ');
        let url = serve(vec![at_limit, over]);
        assert!(query(&url, "up").await.unwrap().is_empty());
        let e = query(&url, "up").await.unwrap_err();
        assert!(matches!(e, UsageError::TooLarge { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!("Prometheus at {url} answered more than 64Mi (the most the console reads of one answer)")
        );
    }

    #[test]
    fn a_real_answer_folds_into_gpu_and_slice_figures() {
        let body = include_str!("../tests/data/prometheus-answer.json");
        let samples = parse_answer("http://p", body.as_bytes()).unwrap();
        let u = fold(&samples);
        assert_eq!(u.gpus.len(), 2);
        let g = &u.gpus["GPU-371d38fa-b643-52bd-b498-5aaafe5093ad"];
        assert_eq!((g.memory_used, g.utilization), (Some(0), Some(0.0)));
        assert_eq!(u.slices.len(), 1);
        let sl = &u.slices[0];
        assert_eq!(sl.namespace, "default");
        assert_eq!(
            sl.pod, "",
            "an empty label is absent in Prometheus's answer"
        );
        assert_eq!(sl.memory_limit, Some(20 << 30));
        assert_eq!((sl.memory_used, sl.nvml_memory_used), (Some(0), Some(0)));
        assert_eq!((sl.compute_limit, sl.compute_used), (Some(0.3), Some(0.0)));
    }

    #[test]
    fn errors_and_other_answers_are_refused_with_the_url() {
        let e = parse_answer("http://p", br#"{"status":"error","error":"bad query"}"#).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Prometheus at http://p answered no vector (bad query)"
        );
        let e = parse_answer(
            "http://p",
            br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("result type matrix"), "{e}");
        assert!(parse_answer("http://p", b"<html>").is_err());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        for bad in ["https://p:9090", "p:9090", "ftp://x"] {
            let e = rt.block_on(fetch(bad)).unwrap_err().to_string();
            assert!(e.contains("accepted: http://HOST:PORT"), "{e}");
        }
        // Nothing listens on port 1.
        let e = rt
            .block_on(fetch("http://127.0.0.1:1"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("Prometheus at http://127.0.0.1:1 is unreachable"),
            "{e}"
        );
    }

    #[test]
    fn windows_parse_and_spans_keep_sixty_points_on_step_multiples() {
        assert_eq!(parse_window("1h").unwrap(), 3600);
        assert_eq!(parse_window("90m").unwrap(), 5400);
        assert_eq!(parse_window("1d").unwrap(), 86400);
        for bad in ["", "h", "5", "1w", "30s", "31d", "-1h", "1.5h"] {
            let e = parse_window(bad).unwrap_err().to_string();
            assert!(
                e.contains("accepted: a whole number with s, m, h or d"),
                "{bad}: {e}"
            );
        }
        assert_eq!(format_window(3600), "1h");
        assert_eq!(format_window(5400), "90m");
        assert_eq!(
            (step_for(3600), step_for(21600), step_for(600)),
            (60, 360, 15)
        );
        let s = Span::last(3600, 100_030);
        assert_eq!((s.start, s.end, s.step), (96_420, 100_020, 60));
    }

    #[test]
    fn a_range_answer_parses_into_series_in_time_order() {
        let body = br#"{"status":"success","data":{"resultType":"matrix","result":[
            {"metric":{"uuid":"GPU-a","node":"n1"},"values":[[100,"1024"],[160,"NaN"],[220,"2048.5"]]},
            {"metric":{"uuid":"GPU-b"},"values":[]}]}}"#;
        let s = parse_range_answer("http://p", body).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].metric["uuid"], "GPU-a");
        assert_eq!(
            s[0].points,
            [(100.0, 1024.0), (220.0, 2048.5)],
            "NaN is left out"
        );
        assert!(s[1].points.is_empty());
        let e = parse_range_answer(
            "http://p",
            br#"{"status":"success","data":{"resultType":"vector","result":[]}}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("result type vector"), "{e}");
        let e = parse_range_answer("http://p", br#"{"status":"error","error":"bad step"}"#)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "Prometheus at http://p answered no vector (bad step)"
        );
        assert!(parse_range_answer("http://p", b"[1,2]").is_err());
    }
}
