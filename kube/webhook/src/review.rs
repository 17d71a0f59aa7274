//! The AdmissionReview exchange (`admission.k8s.io/v1`): the request fields the webhook reads
//! and the response it writes (a JSON Patch, warnings, or a refusal with one line).

use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Value};

/// A review that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("the body is not an admission.k8s.io/v1 AdmissionReview: {0}")]
    Json(#[from] serde_json::Error),
    #[error("the AdmissionReview has no request")]
    NoRequest,
}

/// The parts of an AdmissionRequest the webhook reads.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Request {
    pub uid: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub operation: String,
    #[serde(default)]
    pub dry_run: bool,
    #[serde(default)]
    pub object: Value,
}

#[derive(Deserialize)]
struct Review {
    request: Option<Request>,
}

/// Reads the request of a review.
pub fn parse(body: &[u8]) -> Result<Request, ReviewError> {
    serde_json::from_slice::<Review>(body)?
        .request
        .ok_or(ReviewError::NoRequest)
}

fn review(response: Value) -> Value {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
}

/// Admits, with `patch` (JSON Patch operations; none: unchanged) and `warnings`.
pub fn allow(uid: &str, patch: &[Value], warnings: &[String]) -> Value {
    let mut r = json!({"uid": uid, "allowed": true});
    if !patch.is_empty() {
        let bytes = serde_json::to_vec(patch).unwrap_or_default();
        r["patchType"] = json!("JSONPatch");
        r["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(bytes));
    }
    if !warnings.is_empty() {
        r["warnings"] = json!(warnings);
    }
    review(r)
}

/// Refuses with `message` (one line) and HTTP-like `code` (400: the request; 500: the webhook
/// could not do its part).
pub fn deny(uid: &str, code: u16, message: &str) -> Value {
    review(json!({
        "uid": uid,
        "allowed": false,
        "status": {"code": code, "message": message},
    }))
}
