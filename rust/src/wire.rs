//! The cronoq wire protocol, version 1 (docs/protocol.md): headers, batches and bodies.
//!
//! Every message is described once, as a [`Schema`]: its tag and its fields in order, each with a
//! type and (for trailing fields) a default. One reader and one writer work from those tables for
//! all four directions, so a field added to the protocol is one line here.
//!
//! Reading is as strict as the Python broker's (msgspec): an int is a msgpack integer only, a bool
//! is `true`/`false` only, a float may be written as an integer, a string is msgpack str (valid
//! UTF-8), nil only where a field allows it. Trailing fields with a default may be left out, extra
//! trailing elements are ignored. Writing always writes every field, as cronoq's own peers do.

use rmpv::Value;

use crate::error::{Error, Result};

/// The protocol version every header carries.
pub const PROTOCOL_VERSION: i64 = 1;

/// The largest batch frame a cronoq peer writes; a message that would not fit goes alone.
pub const BATCH_BYTES: usize = 32 * 1024;

/// msgpack nil: the body of a message sent without one.
pub const NIL_BODY: &[u8] = &[0xc0];

/// The type a field must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A msgpack integer.
    Int,
    /// `true` or `false`.
    Bool,
    /// A float, or an integer read as one.
    Float,
    /// A msgpack str.
    Str,
    /// A task id: a str of at most [`MAX_TASK_ID_CHARS`] characters.
    TaskId,
    /// A pool's name: a str of at most [`MAX_NAME_CHARS`] characters.
    Name,
    /// A str or nil.
    OptStr,
    /// A float (or integer) or nil.
    OptFloat,
    /// An integer or nil.
    OptInt,
    /// An array of at most [`MAX_READY_POOLS`] pool names.
    StrList,
    /// A map of at most [`MAX_READY_POOLS`] pool names to maps of at most [`MAX_POOL_SETTINGS`]
    /// entries keyed by names (a worker's pool settings).
    Settings,
    /// Any msgpack value.
    Any,
}

/// A field's default, for trailing fields a sender may leave out.
#[derive(Debug, Clone, Copy)]
pub enum Fallback {
    /// No default: the field must be there.
    Required,
    /// nil.
    Nil,
    /// An integer.
    Int(i64),
    /// A bool.
    Bool(bool),
    /// A string.
    Str(&'static str),
    /// An empty map.
    EmptyMap,
}

impl Fallback {
    fn value(self) -> Option<Value> {
        match self {
            Fallback::Required => None,
            Fallback::Nil => Some(Value::Nil),
            Fallback::Int(i) => Some(Value::from(i)),
            Fallback::Bool(b) => Some(Value::Boolean(b)),
            Fallback::Str(s) => Some(Value::from(s)),
            Fallback::EmptyMap => Some(Value::Map(Vec::new())),
        }
    }
}

/// One field of a message: its name in docs/protocol.md, its type and its default.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// The field's name.
    pub name: &'static str,
    /// Its type.
    pub kind: Kind,
    /// Its default.
    pub default: Fallback,
}

const fn f(name: &'static str, kind: Kind, default: Fallback) -> Field {
    Field { name, kind, default }
}
const fn req(name: &'static str, kind: Kind) -> Field {
    Field { name, kind, default: Fallback::Required }
}

/// A message type: its tag and the fields after the version, in order.
#[derive(Debug)]
pub struct Schema {
    /// The tag, the header's first element.
    pub tag: &'static str,
    /// The fields after the version.
    pub fields: &'static [Field],
}

use Fallback as D;
use Kind as K;

