//! The shared protocol vectors (docs/protocol-vectors/), read and written by this crate.
//!
//! The Python implementation replays the same files (tests/wire/test_protocol_vectors.py). Here, for
//! every step: the header a peer sends reads as its `message` (or is refused as a whole when that
//! is null), and `message` written again gives the same bytes (or, when not `canonical`, bytes
//! that read the same); every reply whose bytes the vector fixes (`hex`) reads with this crate's
//! reader, matches its pattern, and is written back byte for byte.

use std::collections::HashMap;
use std::path::PathBuf;

use cronoq::wire::{self, Direction, Kind, Message};
use cronoq::Value;
use serde_json::Value as Json;

/// What a `{name}` placeholder stands for in these tests: any 32-character string does.
const CAPTURED: &str = "0123456789abcdef0123456789abcdef";

fn vectors_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/protocol-vectors")
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex")).collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Replace every `{name}` in a hex frame by the msgpack of CAPTURED.
fn fill_hex(text: &str) -> String {
    let placeholder = format!("d920{}", hex(CAPTURED.as_bytes()));
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let end = rest[start..].find('}').expect("closed placeholder") + start;
        out.push_str(&placeholder);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

fn fill_json(value: &Json) -> Json {
    match value {
        Json::String(s) if s.starts_with('{') && s.ends_with('}') => Json::String(CAPTURED.into()),
        Json::Array(a) => Json::Array(a.iter().map(fill_json).collect()),
        Json::Object(o) => Json::Object(o.iter().map(|(k, v)| (k.clone(), fill_json(v))).collect()),
        other => other.clone(),
    }
}

fn to_json(value: &Value) -> Json {
    match value {
        Value::Nil => Json::Null,
        Value::Boolean(b) => Json::Bool(*b),
        Value::Integer(i) => i.as_i64().map(Json::from).unwrap_or_else(|| Json::from(i.as_u64().unwrap())),
        Value::F64(x) => Json::from(*x),
        Value::F32(x) => Json::from(*x as f64),
        Value::String(s) => Json::String(s.as_str().expect("utf-8").to_string()),
        Value::Binary(b) => Json::String(hex(b)),
        Value::Array(a) => Json::Array(a.iter().map(to_json).collect()),
        Value::Map(m) => {
            Json::Object(m.iter().map(|(k, v)| (k.as_str().expect("str key").to_string(), to_json(v))).collect())
        }
        Value::Ext(..) => panic!("no ext in vectors"),
    }
}

fn header_json(h: &wire::Header) -> Json {
    let mut o = serde_json::Map::new();
    o.insert("tag".into(), Json::from(h.tag));
    o.insert("v".into(), Json::from(1));
    for (name, value) in &h.fields {
        o.insert((*name).into(), to_json(value));
    }
    Json::Object(o)
}

fn message_json(m: &Message) -> Json {
    match m {
        Message::Single(h) => header_json(h),
        Message::Batch(items) => {
            let items: Vec<Json> = items
                .iter()
                .map(|(h, b)| {
                    Json::Array(vec![header_json(h), b.as_ref().map_or(Json::Null, |b| Json::String(hex(b)))])
                })
                .collect();
            serde_json::json!({"tag": "batch", "v": 1, "items": items})
        }
    }
}

/// A JSON value as the msgpack value a field of `kind` holds.
fn from_json(value: &Json, kind: Kind) -> Value {
    match (value, kind) {
        (Json::Null, _) => Value::Nil,
        (Json::Number(n), Kind::Float | Kind::OptFloat) => Value::F64(n.as_f64().unwrap()),
        (Json::Number(n), _) if n.is_f64() => Value::F64(n.as_f64().unwrap()),
        (Json::Number(n), _) => n.as_i64().map(Value::from).unwrap_or_else(|| Value::from(n.as_u64().unwrap())),
        (Json::Bool(b), _) => Value::Boolean(*b),
        (Json::String(s), _) => Value::from(s.as_str()),
        (Json::Array(a), _) => Value::Array(a.iter().map(|v| from_json(v, Kind::Any)).collect()),
        (Json::Object(o), _) => {
            Value::Map(o.iter().map(|(k, v)| (Value::from(k.as_str()), from_json(v, Kind::Any))).collect())
        }
    }
}

/// Write a `message` (as the vectors spell it) with this crate's writer.
fn encode_message(direction: Direction, message: &Json) -> Vec<u8> {
    let header_of = |m: &Json| -> Vec<u8> {
        let tag = m["tag"].as_str().unwrap();
        let schema = direction.schema(tag).unwrap_or_else(|| panic!("no schema for {tag}"));
        let fields = schema.fields.iter().map(|f| from_json(&m[f.name], f.kind)).collect();
        wire::encode_header(tag, fields)
    };
    if message["tag"] == "batch" {
        let items: Vec<(Vec<u8>, Option<Vec<u8>>)> = message["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|item| (header_of(&item[0]), item[1].as_str().map(unhex)))
            .collect();
        wire::encode_batch(&items)
    } else {
        header_of(message)
    }
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Nil => "nil",
        Value::Boolean(_) => "bool",
        Value::Integer(_) => "int",
        Value::F32(_) | Value::F64(_) => "float",
        Value::String(_) => "string",
        Value::Binary(_) => "bin",
        Value::Array(_) => "array",
        Value::Map(_) => "map",
        Value::Ext(..) => "ext",
    }
}

/// Whether `value` matches `pattern` (docs/protocol-vectors/README.md, "Matching replies").
fn matches(pattern: &Json, value: &Value, captured: &mut HashMap<String, Value>) -> bool {
    match pattern {
        Json::Null => value.is_nil(),
        Json::Bool(b) => value.as_bool() == Some(*b),
        Json::String(s) => value.as_str() == Some(s.as_str()),
        Json::Number(n) if n.is_f64() => matches!(value, Value::F64(x) if *x == n.as_f64().unwrap()),
        Json::Number(n) => matches!(value, Value::Integer(i) if i.as_i64() == n.as_i64()),
        Json::Array(items) => match value {
            Value::Array(values) => {
                items.len() == values.len() && items.iter().zip(values).all(|(p, v)| matches(p, v, captured))
            }
            _ => false,
        },
        Json::Object(m) => {
            if let Some(kind) = m.get("type").and_then(Json::as_str) {
                if kind != "any" && kind != kind_of(value) {
                    return false;
                }
            }
            if let Some(re) = m.get("match").and_then(Json::as_str) {
                let Some(s) = value.as_str() else { return false };
                if !regex::Regex::new(re).unwrap().is_match(s) {
                    return false;
                }
            }
            if let Some(text) = m.get("contains").and_then(Json::as_str) {
                if !value.as_str().is_some_and(|s| s.contains(text)) {
                    return false;
                }
            }
            if let Some(min) = m.get("min").and_then(Json::as_f64) {
                if !value.as_f64().is_some_and(|x| x >= min) {
                    return false;
                }
            }
            if let Some(Json::Object(has)) = m.get("has") {
                let Value::Map(entries) = value else { return false };
                for (key, p) in has {
                    match entries.iter().find(|(k, _)| k.as_str() == Some(key.as_str())) {
                        Some((_, v)) if matches(p, v, captured) => {}
                        _ => return false,
                    }
                }
            }
            if let Some(name) = m.get("same").and_then(Json::as_str) {
                if captured.get(name) != Some(value) {
                    return false;
                }
            }
            if let Some(name) = m.get("capture").and_then(Json::as_str) {
                captured.insert(name.to_string(), value.clone());
            }
            true
        }
    }
}

/// JSON equality where numbers compare by value: a float field read from an integer (`60`) is the
/// same number as the float this reader makes of it (`60.0`).
fn same(a: &Json, b: &Json) -> bool {
    match (a, b) {
        (Json::Number(x), Json::Number(y)) => x.as_f64() == y.as_f64(),
        (Json::Array(x), Json::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q)),
        (Json::Object(x), Json::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

fn direction_of(endpoint: &str, sending: bool) -> Direction {
    match (endpoint, sending) {
        ("clients", true) => Direction::ClientRequest,
        ("clients", false) => Direction::ClientReply,
        ("workers", true) => Direction::WorkerMessage,
        ("workers", false) => Direction::WorkerCommand,
        other => panic!("unknown endpoint {other:?}"),
    }
}

#[test]
fn every_vector_reads_and_writes_alike() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(vectors_dir())
        .expect("docs/protocol-vectors exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 30, "expected the shared vectors, found {}", files.len());
    let (mut headers, mut refusals, mut replies) = (0, 0, 0);
    let mut failures = Vec::new();
    for file in &files {
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        let vector: Json = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        let mut captured = HashMap::new();
        for (n, step) in vector["steps"].as_array().unwrap().iter().enumerate() {
            let at = format!("{name} step {n}");
            let peer = step["peer"].as_str().unwrap();
            let endpoint = vector["peers"][peer].as_str().unwrap();
            let send = step["send"].as_array().unwrap();
            let direction = direction_of(endpoint, true);
            if send.len() >= 2 {
                let bytes = unhex(&fill_hex(send[1].as_str().unwrap()));
                let read = wire::decode_strict(direction, &bytes);
                match (&step["message"], read) {
                    (Json::Null, Err(_)) => refusals += 1,
                    (Json::Null, Ok(m)) => failures.push(format!("{at}: a strict reader must refuse it, read {m:?}")),
                    (expected, Err(e)) => failures.push(format!("{at}: refused {e}, expected {expected}")),
                    (expected, Ok(m)) => {
                        headers += 1;
                        let expected = fill_json(expected);
                        if !same(&message_json(&m), &expected) {
                            failures.push(format!("{at}: read {}, expected {expected}", message_json(&m)));
                        }
                        let written = encode_message(direction, &expected);
                        if step.get("canonical") != Some(&Json::Bool(false)) {
                            if written != bytes {
                                failures.push(format!("{at}: wrote {}, expected {}", hex(&written), hex(&bytes)));
                            }
                        } else {
                            let again = wire::decode_strict(direction, &written).map(|m| message_json(&m));
                            if !again.as_ref().is_ok_and(|a| same(a, &expected)) {
                                failures.push(format!("{at}: what we wrote reads as {again:?}"));
                            }
                        }
                    }
                }
            }
            for (expect_peer, list) in step["expect"].as_object().unwrap() {
                let reply_direction = direction_of(vector["peers"][expect_peer.as_str()].as_str().unwrap(), false);
                for reply in list.as_array().unwrap() {
                    let Some(reply_hex) = reply.get("hex").and_then(Json::as_str) else {
                        continue;
                    };
                    replies += 1;
                    let bytes = unhex(reply_hex);
                    let raw = wire::decode_value(&bytes).unwrap();
                    if !matches(&reply["header"], &raw, &mut captured) {
                        failures.push(format!("{at}: reply {reply_hex} does not match {}", reply["header"]));
                    }
                    match wire::decode_strict(reply_direction, &bytes) {
                        Ok(Message::Single(h)) => {
                            if h.encode() != bytes {
                                failures.push(format!("{at}: reply {reply_hex} written back as {}", hex(&h.encode())));
                            }
                        }
                        other => failures.push(format!("{at}: reply {reply_hex} read as {other:?}")),
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    assert!(
        headers > 40 && refusals > 10 && replies > 20,
        "too little checked: {headers} headers, {refusals} refusals, {replies} replies"
    );
    println!("{} vectors: {headers} headers read and written, {refusals} refused, {replies} replies", files.len());
}

#[test]
fn a_reply_leaving_out_trailing_defaults_reads() {
    let short = wire::encode_header("accepted", vec![Value::from(7), Value::from(CAPTURED)]);
    let items = wire::read(Direction::ClientReply, &short, None).unwrap();
    let (h, _) = items[0].as_ref().unwrap();
    assert_eq!((h.rid(), h.str("id"), h.bool("duplicate")), (7, CAPTURED, false));
    let long = wire::encode_header("ok", vec![Value::from(3), Value::from(1), Value::from("extra")]);
    let items = wire::read(Direction::ClientReply, &long, None).unwrap();
    assert_eq!(items[0].as_ref().unwrap().0.get("value"), &Value::from(1));
}

#[test]
fn an_unreadable_batch_item_costs_only_itself() {
    let good = wire::encode_header("ok", vec![Value::from(1), Value::Nil]);
    let bad = wire::encode_header("ok", vec![Value::from("one")]);
    let batch = wire::encode_batch(&[(good.clone(), None), (bad, None), (good, None)]);
    let items = wire::read(Direction::ClientReply, &batch, None).unwrap();
    assert!(items[0].is_ok() && items[1].is_err() && items[2].is_ok());
}

/// A value that matches `pattern` (the vectors' "Matching replies" forms this test meets).
fn example_of(pattern: &Json) -> Value {
    match pattern {
        Json::Object(m) if m.contains_key("same") => Value::from(CAPTURED),
        Json::Object(m) if m.contains_key("has") => Value::Map(
            m["has"].as_object().unwrap().iter().map(|(k, p)| (Value::from(k.as_str()), example_of(p))).collect(),
        ),
        Json::Object(m) => match m.get("type").and_then(Json::as_str) {
            Some("float") => Value::F64(m.get("min").and_then(Json::as_f64).unwrap_or(0.5)),
            Some("int") => Value::from(m.get("min").and_then(Json::as_i64).unwrap_or(0)),
            Some("string") => Value::from(m.get("contains").and_then(Json::as_str).unwrap_or("text")),
            other => panic!("no example for {other:?}"),
        },
        Json::Array(items) => Value::Array(items.iter().map(example_of).collect()),
        literal => from_json(literal, Kind::Any),
    }
}

/// `base` with the entries of `over` put in (recursively, for maps in both).
fn overlay(base: Value, over: &Value) -> Value {
    match (base, over) {
        (Value::Map(mut entries), Value::Map(news)) => {
            for (k, v) in news {
                match entries.iter_mut().find(|(key, _)| key == k) {
                    Some((_, old)) => *old = overlay(std::mem::replace(old, Value::Nil), v),
                    None => entries.push((k.clone(), v.clone())),
                }
            }
            Value::Map(entries)
        }
        (_, over) => over.clone(),
    }
}

fn map_of(entries: Vec<(&str, Value)>) -> Value {
    Value::Map(entries.into_iter().map(|(k, v)| (Value::from(k), v)).collect())
}

fn opt_f(x: Option<f64>) -> Value {
    x.map_or(Value::Nil, Value::F64)
}

fn opt_s(s: &Option<String>) -> Value {
    s.as_deref().map_or(Value::Nil, Value::from)
}

fn opt_u(n: Option<u64>) -> Value {
    n.map_or(Value::Nil, Value::from)
}

/// A typed explanation written back under the keys docs/protocol.md gives them.
fn explanation_value(e: &cronoq::Explanation) -> Value {
    let waiting = e.waiting.as_ref().map_or(Value::Nil, |w| {
        let nodes = w
            .nodes
            .iter()
            .map(|n| {
                let ceiling = n.ceiling.as_ref().map_or(Value::Nil, |c| {
                    map_of(vec![
                        ("limit", c.limit.into()),
                        ("running", c.running.into()),
                        ("capped", c.capped.into()),
                        ("capped_since", opt_f(c.capped_since)),
                        ("capped_for", opt_f(c.capped_for)),
                    ])
                });
                map_of(vec![
                    ("name", n.name.as_str().into()),
                    ("own_tasks", n.own_tasks.into()),
                    ("weight", Value::F64(n.weight)),
                    ("backlogged", n.backlogged.into()),
                    ("share", Value::F64(n.share)),
                    ("lag", Value::F64(n.lag)),
                    ("ceiling", ceiling),
                ])
            })
            .collect();
        map_of(vec![
            ("fair", w.fair.into()),
            ("higher_classes_ahead", w.higher_classes_ahead.into()),
            ("deadline_ahead", w.deadline_ahead.into()),
            ("deadline_ahead_exact", w.deadline_ahead_exact.into()),
            ("queue_ahead", opt_u(w.queue_ahead)),
            ("queue_ahead_exact", w.queue_ahead_exact.into()),
            ("queue_length", w.queue_length.into()),
            ("nodes", Value::Array(nodes)),
            ("tenant_share", opt_f(w.tenant_share)),
            ("paused", w.paused.into()),
            ("workers", w.workers.into()),
            ("ready_workers", w.ready_workers.into()),
            ("running", w.running.into()),
            ("max_in_flight", opt_u(w.max_in_flight)),
            ("delayed_for", opt_f(w.delayed_for)),
            ("retry", w.retry.into()),
            ("dispatch_rate", opt_f(w.dispatch_rate)),
            ("estimate", opt_f(w.estimate)),
            ("estimate_note", w.estimate_note.as_str().into()),
        ])
    });
    let history = e
        .history
        .iter()
        .map(|a| {
            map_of(vec![
                ("attempt", a.attempt.into()),
                ("ended", a.ended.as_str().into()),
                ("at", opt_f(a.at)),
                ("error", opt_s(&a.error)),
            ])
        })
        .collect();
    map_of(vec![
        ("id", e.id.as_str().into()),
        ("pool", e.pool.as_str().into()),
        ("tenant", opt_s(&e.tenant)),
        ("priority", e.priority.as_str().into()),
        ("state", e.state.as_str().into()),
        ("attempts", e.attempts.into()),
        ("max_retries", e.max_retries.into()),
        ("submitted_at", Value::F64(e.submitted_at)),
        ("started_at", opt_f(e.started_at)),
        ("finished_at", opt_f(e.finished_at)),
        ("deadline", opt_f(e.deadline)),
        ("not_before", opt_f(e.not_before)),
        ("error", opt_s(&e.error)),
        ("history", Value::Array(history)),
        ("waiting", waiting),
    ])
}

#[test]
fn the_explain_vector_reads_into_a_typed_explanation() {
    // Every key the vector shows of the broker's explain map is read into the typed field of that
    // name, of that type: the map the vector describes (the keys it leaves open filled in), read and
    // written back under the documented names, still matches the vector.
    let vector: Json =
        serde_json::from_str(&std::fs::read_to_string(vectors_dir().join("explain.json")).unwrap()).unwrap();
    let patterns: Vec<&Json> = vector["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["message"]["tag"] == "explain")
        .flat_map(|s| s["expect"]["client"].as_array().unwrap())
        .map(|reply| &reply["header"])
        .filter(|h| h[0] == "ok")
        .map(|h| &h[3])
        .collect();
    assert!(!patterns.is_empty(), "explain.json has an ok answering explain");
    let rest = map_of(vec![
        ("id", "someone else's".into()),
        ("pool", "p".into()),
        ("tenant", Value::Nil),
        ("priority", "low".into()),
        ("state", "queued".into()),
        ("attempts", 9.into()),
        ("max_retries", 0.into()),
        ("submitted_at", Value::F64(1.0)),
        (
            "waiting",
            map_of(vec![
                ("fair", true.into()),
                ("higher_classes_ahead", 5.into()),
                ("deadline_ahead", 0.into()),
                ("deadline_ahead_exact", true.into()),
                ("queue_ahead", 1.into()),
                ("queue_ahead_exact", true.into()),
                ("queue_length", 2.into()),
                ("nodes", Value::Array(vec![])),
                ("tenant_share", Value::Nil),
                ("paused", true.into()),
                ("workers", 3.into()),
                ("ready_workers", 0.into()),
                ("running", 0.into()),
                ("max_in_flight", Value::Nil),
                ("delayed_for", Value::Nil),
                ("retry", true.into()),
                ("dispatch_rate", Value::Nil),
                ("estimate", Value::F64(2.0)),
                ("estimate_note", "".into()),
            ]),
        ),
    ]);
    for pattern in patterns {
        let value = overlay(rest.clone(), &example_of(pattern));
        let explanation = cronoq::Explanation::from_value(&value).unwrap_or_else(|e| panic!("{e}: {value}"));
        let mut captured = HashMap::from([("task".to_string(), Value::from(CAPTURED))]);
        let written = explanation_value(&explanation);
        assert!(matches(pattern, &written, &mut captured), "{written}\ndoes not match {pattern}");
    }
}
