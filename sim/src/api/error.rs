//! vLLM's error responses: `{"error": {"message", "type", "param", "code"}}` with the status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// An error as vLLM reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status (also the `code` field).
    pub status: StatusCode,
    /// `BadRequestError`, `NotFoundError`, `PermissionDeniedError`, `InternalServerError`.
    pub kind: &'static str,
    /// Human-readable message.
    pub message: String,
    /// The offending parameter, if one.
    pub param: Option<&'static str>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: u16,
}

impl ApiError {
    /// 400 `BadRequestError`.
    pub fn bad_request(message: impl Into<String>, param: Option<&'static str>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "BadRequestError",
            message: message.into(),
            param,
        }
    }

    /// 404 `NotFoundError` for a model this server does not serve.
    pub fn model_not_found(model: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            kind: "NotFoundError",
            message: format!("The model `{model}` does not exist."),
            param: Some("model"),
        }
    }

    /// 403 `PermissionDeniedError` (vLLM's answer on a route that a flag turns on).
    pub fn permission_denied(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::FORBIDDEN,
            kind: "PermissionDeniedError",
            message: message.into(),
            param: None,
        }
    }

    /// 500 `InternalServerError`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "InternalServerError",
            message: message.into(),
            param: None,
        }
    }

    /// The JSON body.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&Body {
            error: Inner {
                message: &self.message,
                kind: self.kind,
                param: self.param,
                code: self.status.as_u16(),
            },
        })
        .expect("error body serializes")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            self.to_json(),
        )
            .into_response()
    }
}