/// What a client sends to the client endpoint.
pub static CLIENT_REQUESTS: &[Schema] = &[
    Schema {
        tag: "submit",
        fields: &[
            req("rid", K::Int),
            f("pool", K::Str, D::Str("default")),
            f("tenant", K::OptStr, D::Nil),
            f("priority", K::Str, D::Str("normal")),
            f("deadline", K::OptFloat, D::Nil),
            f("delay", K::OptFloat, D::Nil),
            f("key", K::OptStr, D::Nil),
            f("max_retries", K::Int, D::Int(0)),
            f("submission", K::OptStr, D::Nil),
            f("watch", K::Bool, D::Bool(false)),
            f("cost", K::OptFloat, D::Nil),
            f("outcome_only", K::Bool, D::Bool(false)),
        ],
    },
    Schema { tag: "wait", fields: &[req("rid", K::Int), req("id", K::TaskId)] },
    Schema { tag: "unwait", fields: &[req("rid", K::Int), req("id", K::TaskId)] },
    Schema { tag: "status", fields: &[req("rid", K::Int), req("id", K::TaskId)] },
    Schema { tag: "explain", fields: &[req("rid", K::Int), req("id", K::TaskId)] },
    Schema { tag: "cancel", fields: &[req("rid", K::Int), req("id", K::TaskId)] },
    Schema { tag: "pause", fields: &[req("rid", K::Int), req("pool", K::Name)] },
    Schema { tag: "resume", fields: &[req("rid", K::Int), req("pool", K::Name)] },
    Schema { tag: "stats", fields: &[req("rid", K::Int)] },
    Schema { tag: "reload", fields: &[req("rid", K::Int)] },
    Schema { tag: "ping", fields: &[req("rid", K::Int)] },
    Schema { tag: "hello", fields: &[req("rid", K::Int)] },
    Schema { tag: "cluster", fields: &[req("rid", K::Int)] },
];

static ERROR: Schema = Schema {
    tag: "error",
    fields: &[req("rid", K::Int), req("code", K::Str), req("message", K::Str), f("details", K::Any, D::Nil)],
};

/// What the broker sends a client.
pub static CLIENT_REPLIES: &[Schema] = &[
    Schema {
        tag: "accepted",
        fields: &[req("rid", K::Int), req("id", K::Str), f("duplicate", K::Bool, D::Bool(false))],
    },
    Schema {
        tag: "outcome",
        fields: &[
            req("rid", K::Int),
            req("id", K::Str),
            req("state", K::Str),
            f("error_type", K::Str, D::Str("")),
            f("error_message", K::Str, D::Str("")),
            f("traceback", K::Str, D::Str("")),
        ],
    },
    Schema {
        tag: "info",
        fields: &[
            req("rid", K::Int),
            req("id", K::Str),
            req("pool", K::Str),
            req("tenant", K::OptStr),
            req("priority", K::Str),
            req("state", K::Str),
            req("attempts", K::Int),
            req("submitted_at", K::Float),
            f("started_at", K::OptFloat, D::Nil),
            f("finished_at", K::OptFloat, D::Nil),
            f("deadline", K::OptFloat, D::Nil),
            f("error", K::OptStr, D::Nil),
            f("cost", K::OptFloat, D::Nil),
        ],
    },
    Schema { tag: "ok", fields: &[req("rid", K::Int), f("value", K::Any, D::Nil)] },
    Schema { tag: "error", fields: ERROR.fields },
];

/// What a worker sends to the worker endpoint.
pub static WORKER_MESSAGES: &[Schema] = &[
    Schema {
        tag: "ready",
        fields: &[
            req("rid", K::Int),
            req("pools", K::StrList),
            req("slots", K::Int),
            f("settings", K::Settings, D::EmptyMap),
            f("concurrency", K::OptInt, D::Nil),
        ],
    },
    Schema { tag: "heartbeat", fields: &[] },
    Schema {
        tag: "done",
        fields: &[
            req("id", K::TaskId),
            req("attempt", K::Int),
            req("ok", K::Bool),
            f("error_type", K::Str, D::Str("")),
            f("error_message", K::Str, D::Str("")),
            f("traceback", K::Str, D::Str("")),
        ],
    },
    Schema { tag: "leave", fields: &[] },
    Schema { tag: "bye", fields: &[] },
    Schema { tag: "cluster", fields: &[req("rid", K::Int)] },
];

