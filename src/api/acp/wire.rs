//! JSON-RPC 2.0 as an ACP client sends it over the WebSocket: what one
//! text frame holds ([`Incoming`]), and the frames the gateway sends back
//! (responses, errors, notifications, requests). Pure: no socket, no state.

use serde_json::{json, Value};

use crate::error::Error;

/// JSON-RPC: the text is not JSON.
pub const PARSE_ERROR: i64 = -32700;
/// JSON-RPC: JSON, but not a request, notification or response.
pub const INVALID_REQUEST: i64 = -32600;
/// JSON-RPC: no such method.
pub const METHOD_NOT_FOUND: i64 = -32601;
/// JSON-RPC: the params are wrong (or name no session of this client).
pub const INVALID_PARAMS: i64 = -32602;
/// JSON-RPC: the gateway failed.
pub const INTERNAL_ERROR: i64 = -32603;
/// The gateway refused for a reason of its own (a conflict, a limit, an
/// agent that cannot start): `data` holds its problem (`status`, `code`,
/// `detail`), as the REST API would have answered.
pub const GATEWAY_ERROR: i64 = -32000;

/// One frame from the client.
#[derive(Debug, PartialEq)]
pub enum Incoming {
    /// A call that wants an answer.
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    /// A call without an id.
    Notification { method: String, params: Value },
    /// The answer to a request the gateway sent (`result` or `error`).
    Response {
        id: Value,
        outcome: Result<Value, Value>,
    },
    /// Not a message: the error to answer it with (id `null` unless one
    /// could be read).
    Invalid {
        id: Value,
        code: i64,
        message: String,
    },
}

impl Incoming {
    /// Reads one text frame.
    pub fn parse(text: &str) -> Incoming {
        let value: Value = match serde_json::from_str(text) {
            Ok(value) => value,
            Err(e) => {
                return Incoming::Invalid {
                    id: Value::Null,
                    code: PARSE_ERROR,
                    message: format!("not JSON: {e}"),
                }
            }
        };
        let Value::Object(mut object) = value else {
            return invalid(
                Value::Null,
                "a message is a JSON object (batches are not served)",
            );
        };
        let id = object.remove("id");
        if let Some(id) = &id {
            if !(id.is_string() || id.is_number() || id.is_null()) {
                return invalid(Value::Null, "id must be a string or a number");
            }
        }
        if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return invalid(id.unwrap_or(Value::Null), "jsonrpc must be \"2.0\"");
        }
        let params = object.remove("params").unwrap_or(Value::Null);
        match (object.remove("method"), id) {
            (Some(Value::String(method)), Some(id)) => Incoming::Request { id, method, params },
            (Some(Value::String(method)), None) => Incoming::Notification { method, params },
            (Some(_), id) => invalid(id.unwrap_or(Value::Null), "method must be a string"),
            (None, Some(id)) => match (object.remove("result"), object.remove("error")) {
                (Some(result), None) => Incoming::Response {
                    id,
                    outcome: Ok(result),
                },
                (None, Some(error)) => Incoming::Response {
                    id,
                    outcome: Err(error),
                },
                _ => invalid(id, "a response has exactly one of result and error"),
            },
            (None, None) => invalid(Value::Null, "neither a request nor a response"),
        }
    }
}

fn invalid(id: Value, message: &str) -> Incoming {
    Incoming::Invalid {
        id,
        code: INVALID_REQUEST,
        message: message.to_owned(),
    }
}

/// A successful response.
pub fn result(id: &Value, result: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string()
}

/// An error response.
pub fn error(id: &Value, code: i64, message: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}).to_string()
}

/// The error response for a gateway error: its problem in `data`. Not
/// found and invalid input are `-32602`, the gateway's own failures
/// `-32603` (their details are logged, not sent), the rest `-32000`.
pub fn gateway_error(id: &Value, e: Error) -> String {
    let problem = e.problem();
    let code = match problem.status {
        400 | 404 | 422 => INVALID_PARAMS,
        500 => INTERNAL_ERROR,
        _ => GATEWAY_ERROR,
    };
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {
            "code": code,
            "message": problem.detail,
            "data": {"status": problem.status, "code": problem.code, "detail": problem.detail},
        },
    })
    .to_string()
}

/// A notification to the client.
pub fn notification(method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "method": method, "params": params}).to_string()
}

/// A request to the client.
pub fn request(id: i64, method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_read_as_requests_notifications_responses_or_errors() {
        let request =
            Incoming::parse(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#);
        assert_eq!(
            request,
            Incoming::Request {
                id: json!(1),
                method: "initialize".into(),
                params: json!({})
            }
        );
        let note = Incoming::parse(r#"{"jsonrpc":"2.0","method":"session/cancel"}"#);
        assert!(matches!(note, Incoming::Notification { .. }));
        let answer = Incoming::parse(r#"{"jsonrpc":"2.0","id":"a","result":{}}"#);
        assert!(matches!(answer, Incoming::Response { outcome: Ok(_), .. }));
        let garbage = Incoming::parse("{nope");
        assert!(matches!(
            garbage,
            Incoming::Invalid {
                code: PARSE_ERROR,
                ..
            }
        ));
        let array = Incoming::parse("[]");
        assert!(matches!(
            array,
            Incoming::Invalid {
                code: INVALID_REQUEST,
                ..
            }
        ));
        let no_version = Incoming::parse(r#"{"id":3,"method":"x"}"#);
        assert_eq!(
            no_version,
            Incoming::Invalid {
                id: json!(3),
                code: INVALID_REQUEST,
                message: "jsonrpc must be \"2.0\"".into()
            }
        );
    }
}
