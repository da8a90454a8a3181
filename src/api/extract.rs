//! Extractors that turn every bad input into the same problem+json shape:
//! malformed JSON → 400, wrong shape → 422, not JSON → 415, too large → 413,
//! an id that is not a UUID → 404.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use crate::error::Error;

/// `axum::Json` with our error shape.
pub struct AppJson<T>(pub T);

impl<T, S> FromRequest<S> for AppJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = Error;

    async fn from_request(req: Request, state: &S) -> Result<Self, Error> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(AppJson(value)),
            Err(rejection) => Err(match rejection {
                JsonRejection::JsonDataError(e) => Error::Unprocessable(e.body_text()),
                JsonRejection::JsonSyntaxError(e) => Error::BadRequest(e.body_text()),
                JsonRejection::MissingJsonContentType(_) => Error::UnsupportedMediaType(
                    "expected a JSON body with Content-Type: application/json".into(),
                ),
                other if other.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                    Error::PayloadTooLarge("request body is too large".into())
                }
                other => Error::BadRequest(other.body_text()),
            }),
        }
    }
}

/// `axum::extract::Path` where a malformed id means "no such resource".
pub struct AppPath<T>(pub T);

impl<T, S> FromRequestParts<S> for AppPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Error> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| AppPath(p.0))
            .map_err(|e: PathRejection| {
                Error::NotFound(format!("no such resource: {}", e.body_text()))
            })
    }
}

/// `axum::extract::Query` with wrong values reported as 422.
pub struct AppQuery<T>(pub T);

impl<T, S> FromRequestParts<S> for AppQuery<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Error> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| AppQuery(q.0))
            .map_err(|e: QueryRejection| Error::Unprocessable(e.body_text()))
    }
}