/// What the broker sends a worker.
pub static WORKER_COMMANDS: &[Schema] = &[
    Schema {
        tag: "welcome",
        fields: &[
            req("rid", K::Int),
            req("heartbeat_interval", K::Float),
            req("liveness", K::Int),
            f("max_payload_bytes", K::OptInt, D::Nil),
        ],
    },
    Schema {
        tag: "task",
        fields: &[
            req("id", K::Str),
            req("attempt", K::Int),
            req("pool", K::Str),
            req("tenant", K::OptStr),
            req("priority", K::Str),
        ],
    },
    Schema { tag: "heartbeat", fields: &[] },
    Schema { tag: "reregister", fields: &[] },
    Schema { tag: "left", fields: &[] },
    Schema { tag: "ok", fields: &[req("rid", K::Int), f("value", K::Any, D::Nil)] },
    Schema { tag: "error", fields: ERROR.fields },
];

/// One direction of the protocol: the messages it carries (a batch of them is always allowed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Client → broker.
    ClientRequest,
    /// Broker → client.
    ClientReply,
    /// Worker → broker.
    WorkerMessage,
    /// Broker → worker.
    WorkerCommand,
}

impl Direction {
    /// The schemas of this direction's messages.
    pub fn schemas(self) -> &'static [Schema] {
        match self {
            Direction::ClientRequest => CLIENT_REQUESTS,
            Direction::ClientReply => CLIENT_REPLIES,
            Direction::WorkerMessage => WORKER_MESSAGES,
            Direction::WorkerCommand => WORKER_COMMANDS,
        }
    }

    fn what(self) -> &'static str {
        match self {
            Direction::ClientRequest => "client request",
            Direction::ClientReply => "broker reply",
            Direction::WorkerMessage => "worker message",
            Direction::WorkerCommand => "broker command",
        }
    }

    /// The schema of `tag` in this direction, if it has one.
    pub fn schema(self, tag: &str) -> Option<&'static Schema> {
        self.schemas().iter().find(|s| s.tag == tag)
    }
}

/// A header as read: its tag and every field by name (defaults filled in), typed as the schema says
/// (float fields are always `Value::F64`).
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    /// The message's tag.
    pub tag: &'static str,
    /// Every field of the schema, in order.
    pub fields: Vec<(&'static str, Value)>,
}

impl Header {
    /// A field's value (nil for a field this message does not have).
    pub fn get(&self, name: &str) -> &Value {
        static NIL: Value = Value::Nil;
        self.fields.iter().find(|(n, _)| *n == name).map(|(_, v)| v).unwrap_or(&NIL)
    }

    /// A str field, or `""`.
    pub fn str(&self, name: &str) -> &str {
        self.get(name).as_str().unwrap_or("")
    }

    /// A str-or-nil field.
    pub fn opt_str(&self, name: &str) -> Option<&str> {
        self.get(name).as_str()
    }

    /// An int field, or 0.
    pub fn int(&self, name: &str) -> i64 {
        self.get(name).as_i64().unwrap_or(0)
    }

    /// A float-or-nil field.
    pub fn opt_float(&self, name: &str) -> Option<f64> {
        self.get(name).as_f64()
    }

    /// A bool field, or false.
    pub fn bool(&self, name: &str) -> bool {
        self.get(name).as_bool().unwrap_or(false)
    }

    /// The request id, for messages that have one (0 otherwise).
    pub fn rid(&self) -> i64 {
        self.int("rid")
    }

    /// The header as msgpack, every field written.
    pub fn encode(&self) -> Vec<u8> {
        encode_header(self.tag, self.fields.iter().map(|(_, v)| v.clone()).collect())
    }
}

/// A message as a strict reader sees it: one header, or a batch of (header, body) items.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// A lone message (its body, if any, is the next frame).
    Single(Header),
    /// A batch: each item's header and body (`None` for nil).
    Batch(Vec<(Header, Option<Vec<u8>>)>),
}

/// What one item of a received message turned out to be: a message with its body, or a refusal
/// (an item of a batch that could not be read, with the rid its header shows, else 0).
pub type Item = std::result::Result<(Header, Option<Vec<u8>>), (i64, Error)>;

/// Write `[tag, 1, fields...]` as msgpack.
pub fn encode_header(tag: &str, fields: Vec<Value>) -> Vec<u8> {
    let mut array = Vec::with_capacity(fields.len() + 2);
    array.push(Value::from(tag));
    array.push(Value::from(PROTOCOL_VERSION));
    array.extend(fields);
    encode_value(&Value::Array(array))
}

