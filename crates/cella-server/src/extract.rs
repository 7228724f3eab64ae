//! Request extractors whose failures speak the error envelope.

use crate::error::ApiError;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use cella_types::ErrorCode;
use serde::de::DeserializeOwned;
use serde_json::json;

fn field_of(path: &str, message: &str) -> String {
    // serde names unknown and missing fields only in its message: "unknown field `x`, ...".
    for marker in ["unknown field `", "missing field `"] {
        if let Some(rest) = message.split(marker).nth(1) {
            if let Some(name) = rest.split('`').next() {
                return if path == "." || path.is_empty() {
                    name.to_string()
                } else if path == name || path.ends_with(&format!(".{name}")) {
                    // serde_path_to_error already put the unknown field at the end of the path.
                    path.to_string()
                } else {
                    format!("{path}.{name}")
                };
            }
        }
    }
    path.to_string()
}

/// Parses a JSON body. Bad JSON, wrong types and unknown fields are 400 `INVALID_REQUEST` with
/// the field named in `details`; an empty body counts as `{}`.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let bytes: &[u8] = if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        b"{}"
    } else {
        bytes
    };
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de);
    if value.is_ok() {
        de.end().map_err(|e| {
            ApiError::new(
                ErrorCode::InvalidRequest,
                format!("malformed JSON body: {e}"),
            )
            .with_details(json!({ "field": null, "line": e.line(), "column": e.column() }))
        })?;
    }
    value.map_err(|e| {
        let inner = e.inner();
        let message = inner.to_string();
        // serde_json reports a wrong type for an enum (`{"size": 2}`) as a syntax error:
        // only a body that is not well-formed JSON is "malformed".
        if (inner.is_syntax() || inner.is_eof()) && !well_formed(bytes) {
            return ApiError::new(
                ErrorCode::InvalidRequest,
                format!("malformed JSON body: {message}"),
            )
            .with_details(
                json!({ "field": null, "line": inner.line(), "column": inner.column() }),
            );
        }
        let field = field_of(&e.path().to_string(), &message);
        if inner.is_syntax() {
            let found = value_at(bytes, e.path()).map(describe).unwrap_or("a value");
            return ApiError::new(
                ErrorCode::InvalidRequest,
                format!("invalid request body: invalid type: {found} for `{field}`"),
            )
            .with_details(json!({ "field": field }));
        }
        let msg = message
            .split(" at line ")
            .next()
            .unwrap_or(&message)
            .to_string();
        ApiError::new(
            ErrorCode::InvalidRequest,
            format!("invalid request body: {msg}"),
        )
        .with_details(json!({ "field": field }))
    })
}

fn well_formed(bytes: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_ok()
}

/// The JSON value at a deserializer's error path, for naming what was sent instead.
fn value_at(bytes: &[u8], path: &serde_path_to_error::Path) -> Option<serde_json::Value> {
    use serde_path_to_error::Segment;
    let mut v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    for seg in path.iter() {
        v = match seg {
            Segment::Map { key } => v.get_mut(key.as_str())?.take(),
            Segment::Seq { index } => v.get_mut(*index)?.take(),
            _ => return None,
        };
    }
    Some(v)
}

fn describe(v: serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// A request body read whole but not parsed yet: the handler parses it as it needs (a bare POST
/// may have none).
pub struct ApiBody(pub Bytes);

impl ApiBody {
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        parse_json(&self.0)
    }

    /// No body at all (a bare POST).
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|b| b.is_ascii_whitespace())
    }
}

impl<S: Send + Sync> FromRequest<S> for ApiBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        read_body(req, state).await.map(ApiBody)
    }
}

async fn read_body<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, state).await.map_err(|e| match e {
        BytesRejection::FailedToBufferBody(ref inner)
            if matches!(
                inner,
                axum::extract::rejection::FailedToBufferBody::LengthLimitError(_)
            ) =>
        {
            ApiError::new(ErrorCode::PayloadTooLarge, "request body too large")
        }
        other => ApiError::new(
            ErrorCode::InvalidRequest,
            format!("cannot read request body: {other}"),
        ),
    })
}

