//! An agent's question (ACP elicitation, form mode), pure: whether the
//! schema it asks with is of the restricted subset ACP allows (a flat
//! object of string, number, integer, boolean and multi-select fields,
//! strings with an enum, a titled `oneOf` or a format), whether a person's
//! content matches it (naming every field that does not), and the one-tap
//! answers a notification can offer.

use serde_json::{json, Map, Value};

/// Why a requested schema is not one this gateway can put to a person, if
/// it is not: the agent's request is refused with this.
pub fn check_schema(schema: &Value) -> Result<(), String> {
    let Some(schema) = schema.as_object() else {
        return Err("requestedSchema must be an object".into());
    };
    if let Some(kind) = schema.get("type").filter(|t| !t.is_null()) {
        if kind != "object" {
            return Err("requestedSchema.type must be \"object\"".into());
        }
    }
    let properties = match schema.get("properties") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Object(p)) => p,
        Some(_) => return Err("requestedSchema.properties must be an object".into()),
    };
    for (name, property) in properties {
        let Some(kind) = property.get("type").and_then(Value::as_str) else {
            return Err(format!(
                "requestedSchema.properties.{name} has no string type"
            ));
        };
        if !matches!(kind, "string" | "number" | "integer" | "boolean" | "array") {
            return Err(format!(
                "requestedSchema.properties.{name} is of type {kind:?}, which a form cannot ask for"
            ));
        }
        if kind == "array" && choices(property.get("items").unwrap_or(&Value::Null)).is_none() {
            return Err(format!(
                "requestedSchema.properties.{name} is a multi-select without items.enum or items.anyOf"
            ));
        }
    }
    if let Some(required) = schema.get("required").filter(|r| !r.is_null()) {
        let names = required
            .as_array()
            .filter(|r| r.iter().all(Value::is_string));
        let Some(names) = names else {
            return Err("requestedSchema.required must be a list of names".into());
        };
        if let Some(unknown) = names
            .iter()
            .filter_map(Value::as_str)
            .find(|n| !properties.contains_key(*n))
        {
            return Err(format!(
                "requestedSchema.required names {unknown:?}, which is not a property"
            ));
        }
    }
    Ok(())
}

/// Whether `content` answers `schema` (checked by [`check_schema`]): every
/// required field there, no field the schema does not ask for, each of its
/// type and within its bounds. Every field that does not, with why.
pub fn check_content(schema: &Value, content: &Value) -> Result<(), Vec<String>> {
    let Some(content) = content.as_object() else {
        return Err(vec!["content must be an object".into()]);
    };
    let empty = Map::new();
    let properties = schema
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let mut wrong = Vec::new();
    for name in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if content.get(name).is_none_or(Value::is_null) {
            wrong.push(format!("content.{name} is required"));
        }
    }
    for (name, value) in content {
        match properties.get(name) {
            None => wrong.push(format!("content.{name} is not a field of the question")),
            Some(_) if value.is_null() => {}
            Some(property) => {
                if let Err(why) = check_value(property, value) {
                    wrong.push(format!("content.{name} {why}"));
                }
            }
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong)
    }
}

