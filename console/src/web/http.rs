//! The web console's HTTP hygiene, as pure checks on a request's parts: the Host header
//! must name the console (a page a DNS-rebinding site loads is refused), a POST must come
//! from a page of the console (`Origin`, else `Referer`) as a form of at most
//! [`MAX_BODY`] bytes arriving in time, and every path segment used as a Kubernetes name is a valid name
//! before anything reads the cluster. Each refusal is one line with its status.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use gpuslice_dra::slices::is_dns_label;
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

/// A Host header's value split into its lowercase name (an IPv6 literal keeps its brackets)
/// and its port, when it names one; `None` when it is not `NAME[:PORT]`.
fn split_host(host: &str) -> Option<(String, Option<u16>)> {
    let host = host.trim().to_ascii_lowercase();
    match host.rsplit_once(':') {
        Some((n, p)) if !n.is_empty() && (!n.starts_with('[') || n.ends_with(']')) => {
            p.parse::<u16>().ok().map(|p| (n.to_string(), Some(p)))
        }
        _ if !host.starts_with('[') || host.ends_with(']') => Some((host, None)),
        _ => None,
    }
}

/// Whether `host` (a Host header's value) names the console listening on `listen`: the
/// listen address itself; on loopback also `localhost` and any loopback IP literal; on the
/// unspecified address (0.0.0.0, ::) any IP literal with its port, and `localhost` and
/// loopback literals. `localhost` and loopback literals pass with any port (a
/// `kubectl port-forward 9000:8080` or an SSH tunnel names the console by its own local
/// port): a DNS-rebinding page always arrives with its own name, never these.
pub fn host_allowed(host: &str, listen: SocketAddr) -> bool {
    let Some((name, port)) = split_host(host) else {
        return false;
    };
    if name.is_empty() {
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
    let local_listen = listen.ip().is_loopback() || listen.ip().is_unspecified();
    let local_name = match literal {
        Some(ip) => ip.is_loopback(),
        None => name == "localhost",
    };
    if local_listen && local_name {
        return true;
    }
    if port.unwrap_or(80) != listen.port() {
        return false;
    }
    match literal {
        Some(ip) if ip == listen.ip() => true,
        Some(ip) => listen.ip().is_unspecified() && !ip.is_unspecified(),
        None => false,
    }
}

/// A `--public-url` that is not a URL the console can be reached by.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--public-url `{value}`: {why}; accepted: http:// or https://, a host name or IP literal and an optional port, no path but /, e.g. https://gpu.example.com")]
pub struct PublicUrlError {
    pub value: String,
    pub why: &'static str,
}

/// The port a URL without one means: 443 for https, 80 for http.
fn default_port(https: bool) -> u16 {
    if https {
        443
    } else {
        80
    }
}

/// A URL the console is opened by through a proxy or ingress (`--public-url`): its scheme,
/// host and port. A request whose Host names it passes [`check_host`]; a POST whose Origin is
/// its origin passes [`check_origin`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicUrl {
    https: bool,
    /// Lowercase; an IPv6 literal in brackets.
    host: String,
    /// The port, the scheme's default when the URL names none.
    port: u16,
}

impl PublicUrl {
    /// `http(s)://HOST[:PORT][/]`, nothing else.
    pub fn parse(value: &str) -> Result<PublicUrl, PublicUrlError> {
        let bad = |why| PublicUrlError {
            value: value.escape_default().to_string(),
            why,
        };
        let uri: hyper::Uri = value.parse().map_err(|_| bad("not a URL"))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(bad("the scheme is not http or https")),
        };
        let Some(authority) = uri.authority() else {
            return Err(bad("no host"));
        };
        if authority.as_str().contains('@') {
            return Err(bad("it carries a user name"));
        }
        if !matches!(
            uri.path_and_query().map(|p| p.as_str()),
            None | Some("" | "/")
        ) {
            return Err(bad("it has a path or query"));
        }
        let host = authority.host().to_ascii_lowercase();
        let literal = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .map(|h| h.parse::<std::net::Ipv6Addr>().is_ok());
        let name_ok = !host.is_empty()
            && host
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        if !(literal == Some(true) || (literal.is_none() && name_ok)) {
            return Err(bad("no valid host"));
        }
        let port = if authority.as_str().len() == authority.host().len() {
            default_port(https)
        } else {
            match authority.port_u16() {
                Some(p) if p > 0 => p,
                _ => return Err(bad("the port is not a number from 1 to 65535")),
            }
        };
        Ok(PublicUrl { https, host, port })
    }

    fn default_port(&self) -> u16 {
        default_port(self.https)
    }

    /// `https://gpu.example.com` as a browser writes it in `Origin` (no default port).
    pub fn origin(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        if self.port == self.default_port() {
            format!("{scheme}://{}", self.host)
        } else {
            format!("{scheme}://{}:{}", self.host, self.port)
        }
    }

    /// Whether Host header value `host` names this URL's host and port.
    pub fn names_host(&self, host: &str) -> bool {
        split_host(host).is_some_and(|(name, port)| {
            name == self.host && port.unwrap_or(self.default_port()) == self.port
        })
    }
}

