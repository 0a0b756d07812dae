//! Reading JSON: a body as JSON (an object), and a value deserialized with the failing field
//! named by its path. A leaf every body check uses.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{param_of, plain, shortened, GatewayError, QUOTED_MAX};

/// Deserializes `T` from `value`, naming the failing field by its path.
pub fn typed<T: DeserializeOwned>(value: Value) -> Result<T, GatewayError> {
    typed_ref(&value)
}

/// [`typed`] without taking (or copying) the value. The error's `param` is the failing
/// field: the path's first segment, a field of `T`, unless the error is about a field `T`
/// does not have (its name is the client's, and a `param` is logged).
pub fn typed_ref<T: DeserializeOwned>(value: &Value) -> Result<T, GatewayError> {
    serde_path_to_error::deserialize::<_, T>(value).map_err(|e| {
        let path = e.path().to_string();
        if path == "." || path.is_empty() {
            let message = shortened(plain(&e.inner().to_string()), QUOTED_MAX);
            return GatewayError::bad_request(message, None);
        }
        let inner = plain(&e.inner().to_string());
        // Each part cut on its own: the path may be a client's key too.
        let message = format!(
            "{}: {}",
            shortened(path.clone(), 64),
            shortened(inner.clone(), QUOTED_MAX - 64)
        );
        let field = path
            .split(['.', '['])
            .next()
            .and_then(|f| param_of(f, &inner));
        match field {
            Some(field) => GatewayError::bad_field(message, field),
            None => GatewayError::bad_request(message, None),
        }
    })
}

/// How many JSON values and object keys `bytes` holds, at most (each `,` `:` `[` `{` outside
/// strings, plus one): what its parsed form takes in memory grows with it (a value is 32 bytes
/// and more in its array or map, however few bytes it took in the text: `0,` is two). One pass,
/// no allocation; the text need not be valid JSON.
pub fn json_values(bytes: &[u8]) -> usize {
    let (mut values, mut in_string, mut escaped) = (1usize, false, false);
    for &b in bytes {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b',' | b':' | b'[' | b'{' => values += 1,
            _ => {}
        }
    }
    values
}

/// The body as a JSON object.
pub fn json_object(bytes: &[u8]) -> Result<Value, GatewayError> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err(GatewayError::bad_request(
            "the request body must be a JSON object",
            None,
        )),
        Err(e) => Err(GatewayError::bad_request(
            format!("the request body is not valid JSON: {e}"),
            None,
        )),
    }
}

/// A request body read as JSON; 400 naming the syntax error's place when it is not.
pub fn json_body(bytes: &[u8]) -> Result<Value, GatewayError> {
    serde_json::from_slice(bytes).map_err(|e| {
        GatewayError::bad_request(format!("the request body is not valid JSON: {e}"), None)
    })
}