/// Query parameters as ordered pairs; routes check names and values themselves.
pub struct QueryPairs(pub Vec<(String, String)>);

impl<S: Send + Sync> FromRequestParts<S> for QueryPairs {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let q = parts.uri.query().unwrap_or("");
        let pairs: Vec<(String, String)> = serde_urlencoded_pairs(q)?;
        Ok(QueryPairs(pairs))
    }
}

fn serde_urlencoded_pairs(q: &str) -> Result<Vec<(String, String)>, ApiError> {
    let mut out = Vec::new();
    for part in q.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        let dec = |s: &str| -> Result<String, ApiError> {
            let s = s.replace('+', " ");
            percent_decode(&s)
                .ok_or_else(|| ApiError::new(ErrorCode::InvalidRequest, "malformed query string"))
        };
        out.push((dec(k)?, dec(v)?));
    }
    Ok(out)
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Common list parameters: `limit` (1-1000, default 100) and `cursor`.
pub struct Page {
    pub limit: u32,
    pub cursor: Option<i64>,
}

impl Page {
    /// Takes `limit` and `cursor` out of `pairs`.
    pub fn take(pairs: &mut Vec<(String, String)>) -> Result<Page, ApiError> {
        let mut page = Page {
            limit: 100,
            cursor: None,
        };
        let mut rest = Vec::new();
        for (k, v) in pairs.drain(..) {
            match k.as_str() {
                "limit" => {
                    page.limit = v
                        .parse::<u32>()
                        .ok()
                        .filter(|l| (1..=1000).contains(l))
                        .ok_or_else(|| {
                            ApiError::invalid(
                                "limit",
                                "limit must be a whole number from 1 to 1000",
                            )
                        })?
                }
                "cursor" => {
                    page.cursor = Some(
                        v.strip_prefix('c')
                            .and_then(|n| n.parse::<i64>().ok())
                            .ok_or_else(|| {
                                ApiError::invalid(
                                    "cursor",
                                    "cursor is not one this server handed out",
                                )
                            })?,
                    )
                }
                _ => rest.push((k, v)),
            }
        }
        *pairs = rest;
        Ok(page)
    }
}

pub fn cursor_for(seq: i64) -> String {
    format!("c{seq}")
}

/// 400 for the first query parameter a route does not take.
pub fn reject_unknown(pairs: &[(String, String)]) -> Result<(), ApiError> {
    match pairs.first() {
        Some((k, _)) => Err(ApiError::invalid(
            k,
            format!("unknown query parameter {k:?}"),
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cella_types::CreateSandbox;

    #[test]
    fn json_errors_name_the_field() {
        let e = parse_json::<CreateSandbox>(br#"{"timeout_sec": "x"}"#)
            .err()
            .unwrap();
        assert_eq!(e.details.unwrap()["field"], "timeout_sec");
        let e = parse_json::<CreateSandbox>(br#"{"bogus": 1}"#)
            .err()
            .unwrap();
        assert_eq!(e.details.unwrap()["field"], "bogus");
        let e = parse_json::<CreateSandbox>(br#"{"timeout_sec": 1"#)
            .err()
            .unwrap();
        assert!(e.message.starts_with("malformed JSON"));
        assert!(parse_json::<CreateSandbox>(b"").is_ok());
        // Well-formed JSON with the wrong type for an enum is a type error, not malformed.
        let e = parse_json::<CreateSandbox>(br#"{"size": 2}"#)
            .err()
            .unwrap();
        assert_eq!(
            e.message,
            "invalid request body: invalid type: a number for `size`"
        );
        assert_eq!(e.details.unwrap()["field"], "size");
        let e = parse_json::<CreateSandbox>(br#"{"size": [1]} x"#)
            .err()
            .unwrap();
        assert!(e.message.starts_with("malformed JSON"), "{}", e.message);
    }

    #[test]
    fn query_pairs_decode() {
        let p = serde_urlencoded_pairs("a=1&metadata.team=x%20y&b=c+d").unwrap();
        assert_eq!(p[1], ("metadata.team".to_string(), "x y".to_string()));
        assert_eq!(p[2].1, "c d");
        assert!(serde_urlencoded_pairs("a=%zz").is_err());
    }
}