/// Any msgpack value as bytes (shortest forms, floats as float64).
pub fn encode_value(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, value).expect("writing to a Vec cannot fail");
    out
}

/// One whole msgpack document: nothing missing, nothing after it.
pub fn decode_value(bytes: &[u8]) -> Result<Value> {
    let mut cursor = bytes;
    let value = rmpv::decode::read_value(&mut cursor)
        .map_err(|e| Error::InvalidArgument(format!("not one msgpack document: {e}")))?;
    if !cursor.is_empty() {
        return Err(Error::InvalidArgument(format!("{} bytes follow the msgpack document", cursor.len())));
    }
    Ok(value)
}

fn malformed(direction: Direction, why: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("malformed {}: {why}", direction.what()))
}

/// Read a header's fields against its schema. `Err` names what is wrong.
fn read_fields(direction: Direction, value: &Value) -> Result<Header> {
    let array = match value {
        Value::Array(a) => a,
        _ => return Err(malformed(direction, "a header is a msgpack array")),
    };
    let tag = match array.first() {
        Some(Value::String(s)) if s.is_str() => s.as_str().unwrap(),
        _ => return Err(malformed(direction, "a header starts with its tag, a string")),
    };
    let schema = direction.schema(tag).ok_or_else(|| {
        let tags: Vec<&str> = direction.schemas().iter().map(|s| s.tag).collect();
        malformed(
            direction,
            format!("unknown tag {tag:?}; a {} is one of: {}, batch", direction.what(), tags.join(", ")),
        )
    })?;
    match array.get(1) {
        Some(Value::Integer(i)) if i.as_i64() == Some(PROTOCOL_VERSION) => {}
        Some(Value::Integer(i)) => {
            return Err(Error::InvalidArgument(format!(
                "unsupported protocol version {i} in {}; this peer speaks {PROTOCOL_VERSION}",
                direction.what()
            )))
        }
        _ => return Err(malformed(direction, "the version must be the integer 1")),
    }
    let mut fields = Vec::with_capacity(schema.fields.len());
    for (n, field) in schema.fields.iter().enumerate() {
        let value = match array.get(n + 2) {
            Some(v) => check(field, v).ok_or_else(|| {
                malformed(direction, format!("{}: field {} must be {}", schema.tag, field.name, describe(field.kind)))
            })?,
            None => field
                .default
                .value()
                .ok_or_else(|| malformed(direction, format!("{}: field {} is missing", schema.tag, field.name)))?,
        };
        fields.push((field.name, value));
    }
    Ok(Header { tag: schema.tag, fields })
}

fn describe(kind: Kind) -> &'static str {
    match kind {
        Kind::Int => "an int",
        Kind::Bool => "a bool",
        Kind::Float => "a float",
        Kind::Str => "a str",
        Kind::TaskId => "a str of at most 256 characters",
        Kind::Name => "a str of at most 200 characters",
        Kind::OptStr => "a str or nil",
        Kind::OptFloat => "a float or nil",
        Kind::OptInt => "an int or nil",
        Kind::StrList => "an array of at most 1024 names (str of at most 200 characters)",
        Kind::Settings => "a map of at most 1024 names to maps of at most 16 entries keyed by names",
        Kind::Any => "a msgpack value",
    }
}

fn is_str(v: &Value) -> bool {
    matches!(v, Value::String(s) if s.is_str())
}

/// A str of at most `limit` characters (Unicode scalar values, as the broker counts them).
fn is_str_within(v: &Value, limit: usize) -> bool {
    matches!(v, Value::String(s) if s.as_str().is_some_and(|text| text.chars().count() <= limit))
}

fn is_name(v: &Value) -> bool {
    is_str_within(v, MAX_NAME_CHARS)
}

