//! The web console's HTTP hygiene, as pure checks on a request's parts: the Host header
//! must name the console (a page a DNS-rebinding site loads is refused), a POST must come
//! from a page of the console (`Origin`, else `Referer`) as a form of at most
//! [`MAX_BODY`] bytes arriving in time, and every path segment used as a Kubernetes name is a valid name
//! before anything reads the cluster. Each refusal is one line with its status.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hyper::StatusCode;

use crate::edit::Kind;

/// The largest form body accepted.
pub const MAX_BODY: usize = 64 << 10;

/// The form content type a POST must carry.
pub const FORM: &str = "application/x-www-form-urlencoded";

/// A request refused: its status and the one line saying why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    pub status: StatusCode,
    pub message: String,
}

impl Refusal {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Refusal {
        Refusal {
            status,
            message: message.into(),
        }
    }
}

/// Whether `host` (a Host header's value) names the console listening on `listen`: the
/// listen address itself; on loopback also `localhost`, `127.0.0.1` and `[::1]` with its
/// port; on the unspecified address (0.0.0.0, ::) any IP literal with its port (a
/// DNS-rebinding page always arrives with a name, never a literal).
pub fn host_allowed(host: &str, listen: SocketAddr) -> bool {
    let host = host.trim().to_ascii_lowercase();
    let (name, port) = match host.rsplit_once(':') {
        Some((n, p)) if !n.is_empty() && (!n.starts_with('[') || n.ends_with(']')) => {
            match p.parse::<u16>() {
                Ok(p) => (n.to_string(), p),
                Err(_) => return false,
            }
        }
        _ if !host.starts_with('[') || host.ends_with(']') => (host.clone(), 80),
        _ => return false,
    };
    if port != listen.port() {
        return false;
    }
    let literal: Option<IpAddr> = name
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok();
    if name.starts_with('[') != literal.is_some_and(|ip| ip.is_ipv6()) {
        return false;
    }
    match literal {
        Some(ip) if ip == listen.ip() => true,
        Some(ip) if listen.ip().is_unspecified() => !ip.is_unspecified(),
        Some(ip) => listen.ip().is_loopback() && ip.is_loopback(),
        None => name == "localhost" && (listen.ip().is_loopback() || listen.ip().is_unspecified()),
    }
}

/// Checks the Host header (421 when it names something else, 400 when absent).
pub fn check_host(host: Option<&str>, listen: SocketAddr) -> Result<String, Refusal> {
    let Some(host) = host else {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "no Host header: the console answers requests for its own address only",
        ));
    };
    if !host_allowed(host, listen) {
        return Err(Refusal::new(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "Host `{}` is not this console ({listen}): open the console by its listen address",
                host.escape_default()
            ),
        ));
    }
    Ok(host.to_string())
}

/// Checks that a POST comes from a page of the console at `host` (the checked Host value):
/// its `Origin` is `http://HOST`, or without one its `Referer` starts with `http://HOST/`.
pub fn check_origin(
    host: &str,
    origin: Option<&str>,
    referer: Option<&str>,
) -> Result<(), Refusal> {
    let base = format!("http://{}", host.to_ascii_lowercase());
    let ok = match (origin, referer) {
        (Some(o), _) => o.to_ascii_lowercase() == base,
        (None, Some(r)) => r.to_ascii_lowercase().starts_with(&format!("{base}/")),
        (None, None) => false,
    };
    if ok {
        return Ok(());
    }
    Err(Refusal::new(
        StatusCode::FORBIDDEN,
        format!(
            "a POST must come from the console's own page: Origin (or Referer) must be {base}, got {}",
            origin
                .or(referer)
                .map_or("none".to_string(), |v| format!("`{}`", v.escape_default()))
        ),
    ))
}

/// Checks a POST's content type and declared length.
pub fn check_form(content_type: Option<&str>, length: Option<&str>) -> Result<(), Refusal> {
    let media = content_type
        .and_then(|c| c.split(';').next())
        .map(|c| c.trim().to_ascii_lowercase());
    if media.as_deref() != Some(FORM) {
        return Err(Refusal::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "Content-Type {}: accepted {FORM} (an HTML form)",
                content_type.map_or("none".to_string(), |c| format!("`{}`", c.escape_default()))
            ),
        ));
    }
    if let Some(n) = length.and_then(|l| l.trim().parse::<u64>().ok()) {
        if n > MAX_BODY as u64 {
            return Err(too_large());
        }
    }
    Ok(())
}

