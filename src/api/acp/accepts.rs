//! What an ACP client's prompt may carry: the gateway's prompt path takes
//! any ACP content block (as `POST …/prompts` does) and passes it to the
//! agent as it is, so what a session accepts is what its agent said it
//! accepts at its `initialize` (its `promptCapabilities`, which the
//! conversation keeps). Pure: the capabilities come in as arguments.

use serde_json::{json, Value};

use crate::error::{Error, Result};

/// What the gateway itself accepts in a prompt: every kind of block.
pub fn gateway_accepts() -> Value {
    json!({"image": true, "audio": true, "embeddedContext": true})
}

/// The capability a block of `kind` needs, if any (`text` and
/// `resource_link` every agent accepts).
fn needs(kind: &str) -> Option<&'static str> {
    match kind {
        "image" => Some("image"),
        "audio" => Some("audio"),
        "resource" => Some("embeddedContext"),
        _ => None,
    }
}

/// Refuses (422, `-32602` to the client) the first block of `prompt`
/// whose kind the session's agent `agent` did not say it accepts in
/// `capabilities`; `None` (its agent never answered `initialize`) refuses
/// nothing.
pub fn check(prompt: &[Value], capabilities: Option<&Value>, agent: &str) -> Result<()> {
    let Some(capabilities) = capabilities else {
        return Ok(());
    };
    for (i, block) in prompt.iter().enumerate() {
        let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
        let Some(capability) = needs(kind) else {
            continue;
        };
        if capabilities.get(capability).and_then(Value::as_bool) != Some(true) {
            return Err(Error::Unprocessable(format!(
                "prompt[{i}] is a {kind:?} block, which this session's agent ({agent:?}) \
                 does not accept (its promptCapabilities.{capability} is not true)"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_the_agent_does_not_accept_is_refused_by_its_index_and_kind() {
        let text = json!({"type": "text", "text": "hi"});
        let link = json!({"type": "resource_link", "uri": "file:///a", "name": "a"});
        let image = json!({"type": "image", "mimeType": "image/png", "data": "AA=="});
        let resource = json!({"type": "resource", "resource": {"uri": "file:///a", "text": "x"}});
        let none = json!({"image": false, "audio": false, "embeddedContext": false});
        check(&[text.clone(), link.clone()], Some(&none), "demo").unwrap();
        let refused = check(&[text.clone(), image.clone()], Some(&none), "demo").unwrap_err();
        let problem = refused.problem();
        assert_eq!(problem.status, 422);
        assert!(problem.detail.contains("prompt[1]"), "{}", problem.detail);
        assert!(problem.detail.contains("promptCapabilities.image"));
        let err = check(std::slice::from_ref(&resource), Some(&none), "demo").unwrap_err();
        assert!(err.problem().detail.contains("embeddedContext"));
        let images = json!({"image": true});
        check(std::slice::from_ref(&image), Some(&images), "demo").unwrap();
        assert!(check(std::slice::from_ref(&resource), Some(&images), "demo").is_err());
        // Not known yet: the gateway takes it, as its REST prompts do.
        check(&[image, resource], None, "demo").unwrap();
        check(&[text], Some(&gateway_accepts()), "demo").unwrap();
    }
}