/// Checks the Host header (421 when it names neither the console nor one of its `public`
/// URLs, 400 when absent).
pub fn check_host(
    host: Option<&str>,
    listen: SocketAddr,
    public: &[PublicUrl],
) -> Result<String, Refusal> {
    let Some(host) = host else {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "no Host header: the console answers requests for its own address only",
        ));
    };
    if !host_allowed(host, listen) && !public.iter().any(|u| u.names_host(host)) {
        return Err(Refusal::new(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "Host `{}` is not this console ({listen}): open the console by its listen address or a --public-url",
                host.escape_default()
            ),
        ));
    }
    Ok(host.to_string())
}

/// Checks that a POST comes from a page of the console at `host` (the checked Host value)
/// or at one of its `public` URLs: its `Origin` is `http://HOST` or a public URL's origin,
/// or without one its `Referer` starts with one of those and `/`.
pub fn check_origin(
    host: &str,
    origin: Option<&str>,
    referer: Option<&str>,
    public: &[PublicUrl],
) -> Result<(), Refusal> {
    let base = format!("http://{}", host.to_ascii_lowercase());
    let bases: Vec<String> = std::iter::once(base)
        .chain(public.iter().map(PublicUrl::origin))
        .collect();
    let ok = match (origin, referer) {
        (Some(o), _) => bases.contains(&o.to_ascii_lowercase()),
        (None, Some(r)) => {
            let r = r.to_ascii_lowercase();
            bases.iter().any(|b| r.starts_with(&format!("{b}/")))
        }
        (None, None) => false,
    };
    if ok {
        return Ok(());
    }
    Err(Refusal::new(
        StatusCode::FORBIDDEN,
        format!(
            "a POST must come from the console's own page: Origin (or Referer) must be {}, got {}",
            bases.join(" or "),
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
            // A port-forward or tunnel names the console by its own local port.
            "localhost:9000",
            "127.0.0.1:8081",
            "[::1]:9000",
            "localhost",
            "127.0.0.1",
        ] {
            assert!(host_allowed(ok, lo), "{ok}");
        }
        for bad in [
            "evil.example:8080",
            "evil.example:9000",
            "localhost.evil.example:9000",
            "10.0.0.1:8080",
            "127.0.0.1:8080:1",
            "localhost:x",
            "[::1:8080",
            "::1:8080",
            "",
        ] {
            assert!(!host_allowed(bad, lo), "{bad}");
        }
        let any = addr("0.0.0.0:9000");
        assert!(host_allowed("10.1.2.3:9000", any));
        assert!(
            !host_allowed("10.1.2.3:9001", any),
            "other literals keep the port"
        );
        assert!(host_allowed("localhost:8443", any) && host_allowed("127.0.0.1:1", any));
        assert!(!host_allowed("console.example:9000", any));
        let one = addr("10.1.2.3:9000");
        assert!(host_allowed("10.1.2.3:9000", one));
        assert!(!host_allowed("localhost:9000", one) && !host_allowed("10.1.2.4:9000", one));
        assert!(!host_allowed("127.0.0.1:9000", one) && !host_allowed("10.1.2.3:9001", one));
        let e = check_host(Some("evil.example:8080"), lo, &[]).unwrap_err();
        assert_eq!(e.status, StatusCode::MISDIRECTED_REQUEST);
        assert!(e.message.contains("evil.example:8080") && e.message.contains("127.0.0.1:8080"));
        assert_eq!(
            check_host(None, lo, &[]).unwrap_err().status,
            StatusCode::BAD_REQUEST
        );
    }

    #[test]
    fn public_urls_are_checked_and_name_the_console_behind_a_proxy() {
        let url = |s: &str| PublicUrl::parse(s).unwrap();
        let gpu = url("https://GPU.example.com");
        assert_eq!(url("https://gpu.example.com/"), gpu);
        assert_eq!(url("https://gpu.example.com:443"), gpu);
        assert_eq!(gpu.origin(), "https://gpu.example.com");
        assert_eq!(
            url("http://gpu.example.com:8080").origin(),
            "http://gpu.example.com:8080"
        );
        assert_eq!(url("http://[::1]:9000").origin(), "http://[::1]:9000");
        assert_eq!(url("http://10.0.0.5").origin(), "http://10.0.0.5");
        for (bad, why) in [
            ("gpu.example.com", "the scheme is not http or https"),
            ("ftp://gpu.example.com", "the scheme is not http or https"),
            ("https://gpu.example.com/console", "it has a path or query"),
            ("https://gpu.example.com/?a=1", "it has a path or query"),
            ("https://user@gpu.example.com", "it carries a user name"),
            ("https://gpu_example.com", "no valid host"),
            ("https://[zz]", "no valid host"),
            ("https://gpu.example.com:0", "the port is not a number"),
            ("", "not a URL"),
        ] {
            let e = PublicUrl::parse(bad).unwrap_err();
            let line = e.to_string();
            assert!(
                line.starts_with(&format!("--public-url `{bad}`: ")),
                "{line}"
            );
            assert!(e.why.starts_with(why), "{bad}: {line}");
            assert!(
                line.ends_with("accepted: http:// or https://, a host name or IP literal and an optional port, no path but /, e.g. https://gpu.example.com"),
                "{line}"
            );
        }
        // The Host a proxy keeps (oauth2-proxy, ingress-nginx) names the console; others do not.
        let public = [gpu.clone()];
        let lo = addr("127.0.0.1:8080");
        for ok in ["gpu.example.com", "GPU.example.com:443"] {
            assert_eq!(check_host(Some(ok), lo, &public).as_deref(), Ok(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "gpu.example.com:8443",
            "gpu.example.com.evil.example",
        ] {
            let e = check_host(Some(bad), lo, &public).unwrap_err();
            assert_eq!(e.status, StatusCode::MISDIRECTED_REQUEST, "{bad}");
        }
        assert!(check_host(Some("gpu.example.com"), lo, &[]).is_err());
        // A POST from the public page passes, whatever Host the proxy sent on.
        for host in ["gpu.example.com", "127.0.0.1:8080"] {
            assert!(check_origin(host, Some("https://gpu.example.com"), None, &public).is_ok());
            assert!(check_origin(
                host,
                None,
                Some("https://gpu.example.com/workloads/a/deployment/b"),
                &public
            )
            .is_ok());
            for (o, r) in [
                (Some("https://evil.example"), None),
                (Some("http://gpu.example.com"), None),
                (None, Some("https://gpu.example.com.evil.example/")),
                (None, Some("https://gpu.example.com")),
            ] {
                if host == "gpu.example.com" && o == Some("http://gpu.example.com") {
                    // http://HOST is the console's own page as before.
                    continue;
                }
                let e = check_origin(host, o, r, &public).unwrap_err();
                assert_eq!(e.status, StatusCode::FORBIDDEN, "{host} {o:?} {r:?}");
            }
        }
        // Without --public-url its origin is foreign.
        let e =
            check_origin("127.0.0.1:8080", Some("https://gpu.example.com"), None, &[]).unwrap_err();
        assert_eq!(e.status, StatusCode::FORBIDDEN);
        let e = check_origin("127.0.0.1:8080", None, None, &public).unwrap_err();
        assert!(
            e.message
                .contains("must be http://127.0.0.1:8080 or https://gpu.example.com, got none"),
            "{}",
            e.message
        );
    }

    #[test]
    fn posts_come_from_the_consoles_page_as_small_forms() {
        let h = "127.0.0.1:8080";
        assert!(check_origin(h, Some("http://127.0.0.1:8080"), None, &[]).is_ok());
        assert!(check_origin(
            h,
            None,
            Some("http://127.0.0.1:8080/workloads/a/deployment/b"),
            &[]
        )
        .is_ok());
        // Through `kubectl port-forward 9000:8080`: Host and Origin both name the local port.
        assert!(check_origin("localhost:9000", Some("http://localhost:9000"), None, &[]).is_ok());
        for (o, r) in [
            (None, None),
            (Some("http://evil.example"), None),
            (Some("null"), Some("http://127.0.0.1:8080/")),
            (None, Some("http://127.0.0.1:8080.evil.example/")),
        ] {
            let e = check_origin(h, o, r, &[]).unwrap_err();
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