/// The refusal of a body over [`MAX_BODY`].
pub fn too_large() -> Refusal {
    Refusal::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("the form is over {} KiB: nothing done", MAX_BODY >> 10),
    )
}

/// The refusal of a body that did not arrive whole within `limit`.
pub fn too_slow(limit: Duration) -> Refusal {
    Refusal::new(
        StatusCode::REQUEST_TIMEOUT,
        format!(
            "the form did not arrive within {} s: nothing done",
            limit.as_secs_f64()
        ),
    )
}

/// A DNS-1123 label (a namespace): 1–63 of `a-z0-9-`, alphanumeric at both ends.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn bad_name(what: &str, value: &str, accepted: &str) -> Refusal {
    Refusal::new(
        StatusCode::BAD_REQUEST,
        format!(
            "{what} `{}` is not valid: accepted {accepted}",
            value.escape_default()
        ),
    )
}

/// A namespace from a path or query.
pub fn namespace(s: &str) -> Result<String, Refusal> {
    if is_dns_label(s) {
        Ok(s.to_string())
    } else {
        Err(bad_name(
            "namespace",
            s,
            "a DNS-1123 label (a-z, 0-9, '-', at most 63)",
        ))
    }
}

/// A node or workload name from a path.
pub fn object_name(what: &str, s: &str) -> Result<String, Refusal> {
    if gpuslice_dra::slices::is_dns_subdomain(s, 253) {
        Ok(s.to_string())
    } else {
        Err(bad_name(
            what,
            s,
            "a DNS-1123 subdomain (a-z, 0-9, '-', '.', at most 253)",
        ))
    }
}

/// A workload kind from a path (lowercase, as the links spell it).
pub fn kind(s: &str) -> Result<Kind, Refusal> {
    match s {
        "deployment" => Ok(Kind::Deployment),
        "statefulset" => Ok(Kind::StatefulSet),
        "daemonset" => Ok(Kind::DaemonSet),
        _ => Err(bad_name("kind", s, "deployment, statefulset or daemonset")),
    }
}

/// What a path asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Nodes,
    Node(String),
    Pods,
    Idle,
    Workloads,
    Budgets,
    Workload(Workload),
    Allocate(Workload),
    Release(Workload),
    Css,
}

/// A workload named by a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    pub namespace: String,
    pub kind: Kind,
    pub name: String,
}

impl Workload {
    /// `deployment/NAME`, as kubectl-gpuslice takes it.
    pub fn arg(&self) -> String {
        format!("{}/{}", self.kind.as_str(), self.name)
    }
}

/// The route of `path`; 404 for no route, 400 for a route with an invalid name.
pub fn route(path: &str) -> Result<Route, Refusal> {
    let segments: Vec<&str> = path.strip_prefix('/').unwrap_or(path).split('/').collect();
    let workload = |ns: &str, kind_: &str, name: &str| -> Result<Workload, Refusal> {
        Ok(Workload {
            namespace: namespace(ns)?,
            kind: kind(kind_)?,
            name: object_name("workload name", name)?,
        })
    };
    match segments.as_slice() {
        [""] => Ok(Route::Nodes),
        ["pods"] => Ok(Route::Pods),
        ["idle"] => Ok(Route::Idle),
        ["workloads"] => Ok(Route::Workloads),
        ["budgets"] => Ok(Route::Budgets),
        ["nodes", n] => Ok(Route::Node(object_name("node name", n)?)),
        ["workloads", ns, k, n] => Ok(Route::Workload(workload(ns, k, n)?)),
        ["workloads", ns, k, n, "allocate"] => Ok(Route::Allocate(workload(ns, k, n)?)),
        ["workloads", ns, k, n, "release"] => Ok(Route::Release(workload(ns, k, n)?)),
        ["static", "console.css"] => Ok(Route::Css),
        _ => Err(Refusal::new(
            StatusCode::NOT_FOUND,
            format!(
                "no page {}: the console has /, /nodes/NAME, /pods, /idle, /workloads, /workloads/NS/KIND/NAME and /budgets",
                path.escape_default()
            ),
        )),
    }
}

impl Route {
    /// Whether the route is an action (POST only); pages take GET and HEAD.
    pub fn is_action(&self) -> bool {
        matches!(self, Route::Allocate(_) | Route::Release(_))
    }
}

