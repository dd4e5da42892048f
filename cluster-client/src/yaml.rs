//! YAML documents as JSON values, for kubeconfig files. kube's own reader brings a serde YAML
//! deserializer whose code (some 400 KB, monomorphised for every kubeconfig type) stays mapped
//! for the life of the process; this keeps only the parser and lets serde_json do the typing.
//!
//! Scalars: plain `true`/`false` are booleans, plain `null`, `~` and empty are null, every other
//! scalar is a string (a kubeconfig has no numeric field, and a cluster named `1234` stays a
//! name). Anchors and aliases are refused: kubeconfigs do not use them, and refusing them rules
//! out alias bombs.
use granit_parser::{Event, Parser, ScalarStyle};
use serde_json::{Map, Value};

#[derive(Debug, thiserror::Error)]
pub enum YamlError {
    #[error("not valid YAML: {0}")]
    Syntax(#[from] granit_parser::ScanError),
    #[error("line {line}: {what} are not supported in a kubeconfig")]
    Unsupported { line: usize, what: &'static str },
    #[error("line {line}: a mapping key must be a scalar")]
    ComplexKey { line: usize },
}

/// A collection being read, with the key of a mapping entry whose value comes next.
enum Open {
    Sequence(Vec<Value>),
    Mapping(Map<String, Value>, Option<String>),
}

/// Every document of `text`, in order (an empty document is `Value::Null`).
pub fn documents(text: &str) -> Result<Vec<Value>, YamlError> {
    let mut documents = Vec::new();
    let mut open: Vec<Open> = Vec::new();
    for event in Parser::new_from_str(text) {
        let (event, span) = event?;
        let line = span.start.line();
        let finished = match event {
            Event::Scalar(text, style, anchor, _) => {
                if anchor != 0 {
                    return Err(YamlError::Unsupported { line, what: "anchors" });
                }
                // A key is taken as written, whatever it looks like.
                if let Some(Open::Mapping(_, key @ None)) = open.last_mut() {
                    *key = Some(text.into_owned());
                    continue;
                }
                scalar(text.into_owned(), style)
            }
            Event::SequenceStart(_, anchor, _) | Event::MappingStart(_, anchor, _) if anchor != 0 => {
                return Err(YamlError::Unsupported { line, what: "anchors" });
            }
            Event::SequenceStart(..) | Event::MappingStart(..) => {
                if let Some(Open::Mapping(_, None)) = open.last() {
                    return Err(YamlError::ComplexKey { line });
                }
                open.push(match event {
                    Event::SequenceStart(..) => Open::Sequence(Vec::new()),
                    _ => Open::Mapping(Map::new(), None),
                });
                continue;
            }
            Event::SequenceEnd | Event::MappingEnd => match open.pop() {
                Some(Open::Sequence(items)) => Value::Array(items),
                Some(Open::Mapping(entries, _)) => Value::Object(entries),
                None => continue,
            },
            Event::Alias(_) | Event::UnresolvedAlias(_) => {
                return Err(YamlError::Unsupported { line, what: "aliases" });
            }
            _ => continue,
        };
        match open.last_mut() {
            Some(Open::Sequence(items)) => items.push(finished),
            Some(Open::Mapping(entries, key)) => {
                // A duplicate key: the last one wins, as in client-go.
                let key = key.take().unwrap_or_default();
                entries.insert(key, finished);
            }
            None => documents.push(finished),
        }
    }
    Ok(documents)
}

fn scalar(text: String, style: ScalarStyle) -> Value {
    if style != ScalarStyle::Plain {
        return Value::String(text);
    }
    match text.as_str() {
        "true" | "True" | "TRUE" => Value::Bool(true),
        "false" | "False" | "FALSE" => Value::Bool(false),
        "" | "~" | "null" | "Null" | "NULL" => Value::Null,
        _ => Value::String(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_kubeconfig_as_kubectl_writes_it() {
        let text = "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: LS0t\n    server: https://127.0.0.1:6443\n    insecure-skip-tls-verify: true\n  name: kind\ncontexts: []\npreferences: {}\nusers:\n- name: admin # a comment\n  user:\n    token: 'abc: def'\n    exec:\n      args: [\"--a\", b]\n      env: null\n";
        let docs = documents(text).unwrap();
        assert_eq!(
            docs,
            vec![json!({
                "apiVersion": "v1",
                "clusters": [{"cluster": {"certificate-authority-data": "LS0t", "server": "https://127.0.0.1:6443",
                                          "insecure-skip-tls-verify": true}, "name": "kind"}],
                "contexts": [], "preferences": {},
                "users": [{"name": "admin", "user": {"token": "abc: def", "exec": {"args": ["--a", "b"], "env": null}}}],
            })]
        );
    }

    #[test]
    fn numbers_stay_strings_and_quoted_booleans_stay_strings() {
        let docs = documents("name: 1234\nother: \"true\"\nblock: |\n  line one\n  line two\n").unwrap();
        assert_eq!(docs, vec![json!({"name": "1234", "other": "true", "block": "line one\nline two\n"})]);
    }

    #[test]
    fn several_documents_and_json() {
        let docs = documents("---\na: b\n---\n{\"c\": [\"d\"]}\n").unwrap();
        assert_eq!(docs, vec![json!({"a": "b"}), json!({"c": ["d"]})]);
        assert_eq!(documents("").unwrap(), Vec::<Value>::new());
    }

    #[test]
    fn anchors_aliases_complex_keys_and_bad_syntax_are_errors() {
        let alias = documents("a: &x b\nc: *x\n").unwrap_err().to_string();
        assert!(alias.contains("anchors are not supported"), "{alias}");
        let key = documents("? [a]\n: b\n").unwrap_err().to_string();
        assert!(key.contains("mapping key must be a scalar"), "{key}");
        let syntax = documents("a: [b\n").unwrap_err().to_string();
        assert!(syntax.starts_with("not valid YAML"), "{syntax}");
    }
}