/// The value as the field holds it, or None when it has the wrong type.
fn check(field: &Field, v: &Value) -> Option<Value> {
    let float = |v: &Value| match v {
        Value::F64(x) => Some(Value::F64(*x)),
        Value::F32(x) => Some(Value::F64(*x as f64)),
        Value::Integer(i) => Some(Value::F64(i.as_f64()?)),
        _ => None,
    };
    match field.kind {
        Kind::Int => matches!(v, Value::Integer(_)).then(|| v.clone()),
        Kind::Bool => matches!(v, Value::Boolean(_)).then(|| v.clone()),
        Kind::Float => float(v),
        Kind::Str => is_str(v).then(|| v.clone()),
        Kind::TaskId => is_str_within(v, MAX_TASK_ID_CHARS).then(|| v.clone()),
        Kind::Name => is_name(v).then(|| v.clone()),
        Kind::OptStr => (v.is_nil() || is_str(v)).then(|| v.clone()),
        Kind::OptFloat => {
            if v.is_nil() {
                Some(Value::Nil)
            } else {
                float(v)
            }
        }
        Kind::OptInt => matches!(v, Value::Nil | Value::Integer(_)).then(|| v.clone()),
        Kind::StrList => match v {
            Value::Array(items) if items.len() <= MAX_READY_POOLS && items.iter().all(is_name) => Some(v.clone()),
            _ => None,
        },
        Kind::Settings => match v {
            Value::Map(entries)
                if entries.len() <= MAX_READY_POOLS
                    && entries.iter().all(|(k, inner)| {
                        is_name(k)
                            && matches!(inner, Value::Map(m)
                                if m.len() <= MAX_POOL_SETTINGS && m.iter().all(|(k2, _)| is_name(k2)))
                    }) =>
            {
                Some(v.clone())
            }
            _ => None,
        },
        Kind::Any => Some(v.clone()),
    }
}

/// The rid a header shows, for routing an error about it (docs/protocol.md, "Which rid an error
/// carries"): the third element of an array whose first is a tag with a rid and whose third is an
/// integer; else 0.
pub fn peek_rid(value: &Value) -> i64 {
    const RIDLESS: &[&str] = &["heartbeat", "done", "leave", "bye", "batch", "task", "reregister", "left"];
    match value {
        Value::Array(a) if a.len() >= 3 => match (&a[0], &a[2]) {
            (Value::String(tag), Value::Integer(rid)) if tag.is_str() && !RIDLESS.contains(&tag.as_str().unwrap()) => {
                rid.as_i64().unwrap_or(0)
            }
            _ => 0,
        },
        _ => 0,
    }
}

fn is_batch(value: &Value) -> bool {
    matches!(value, Value::Array(a) if matches!(a.first(), Some(Value::String(s)) if s.as_str() == Some("batch")))
}

/// Read the items of a batch header, each for itself. `Err` when it is not a batch at all.
fn read_batch(direction: Direction, value: &Value) -> Result<Vec<Item>> {
    let array = value.as_array().expect("is_batch checked it");
    match array.get(1) {
        Some(Value::Integer(i)) if i.as_i64() == Some(PROTOCOL_VERSION) => {}
        Some(Value::Integer(i)) => {
            return Err(Error::InvalidArgument(format!(
                "unsupported protocol version {i} in {}; this peer speaks {PROTOCOL_VERSION}",
                direction.what()
            )))
        }
        _ => return Err(malformed(direction, "the version must be the integer 1")),
    }
    let items = match array.get(2) {
        Some(Value::Array(items)) => items,
        _ => return Err(malformed(direction, "a batch is [\"batch\", 1, [items]]")),
    };
    Ok(items
        .iter()
        .enumerate()
        .map(|(n, item)| {
            read_item(direction, item).map_err(|e| {
                let rid = match item {
                    Value::Array(pair) => pair.first().map(peek_rid).unwrap_or(0),
                    _ => 0,
                };
                let message = e.message().replacen(
                    direction.what(),
                    &format!("{} (item {} of a batch)", direction.what(), n + 1),
                    1,
                );
                (rid, Error::InvalidArgument(message))
            })
        })
        .collect())
}

fn read_item(direction: Direction, item: &Value) -> Result<(Header, Option<Vec<u8>>)> {
    let pair = match item {
        Value::Array(pair) if pair.len() == 2 => pair,
        _ => return Err(malformed(direction, "a batch item is [header, body]")),
    };
    if is_batch(&pair[0]) {
        return Err(malformed(direction, "a batch holds no batch"));
    }
    let header = read_fields(direction, &pair[0])?;
    let body = match &pair[1] {
        Value::Nil => None,
        Value::Binary(b) => Some(b.clone()),
        _ => return Err(malformed(direction, "a batch item's body is bin or nil")),
    };
    Ok((header, body))
}