/// The value of query parameter `key` (`None` when absent).
pub fn query_param(query: Option<&str>, key: &str) -> Option<String> {
    form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_host_must_name_the_console() {
        let lo = addr("127.0.0.1:8080");
        for ok in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST:8080",
            "[::1]:8080",
        ] {
            assert!(host_allowed(ok, lo), "{ok}");
        }
        for bad in [
            "evil.example:8080",
            "127.0.0.1:8081",
            "localhost",
            "127.0.0.1",
            "10.0.0.1:8080",
            "127.0.0.1:8080:1",
            "[::1:8080",
            "::1:8080",
            "",
        ] {
            assert!(!host_allowed(bad, lo), "{bad}");
        }
        let any = addr("0.0.0.0:9000");
        assert!(host_allowed("10.1.2.3:9000", any));
        assert!(!host_allowed("console.example:9000", any));
        let one = addr("10.1.2.3:9000");
        assert!(host_allowed("10.1.2.3:9000", one));
        assert!(!host_allowed("localhost:9000", one) && !host_allowed("10.1.2.4:9000", one));
        let e = check_host(Some("evil.example:8080"), lo).unwrap_err();
        assert_eq!(e.status, StatusCode::MISDIRECTED_REQUEST);
        assert!(e.message.contains("evil.example:8080") && e.message.contains("127.0.0.1:8080"));
        assert_eq!(
            check_host(None, lo).unwrap_err().status,
            StatusCode::BAD_REQUEST
        );
    }

    #[test]
    fn posts_come_from_the_consoles_page_as_small_forms() {
        let h = "127.0.0.1:8080";
        assert!(check_origin(h, Some("http://127.0.0.1:8080"), None).is_ok());
        assert!(check_origin(
            h,
            None,
            Some("http://127.0.0.1:8080/workloads/a/deployment/b")
        )
        .is_ok());
        for (o, r) in [
            (None, None),
            (Some("http://evil.example"), None),
            (Some("null"), Some("http://127.0.0.1:8080/")),
            (None, Some("http://127.0.0.1:8080.evil.example/")),
        ] {
            let e = check_origin(h, o, r).unwrap_err();
            assert_eq!(e.status, StatusCode::FORBIDDEN, "{o:?} {r:?}");
        }
        assert!(check_form(
            Some("application/x-www-form-urlencoded; charset=UTF-8"),
            Some("10")
        )
        .is_ok());
        assert_eq!(
            check_form(Some("application/json"), None)
                .unwrap_err()
                .status,
            StatusCode::UNSUPPORTED_MEDIA_TYPE
        );
        assert_eq!(
            check_form(None, None).unwrap_err().status,
            StatusCode::UNSUPPORTED_MEDIA_TYPE
        );
        assert_eq!(
            check_form(Some(FORM), Some("65537")).unwrap_err().status,
            StatusCode::PAYLOAD_TOO_LARGE
        );
        assert!(check_form(Some(FORM), Some("65536")).is_ok());
    }

    #[test]
    fn routes_validate_every_name_they_carry() {
        assert_eq!(route("/"), Ok(Route::Nodes));
        assert_eq!(route("/budgets"), Ok(Route::Budgets));
        assert_eq!(
            route("/nodes/n1.example"),
            Ok(Route::Node("n1.example".into()))
        );
        assert_eq!(
            route("/workloads/ml/statefulset/db/release"),
            Ok(Route::Release(Workload {
                namespace: "ml".into(),
                kind: Kind::StatefulSet,
                name: "db".into()
            }))
        );
        for bad in [
            "/workloads/..%2f../x/y",
            "/workloads/ml/deployment/..",
            "/workloads/ml/pod/x",
            "/workloads/ML/deployment/x",
            "/nodes/%3Cscript%3E",
            "/nodes/a_b",
        ] {
            let e = route(bad).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
            assert!(!e.message.contains('\n'));
        }
        let e = route("/workloads/..%2f../x/y").unwrap_err();
        assert_eq!(
            e.message,
            "namespace `..%2f..` is not valid: accepted a DNS-1123 label (a-z, 0-9, '-', at most 63)"
        );
        for missing in [
            "/x",
            "/nodes",
            "/nodes/a/b",
            "/static/x.js",
            "/workloads/a/deployment/b/delete",
            "/budgets/x",
        ] {
            assert_eq!(
                route(missing).unwrap_err().status,
                StatusCode::NOT_FOUND,
                "{missing}"
            );
        }
        assert_eq!(
            query_param(Some("a=1&namespace=ml"), "namespace").as_deref(),
            Some("ml")
        );
        assert_eq!(query_param(None, "namespace"), None);
    }
}