fn check_value(property: &Value, value: &Value) -> Result<(), String> {
    let bound = |key: &str| property.get(key).and_then(Value::as_f64);
    match property.get("type").and_then(Value::as_str) {
        Some("string") => {
            let Some(text) = value.as_str() else {
                return Err("must be a string".into());
            };
            if let Some(allowed) = choices(property) {
                if !allowed.iter().any(|(value, _)| value == text) {
                    return Err(format!(
                        "must be one of {}",
                        allowed
                            .iter()
                            .map(|(v, _)| format!("{v:?}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
            }
            let length = text.chars().count() as f64;
            if bound("minLength").is_some_and(|min| length < min) {
                return Err(format!(
                    "must be at least {} characters",
                    bound("minLength").unwrap_or(0.0)
                ));
            }
            if bound("maxLength").is_some_and(|max| length > max) {
                return Err(format!(
                    "must be at most {} characters",
                    bound("maxLength").unwrap_or(0.0)
                ));
            }
            if let Some(pattern) = property.get("pattern").and_then(Value::as_str) {
                // A pattern this gateway cannot read checks nothing.
                if let Ok(re) = regex::Regex::new(pattern) {
                    if !re.is_match(text) {
                        return Err(format!("must match the pattern {pattern}"));
                    }
                }
            }
            match property.get("format").and_then(Value::as_str) {
                Some("email") if !is_email(text) => Err("must be an email address".into()),
                Some("uri") if url::Url::parse(text).is_err() => Err("must be a URI".into()),
                Some("date") if chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d").is_err() => {
                    Err("must be a date (YYYY-MM-DD)".into())
                }
                Some("date-time") if chrono::DateTime::parse_from_rfc3339(text).is_err() => {
                    Err("must be a date and time (RFC 3339)".into())
                }
                _ => Ok(()),
            }
        }
        Some(kind @ ("number" | "integer")) => {
            let Some(number) = value.as_f64() else {
                return Err(format!(
                    "must be a{} {kind}",
                    if kind == "integer" { "n" } else { "" }
                ));
            };
            if kind == "integer" && number.fract() != 0.0 {
                return Err("must be an integer".into());
            }
            if let Some(min) = bound("minimum").filter(|min| number < *min) {
                return Err(format!("must be at least {min}"));
            }
            if let Some(max) = bound("maximum").filter(|max| number > *max) {
                return Err(format!("must be at most {max}"));
            }
            Ok(())
        }
        Some("boolean") => value
            .is_boolean()
            .then_some(())
            .ok_or_else(|| "must be true or false".into()),
        Some("array") => {
            let Some(items) = value.as_array() else {
                return Err("must be a list".into());
            };
            let allowed =
                choices(property.get("items").unwrap_or(&Value::Null)).unwrap_or_default();
            if let Some(bad) = items.iter().find(|i| {
                !i.as_str()
                    .is_some_and(|i| allowed.iter().any(|(v, _)| v == i))
            }) {
                return Err(format!("has {bad}, which is not one of the choices"));
            }
            let count = items.len() as f64;
            if let Some(min) = bound("minItems").filter(|min| count < *min) {
                return Err(format!("must have at least {min} choices"));
            }
            if let Some(max) = bound("maxItems").filter(|max| count > *max) {
                return Err(format!("must have at most {max} choices"));
            }
            Ok(())
        }
        // A type of a later ACP: any of the values a form answers with.
        _ => match value {
            Value::String(_) | Value::Number(_) | Value::Bool(_) => Ok(()),
            Value::Array(items) if items.iter().all(Value::is_string) => Ok(()),
            _ => Err("must be a string, number, boolean or list of strings".into()),
        },
    }
}

/// The values a string field (or a multi-select's items) may take, with
/// their titles: its `enum`, or its `oneOf`/`anyOf` of `{const, title}`.
fn choices(schema: &Value) -> Option<Vec<(String, String)>> {
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        return Some(
            values
                .iter()
                .filter_map(Value::as_str)
                .map(|v| (v.to_owned(), v.to_owned()))
                .collect(),
        );
    }
    let titled = schema
        .get("oneOf")
        .or_else(|| schema.get("anyOf"))
        .and_then(Value::as_array)?;
    Some(
        titled
            .iter()
            .filter_map(|o| {
                let value = o.get("const")?.as_str()?;
                let title = o.get("title").and_then(Value::as_str).unwrap_or(value);
                Some((value.to_owned(), title.to_owned()))
            })
            .collect(),
    )
}

/// An address with one `@`, something before it and a dotted domain after.
fn is_email(text: &str) -> bool {
    let mut parts = text.split('@');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(local), Some(domain), None) => {
            !local.is_empty()
                && !text.chars().any(char::is_whitespace)
                && domain.split('.').count() >= 2
                && domain.split('.').all(|label| !label.is_empty())
        }
        _ => false,
    }
}

/// The answers a notification can offer as single taps: where the form is
/// one field, an enum (each choice) or a boolean (yes and no). Each is a
/// label and the content it accepts with.
pub fn one_tap(schema: &Value) -> Option<Vec<(String, Value)>> {
    let properties = schema.get("properties")?.as_object()?;
    if properties.len() != 1 {
        return None;
    }
    let (name, property) = properties.iter().next()?;
    match property.get("type").and_then(Value::as_str)? {
        "boolean" => Some(vec![
            ("Yes".into(), json!({ name: true })),
            ("No".into(), json!({ name: false })),
        ]),
        "string" => {
            let choices = choices(property)?;
            (!choices.is_empty() && choices.len() <= 3).then(|| {
                choices
                    .into_iter()
                    .map(|(value, title)| (title, json!({ name: value })))
                    .collect()
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 2, "maxLength": 5},
                "email": {"type": "string", "format": "email"},
                "when": {"type": "string", "format": "date"},
                "site": {"type": "string", "format": "uri"},
                "at": {"type": "string", "format": "date-time"},
                "colour": {"type": "string", "enum": ["red", "green"]},
                "size": {"type": "string", "oneOf": [{"const": "s", "title": "Small"}]},
                "count": {"type": "integer", "minimum": 1, "maximum": 3},
                "ratio": {"type": "number", "maximum": 1.5},
                "sure": {"type": "boolean"},
                "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 1}
            },
            "required": ["name", "sure"]
        })
    }

    #[test]
    fn the_restricted_subset_is_accepted_and_anything_else_refused() {
        assert_eq!(check_schema(&schema()), Ok(()));
        assert_eq!(check_schema(&json!({})), Ok(()));
        for bad in [
            json!("object"),
            json!({"type": "array"}),
            json!({"properties": {"a": {"type": "object"}}}),
            json!({"properties": {"a": {}}}),
            json!({"properties": {"a": {"type": "array", "items": {"type": "string"}}}}),
            json!({"properties": {"a": {"type": "string"}}, "required": ["b"]}),
            json!({"properties": {"a": {"type": "string"}}, "required": "a"}),
        ] {
            assert!(check_schema(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn content_that_matches_passes() {
        let content = json!({
            "name": "Ann", "email": "ann@example.org", "when": "2026-12-02",
            "site": "https://example.org/x", "at": "2026-12-02T10:00:00Z", "colour": "red",
            "size": "s", "count": 2, "ratio": 1.0, "sure": false, "tags": ["a"]
        });
        assert_eq!(check_content(&schema(), &content), Ok(()));
        assert_eq!(
            check_content(&schema(), &json!({"name": "Bo", "sure": true})),
            Ok(())
        );
        // A whole number written as a float is an integer.
        assert_eq!(
            check_content(
                &schema(),
                &json!({"name": "Bo", "sure": true, "count": 2.0})
            ),
            Ok(())
        );
    }

    #[test]
    fn every_field_that_does_not_match_is_named() {
        let content = json!({
            "name": "A", "email": "not-an-address", "when": "02/12/2026", "site": "nope",
            "at": "yesterday", "colour": "blue", "size": "m", "count": 1.5, "ratio": 2,
            "tags": ["a", "b"], "extra": 1
        });
        let wrong = check_content(&schema(), &content).unwrap_err();
        for field in [
            "content.sure is required",
            "content.name must be at least 2",
            "content.email must be an email",
            "content.when must be a date",
            "content.site must be a URI",
            "content.at must be a date and time",
            "content.colour must be one of \"red\", \"green\"",
            "content.size must be one of",
            "content.count must be an integer",
            "content.ratio must be at most 1.5",
            "content.tags must have at most 1",
            "content.extra is not a field",
        ] {
            assert!(
                wrong.iter().any(|w| w.starts_with(field)),
                "{field} not in {wrong:?}"
            );
        }
        assert_eq!(
            check_content(&schema(), &json!([1])).unwrap_err(),
            ["content must be an object"]
        );
        let typed =
            check_content(&schema(), &json!({"name": 5, "sure": "yes", "tags": "a"})).unwrap_err();
        assert_eq!(typed.len(), 3, "{typed:?}");
    }

    #[test]
    fn one_field_of_choices_or_yes_no_makes_one_tap_answers() {
        let yes_no = json!({"properties": {"go": {"type": "boolean"}}});
        assert_eq!(
            one_tap(&yes_no).unwrap(),
            [
                ("Yes".to_owned(), json!({"go": true})),
                ("No".to_owned(), json!({"go": false}))
            ]
        );
        let pick = json!({"properties": {"env": {"type": "string", "oneOf": [
            {"const": "dev", "title": "Development"}, {"const": "prod", "title": "Production"}]}}});
        assert_eq!(
            one_tap(&pick).unwrap()[1],
            ("Production".to_owned(), json!({"env": "prod"}))
        );
        assert!(one_tap(&schema()).is_none());
        assert!(one_tap(&json!({"properties": {"n": {"type": "string"}}})).is_none());
    }
}