/// Read a header strictly: a lone message, or a batch whose every item reads. Any fault refuses the
/// whole (the reader of the protocol vectors' `message`).
pub fn decode_strict(direction: Direction, header: &[u8]) -> Result<Message> {
    let value = decode_value(header).map_err(|e| malformed(direction, e.message()))?;
    if is_batch(&value) {
        let mut out = Vec::new();
        for item in read_batch(direction, &value)? {
            out.push(item.map_err(|(_, e)| e)?);
        }
        return Ok(Message::Batch(out));
    }
    read_fields(direction, &value).map(Message::Single)
}

/// The messages one received ZeroMQ message carries, in order, a batch read item by item (an item
/// that cannot be read stands as a refusal). `Err` when the message as a whole cannot be read.
pub fn read(direction: Direction, header: &[u8], body: Option<&[u8]>) -> std::result::Result<Vec<Item>, (i64, Error)> {
    let value = decode_value(header).map_err(|e| (0, malformed(direction, e.message())))?;
    if is_batch(&value) {
        if body.is_some() {
            return Err((
                0,
                Error::InvalidArgument(
                    "a batch carries its bodies inside its header: no body frame may follow it".into(),
                ),
            ));
        }
        return read_batch(direction, &value).map_err(|e| (0, e));
    }
    let rid = peek_rid(&value);
    let header = read_fields(direction, &value).map_err(|e| (rid, e))?;
    Ok(vec![Ok((header, body.map(<[u8]>::to_vec)))])
}

/// The frames (after the token) that carry `items` to one peer, in order, with how many items each
/// carries: one item as plain frames, more as batches of at most `limit` bytes, split in halves until
/// they fit.
pub fn pack(items: &[(Vec<u8>, Option<Vec<u8>>)], limit: usize) -> Vec<(Vec<Vec<u8>>, usize)> {
    if items.len() == 1 {
        let (header, body) = &items[0];
        let mut frames = vec![header.clone()];
        if let Some(body) = body {
            frames.push(body.clone());
        }
        return vec![(frames, 1)];
    }
    let frame = encode_batch(items);
    if frame.len() <= limit || items.len() < 2 {
        return vec![(vec![frame], items.len())];
    }
    let half = items.len() / 2;
    let mut out = pack(&items[..half], limit);
    out.extend(pack(&items[half..], limit));
    out
}

/// `["batch", 1, [[header, body], ...]]` with each header spliced in as it was encoded.
pub fn encode_batch(items: &[(Vec<u8>, Option<Vec<u8>>)]) -> Vec<u8> {
    let size: usize = items.iter().map(|(h, b)| h.len() + b.as_ref().map_or(1, |b| b.len() + 5) + 1).sum();
    let mut out = Vec::with_capacity(size + 16);
    rmp::encode::write_array_len(&mut out, 3).unwrap();
    rmp::encode::write_str(&mut out, "batch").unwrap();
    rmp::encode::write_sint(&mut out, PROTOCOL_VERSION).unwrap();
    rmp::encode::write_array_len(&mut out, items.len() as u32).unwrap();
    for (header, body) in items {
        rmp::encode::write_array_len(&mut out, 2).unwrap();
        out.extend_from_slice(header);
        match body {
            Some(body) => {
                rmp::encode::write_bin(&mut out, body).unwrap();
            }
            None => out.push(0xc0),
        }
    }
    out
}

/// Whether `body` is exactly one well-formed msgpack document.
pub fn is_document(body: &[u8]) -> bool {
    decode_value(body).is_ok()
}

/// Cut `text` to at most `limit` UTF-8 bytes, keeping its start and end around a line saying how
/// many bytes were cut (as the Python worker does for failure texts).
pub fn clip(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_string();
    }
    let marker = |cut: usize| format!("\n... [{cut} bytes cut] ...\n");
    let room = limit.saturating_sub(marker(text.len()).len());
    let mut head_end = room / 2;
    while !text.is_char_boundary(head_end) {
        head_end -= 1;
    }
    let mut tail_start = text.len() - (room - room / 2);
    while !text.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    let cut = tail_start - head_end;
    format!("{}{}{}", &text[..head_end], marker(cut), &text[tail_start..])
}

