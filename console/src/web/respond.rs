//! The answers' common form: the security headers every answer carries (CSP, nosniff,
//! no-store, same-origin referrer, no framing), HTML pages and one-line refusals.

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};

use super::http::Refusal;

/// The Content-Security-Policy of every answer: no script, no fetches; styles from the
/// console and inline (the SVG charts), forms only to the console.
pub const CSP: &str = "default-src 'none'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'";

pub(super) fn respond(
    status: StatusCode,
    content_type: &'static str,
    body: String,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    r
}

pub(super) fn html(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    respond(status, "text/html; charset=utf-8", body)
}

pub(super) fn refusal(r: Refusal) -> Response<Full<Bytes>> {
    let mut resp = respond(
        r.status,
        "text/plain; charset=utf-8",
        format!("{}\n", r.message),
    );
    if r.status == StatusCode::METHOD_NOT_ALLOWED {
        let allow = if r.message.contains("POST only") {
            "POST"
        } else {
            "GET, HEAD"
        };
        resp.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static(allow));
    }
    if r.status == StatusCode::REQUEST_TIMEOUT {
        // The rest of a late body may still come: the connection carries nothing more.
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}