/// Longest error type, message and traceback a `done` carries (UTF-8 bytes).
pub const MAX_ERROR_TYPE_BYTES: usize = 256;

/// See [`MAX_ERROR_TYPE_BYTES`].
pub const MAX_ERROR_MESSAGE_BYTES: usize = 8 * 1024;
/// See [`MAX_ERROR_TYPE_BYTES`].
pub const MAX_TRACEBACK_BYTES: usize = 32 * 1024;

/// The longest task id, in characters, a peer may send (`wait`, `status`, `done`, ...): longer is refused.
pub const MAX_TASK_ID_CHARS: usize = 256;
/// The longest pool name (or settings key), in characters, in `pause`, `resume` and `ready`: longer is refused.
pub const MAX_NAME_CHARS: usize = 200;
/// The most pools one `ready` may name (and entries its settings may hold).
pub const MAX_READY_POOLS: usize = 1024;
/// The most settings one pool's entry in a `ready` may hold.
pub const MAX_POOL_SETTINGS: usize = 16;

/// The value under `name` in a msgpack map's entries.
pub(crate) fn entry<'a>(map: &'a [(Value, Value)], name: &str) -> Option<&'a Value> {
    map.iter().find(|(k, _)| k.as_str() == Some(name)).map(|(_, v)| v)
}

/// The value under `name` when `value` is a msgpack map; None for any other value.
pub(crate) fn field<'a>(value: &'a Value, name: &str) -> Option<&'a Value> {
    value.as_map().and_then(|map| entry(map, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_round_trip() {
        let bytes = encode_header("ping", vec![Value::from(1)]);
        assert_eq!(bytes, vec![0x93, 0xa4, b'p', b'i', b'n', b'g', 1, 1]);
        match decode_strict(Direction::ClientRequest, &bytes).unwrap() {
            Message::Single(h) => assert_eq!(h.rid(), 1),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn pack_batches_what_fits_and_splits_the_rest() {
        let small = |n: i64| (encode_header("ping", vec![Value::from(n)]), None);
        // One message goes as plain frames, with its body as a frame of its own.
        let lone = pack(&[(encode_header("ping", vec![Value::from(1)]), Some(NIL_BODY.to_vec()))], BATCH_BYTES);
        assert_eq!(lone.len(), 1);
        assert_eq!(lone[0].0.len(), 2);
        // Many small ones go as one batch, which reads back item by item, in order.
        let items: Vec<_> = (1..=100).map(small).collect();
        let packed = pack(&items, BATCH_BYTES);
        assert_eq!(packed.len(), 1);
        assert_eq!(packed[0].1, 100);
        let read = read(Direction::ClientRequest, &packed[0].0[0], None).unwrap();
        let rids: Vec<i64> = read.iter().map(|i| i.as_ref().unwrap().0.rid()).collect();
        assert_eq!(rids, (1..=100).collect::<Vec<_>>());
        // Big bodies split into batches under the limit, each item in exactly one of them.
        let body = encode_value(&Value::from("x".repeat(10_000)));
        let big: Vec<_> = (1..=10).map(|n| (encode_header("ping", vec![Value::from(n)]), Some(body.clone()))).collect();
        let packed = pack(&big, BATCH_BYTES);
        assert!(packed.len() > 1);
        assert_eq!(packed.iter().map(|(_, n)| n).sum::<usize>(), 10);
        assert!(packed.iter().all(|(frames, _)| frames.iter().map(Vec::len).sum::<usize>() <= BATCH_BYTES));
    }

    #[test]
    fn clip_keeps_both_ends() {
        let text = "a".repeat(1000) + &"b".repeat(1000);
        let clipped = clip(&text, 200);
        assert!(clipped.len() <= 200, "{}", clipped.len());
        assert!(clipped.starts_with('a') && clipped.ends_with('b') && clipped.contains("bytes cut"));
    }
}
