//! [`Connection`]: one DEALER socket to one broker's client endpoint (its primary and its
//! standbys), many requests in flight on it. [`Client`](crate::Client) talks through one; in a
//! cluster, its router (src/client/cluster.rs) keeps one per member.
//!
//! Every request gets a request id (`rid`); replies are matched to the waiting caller by it, so
//! submits pipeline instead of taking a round trip each, and what callers ask for during one
//! wake-up of the socket's task leaves as one batch (docs/protocol.md, "Batches").
//!
//! The connection outlives a broker restart (Lazy Pirate, docs/protocol.md "Reconnecting
//! clients"): libzmq reconnects by itself, the socket monitor reports each completed handshake,
//! and on every handshake after the first the connection re-sends each request still waiting for
//! its reply (a `submit` with its same `submission` id, so the broker creates no second task; a
//! `call`, a submit whose one reply is the outcome, until that outcome comes), and a `wait` for
//! every watched task whose outcome has not come. `cancel` is never re-sent.
//!
//! On each connection it asks the broker's rules (`hello`) and refuses a payload over its
//! `max_payload_bytes` itself, before sending anything. The `hello` also says whether the broker is
//! a cluster member ([`Connection::member`]); routing over the cluster is the router's business.
//!
//! The addresses may list a broker's primary and its standbys (docs/scaling.md, "Standby"): the one
//! socket connects to all of them with `ZMQ_IMMEDIATE`, so requests are only queued on a completed
//! connection — the broker that serves, since a standby binds nothing until it takes over. A
//! request made while no connection is up is held here and leaves with the next one, as re-sent
//! requests do; `request_timeout` still bounds its wait. After a takeover the standby's handshake
//! is a new connection like a restarted broker's: what is outstanding is re-sent to it.
//!
//! Waiting is only for a broker that may yet answer (src/link.rs): when no address ever took the
//! connection (refused for a second), or the CURVE handshake cannot succeed, every request fails at
//! once with `Error::Connection` naming the cause, and so do new ones until a handshake succeeds.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use rmpv::Value;
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tracing::Instrument;

use crate::answers::{Explanation, TaskInfo};
use crate::channel::{Channel, Endpoint, Outgoing};
use crate::error::{Error, Result};
use crate::handle::{self, timed_out, Answer, TaskHandle, TaskOutcome};
use crate::task::Task;
use crate::transport::{Dealer, HIGH_WATER_MARK};
use crate::wire::{self, Header};

/// How often a `wait` for an unfinished watched task is sent again without a handshake seen
/// (docs/protocol.md, "Without a socket monitor"); with the monitor this is only a safety net.
const REWAIT_INTERVAL: Duration = Duration::from_secs(10);
/// How long after a refused token new requests fail at once (docs/protocol.md, "Bad tokens").
const REFUSAL_WINDOW: Duration = Duration::from_secs(1);
/// How soon requests libzmq would not queue while a connection was up are offered again (libzmq may
/// attach a new connection a moment after its monitor reports the handshake).
const HELD_RETRY: Duration = Duration::from_millis(20);

type Reply = std::result::Result<(Header, Option<Vec<u8>>), Refused>;

/// Why a request got no answer it can use: the error, and for a cluster member's refusal of a pool
/// it does not own, the member that owns it (the `details` of a `FAILED_PRECONDITION`).
#[derive(Debug, Clone)]
pub(crate) struct Refused {
    pub error: Error,
    pub owner: Option<String>,
}

impl From<Error> for Refused {
    fn from(error: Error) -> Refused {
        Refused { error, owner: None }
    }
}

impl From<Refused> for Error {
    fn from(refused: Refused) -> Error {
        refused.error
    }
}

/// A request waiting for its reply: what to re-send on a new connection, and who waits.
struct Pending {
    reply: Option<oneshot::Sender<Reply>>,
    header: Vec<u8>,
    body: Option<Vec<u8>>,
    resend: bool,
    expires: Option<Instant>,
}

/// A request whose caller is still waiting. Dropped before the reply came (the caller's future was
/// dropped or timed out), it forgets the request, so a new connection does not re-send it, and
/// withdraws a `wait` at the broker with `unwait`. This is what makes every request cancel-safe.
struct Outstanding<'a> {
    connection: &'a Connection,
    rid: i64,
    /// The task a `wait` under `rid` is for.
    unwait: Option<&'a str>,
}

impl Drop for Outstanding<'_> {
    fn drop(&mut self) {
        let inner = &self.connection.inner;
        let mut state = inner.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        state.watches.remove(&self.rid);
        if state.pending.remove(&self.rid).is_none() {
            return; // answered, or failed: the broker holds nothing for it
        }
        if let Some(task_id) = self.unwait {
            let header = wire::encode_header("unwait", vec![Value::from(self.rid), Value::from(task_id)]);
            let _ = inner.outbox.send(Cmd::Send { rid: 0, header, body: None });
        }
    }
}

/// How a watched task's wait ended: its outcome, or nothing (the watch was refused or closed, and
/// an explicit `wait` is needed).
#[derive(Debug, Clone)]
pub(crate) enum WatchEnd {
    Outcome(TaskOutcome),
    Gone,
}

/// A task submitted with `watch`: its outcome comes under the submit's rid.
pub(crate) struct Watch {
    task_id: Mutex<Option<String>>,
    ended: watch::Sender<Option<WatchEnd>>,
    last_wait: Mutex<Instant>,
}

impl Watch {
    fn new() -> Watch {
        Watch { task_id: Mutex::new(None), ended: watch::channel(None).0, last_wait: Mutex::new(Instant::now()) }
    }

    fn settle(&self, end: WatchEnd) {
        self.ended.send_if_modified(|slot| {
            if slot.is_none() {
                *slot = Some(end);
                true
            } else {
                false
            }
        });
    }
}

/// A message waiting to leave: the rid it answers to (0 for none), its header and its body.
type Posted = (i64, Vec<u8>, Option<Vec<u8>>);

enum Cmd {
    Send { rid: i64, header: Vec<u8>, body: Option<Vec<u8>> },
    Close,
}

struct State {
    next_rid: i64,
    next_submission: u64,
    prefix: String,
    pending: HashMap<i64, Pending>,
    watches: HashMap<i64, Arc<Watch>>,
    heard_hello: bool,
    hello_rid: Option<i64>,
    max_payload_bytes: Option<usize>,
    /// The cluster member the broker's `hello` named, if it is one.
    member: Option<String>,
    connections: usize,
    reconnects: usize,
    closed: bool,
    /// When the broker last refused this connection's token, and how. A broker answers a connection
    /// whose token it never took at most once a second and drops the rest unanswered, so requests
    /// made within that second fail at once with the same error instead of going unanswered.
    refused: Option<(Instant, Error)>,
    /// Why waiting for the broker is pointless (nothing ever took the connection, or the CURVE
    /// handshake cannot succeed): requests fail at once with `Error::Connection` saying so, until a
    /// handshake succeeds.
    unreachable: Option<String>,
    /// The `hello` (by rid) that failed, and how: callers waiting for the rules fail as it did.
    hello_failure: Option<(i64, Error)>,
    /// The broker could not read this connection's messages at all (the wrong endpoint): every
    /// request fails so at once, until a new connection.
    misdirected: Option<Error>,
}

impl State {
    fn rid(&mut self) -> i64 {
        self.next_rid += 1;
        self.next_rid
    }

    /// A new submission id: this connection's random prefix and a counter, so a re-sent submit
    /// finds the task the first one made.
    fn submission(&mut self) -> String {
        self.next_submission += 1;
        format!("{}-{:x}", self.prefix, self.next_submission)
    }
}

struct Inner {
    /// What the connection was opened with (a cluster member's is opened with its token and key).
    endpoint: Endpoint,
    /// Every address, as messages name them ("A or B" for a primary and its standby).
    address: String,
    request_timeout: Duration,
    outbox: mpsc::UnboundedSender<Cmd>,
    rules: Notify,
    state: Mutex<State>,
}

/// A connection to one broker's client endpoint (its primary and standbys). Cheap to clone: clones
/// share the connection.
#[derive(Clone)]
pub(crate) struct Connection {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").field("address", &self.inner.address).finish()
    }
}

fn closed(address: &str) -> Error {
    Error::connection(address, format!("the client connection to the broker at {address} was closed"))
}

impl Connection {
    /// Connect to `endpoint` (a broker's primary, then its standbys) and start the socket's task.
    /// Must be called inside a tokio runtime.
    pub fn open(endpoint: Endpoint, request_timeout: Duration) -> Result<Connection> {
        let channel = endpoint.open()?;
        let (tx, rx) = mpsc::unbounded_channel();
        let mut prefix = [0u8; 8];
        getrandom::getrandom(&mut prefix).expect("the operating system's random source");
        let inner = Arc::new(Inner {
            address: endpoint.describe(),
            endpoint,
            request_timeout,
            outbox: tx,
            rules: Notify::new(),
            state: Mutex::new(State {
                next_rid: 0,
                next_submission: 0,
                prefix: prefix.iter().map(|b| format!("{b:02x}")).collect(),
                pending: HashMap::new(),
                watches: HashMap::new(),
                heard_hello: false,
                hello_rid: None,
                max_payload_bytes: None,
                member: None,
                connections: 0,
                reconnects: 0,
                closed: false,
                refused: None,
                unreachable: None,
                hello_failure: None,
                misdirected: None,
            }),
        });
        let connection = Connection { inner: inner.clone() };
        connection.ask_rules();
        let span = tracing::info_span!("cronoq.client", broker = %inner.address);
        tracing::debug!(parent: &span, "connecting");
        tokio::spawn(run(channel, rx, Arc::downgrade(&inner)).instrument(span));
        Ok(connection)
    }

    /// What this connection was opened with.
    pub fn endpoint(&self) -> &Endpoint {
        &self.inner.endpoint
    }

    /// How long a request waits for its reply.
    pub fn request_timeout(&self) -> Duration {
        self.inner.request_timeout
    }

    /// Whether two handles share one connection.
    pub fn same(&self, other: &Connection) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    // ------------------------------------------------------------------ requests

    /// Register a request and post it; the receiver gets its reply.
    fn send(
        &self,
        state: &mut State,
        rid: i64,
        header: Vec<u8>,
        body: Option<Vec<u8>>,
        resend: bool,
        expires: bool,
    ) -> Result<oneshot::Receiver<Reply>> {
        if state.closed {
            return Err(closed(&self.inner.address));
        }
        if let Some((at, error)) = &state.refused {
            if at.elapsed() < REFUSAL_WINDOW {
                return Err(error.clone());
            }
        }
        if let Some(reason) = &state.unreachable {
            return Err(Error::connection(&self.inner.address, reason.clone()));
        }
        if let Some(error) = &state.misdirected {
            return Err(error.clone());
        }
        let (tx, rx) = oneshot::channel();
        state.pending.insert(
            rid,
            Pending {
                reply: Some(tx),
                header: header.clone(),
                body: body.clone(),
                resend,
                expires: expires.then(|| Instant::now() + self.inner.request_timeout),
            },
        );
        let _ = self.inner.outbox.send(Cmd::Send { rid, header, body });
        Ok(rx)
    }

    /// Send a request built by `fields` (given its rid) and wait for its reply.
    pub async fn request(
        &self,
        tag: &str,
        fields: impl FnOnce(i64) -> Vec<Value>,
        body: Option<Vec<u8>>,
        resend: bool,
    ) -> Reply {
        let (rid, rx) = {
            let mut state = self.inner.state.lock().unwrap();
            let rid = state.rid();
            let header = wire::encode_header(tag, fields(rid));
            (rid, self.send(&mut state, rid, header, body, resend, true)?)
        };
        let _outstanding = Outstanding { connection: self, rid, unwait: None };
        rx.await.unwrap_or_else(|_| Err(closed(&self.inner.address).into()))
    }

    /// Send a `hello`, unless one is waiting for its answer.
    fn ask_rules(&self) {
        let mut state = self.inner.state.lock().unwrap();
        if state.hello_rid.is_some_and(|rid| state.pending.contains_key(&rid)) {
            return;
        }
        let rid = state.rid();
        state.hello_rid = Some(rid);
        let header = wire::encode_header("hello", vec![Value::from(rid)]);
        let _ = self.send(&mut state, rid, header, None, true, true);
    }

    /// The broker's max_payload_bytes, waiting for its answer to a `hello` if none came yet (at most
    /// request_timeout: the `hello`'s own failure then, as a submit would meet). None: the broker
    /// does not say.
    pub async fn payload_limit(&self) -> Result<Option<usize>> {
        let give_up = Instant::now() + self.inner.request_timeout;
        let mut asked: Option<i64> = None; // the `hello` this call waits for
        loop {
            let notified = self.inner.rules.notified();
            {
                let state = self.inner.state.lock().unwrap();
                if state.heard_hello {
                    return Ok(state.max_payload_bytes);
                }
                if state.closed {
                    return Err(closed(&self.inner.address));
                }
                if let Some(reason) = &state.unreachable {
                    return Err(Error::connection(&self.inner.address, reason.clone()));
                }
                if let (Some(asked), Some((failed, error))) = (asked, &state.hello_failure) {
                    if asked == *failed {
                        return Err(error.clone());
                    }
                }
            }
            self.ask_rules(); // none waiting means the last went unanswered: ask again
            asked = self.inner.state.lock().unwrap().hello_rid;
            let left = give_up.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, notified).await.is_err() {
                return Err(Error::connection(
                    &self.inner.address,
                    format!(
                        "no reply from the broker at {} within {} s; is it running?",
                        self.inner.address,
                        self.inner.request_timeout.as_secs_f64()
                    ),
                ));
            }
        }
    }

    /// The cluster member the broker's `hello` named (None: a lone broker, or no `hello` answered yet).
    pub fn member(&self) -> Option<String> {
        self.inner.state.lock().unwrap().member.clone()
    }

    /// The broker is a member no more (it answered `cluster` with nil: restarted with another config).
    pub fn forget_member(&self) {
        self.inner.state.lock().unwrap().member = None;
    }

    // ------------------------------------------------------------------ what a broker answers

    /// `submit` on this broker. A payload over its max_payload_bytes, or a name longer than it
    /// takes, is refused here with `InvalidArgument` and nothing is sent. The handle asks this
    /// connection about the task, and waits on the watch the submit set up.
    pub async fn submit(&self, task: &Task) -> std::result::Result<TaskHandle, Refused> {
        let (rid, watch, rx) = self.send_submit(task, false).await?;
        let outstanding = Outstanding { connection: self, rid, unwait: None };
        let reply = rx.await.unwrap_or_else(|_| Err(closed(&self.inner.address).into()));
        std::mem::forget(outstanding); // answered: nothing to withdraw (and the watch must stay)
        let (header, _) = match reply {
            Ok(reply) => reply,
            Err(e) => {
                self.inner.state.lock().unwrap().watches.remove(&rid);
                return Err(e);
            }
        };
        let submitted = Submitted { connection: self.clone(), watch };
        Ok(TaskHandle::new(header.str("id").to_string(), header.bool("duplicate"), Arc::new(submitted)))
    }

    /// `submit` with `watch` and `outcome_only` on this broker: the task's outcome is the one reply
    /// (docs/protocol.md), so this waits for the task to end; returns its id and how it ended.
    /// Checked as `submit` is before anything is sent.
    ///
    /// Re-sent on each new connection until the outcome comes, with the same submission id (the
    /// broker answers a re-sent one with the first task's outcome), so `request_timeout` does not
    /// bound it: the caller's timeout does. An older broker sends `accepted` first: the outcome
    /// then comes on the watch, and a reconnect sends a `wait` for it, as for a submit's handle.
    /// Dropped before the end (a timeout, a `select!`), it forgets the request and its watch; a
    /// late outcome then finds no one and is dropped.
    pub async fn call(&self, task: &Task) -> std::result::Result<(String, TaskOutcome), Refused> {
        let (rid, watch, rx) = self.send_submit(task, true).await?;
        let _outstanding = Outstanding { connection: self, rid, unwait: None };
        let (header, body) = rx.await.unwrap_or_else(|_| Err(closed(&self.inner.address).into()))?;
        let id = header.str("id").to_string();
        if header.tag == "outcome" {
            return Ok((id, outcome_of(&header, body)));
        }
        // An older broker's `accepted`: the outcome follows under the same rid, on the watch.
        let outcome = self.wait_ended(&id, Some(&watch), None).await?;
        Ok((id, outcome))
    }

    /// Sends a watched `submit` of `task` (checked first: see `checked_body`) and returns its rid,
    /// its watch and where its reply will come. The watch is set up before the send: the outcome
    /// may come right behind the `accepted`. With `outcome_only` (a `call`) the outcome is the
    /// reply, so request_timeout does not bound the wait for it.
    async fn send_submit(
        &self,
        task: &Task,
        outcome_only: bool,
    ) -> std::result::Result<(i64, Arc<Watch>, oneshot::Receiver<Reply>), Refused> {
        let body = self.checked_body(task).await?;
        let watch = Arc::new(Watch::new());
        let mut state = self.inner.state.lock().unwrap();
        let rid = state.rid();
        let submission = state.submission();
        let header = submit_header(rid, task, Some(&submission), outcome_only);
        state.watches.insert(rid, watch.clone());
        match self.send(&mut state, rid, header, Some(body), true, !outcome_only) {
            Ok(rx) => Ok((rid, watch, rx)),
            Err(e) => {
                state.watches.remove(&rid); // nothing was sent: nothing will answer
                Err(e.into())
            }
        }
    }

    /// The task's payload, once checked as the broker would (a bad field, a payload over its
    /// max_payload_bytes: `InvalidArgument`), waiting for the broker's rules if none came yet.
    async fn checked_body(&self, task: &Task) -> std::result::Result<Vec<u8>, Refused> {
        let body = task.check()?.to_vec();
        if let Some(limit) = self.payload_limit().await? {
            if body.len() > limit {
                return Err(Error::InvalidArgument(format!(
                    "payload is {} bytes as msgpack, over the broker's max_payload_bytes = {limit}; send less, \
                     or store the data elsewhere and send a reference to it",
                    body.len()
                ))
                .into());
            }
        }
        Ok(body)
    }

    /// Wait for task `task_id` to end: on `watch` (set up by this connection's submit) if given,
    /// else, or if the watch was refused, with a `wait` of its own.
    pub async fn wait_ended(
        &self,
        task_id: &str,
        watch: Option<&Arc<Watch>>,
        timeout: Option<Duration>,
    ) -> Result<TaskOutcome> {
        let give_up = timeout.map(|t| Instant::now() + t);
        if let Some(watch) = watch {
            let mut rx = watch.ended.subscribe();
            let settled = rx.wait_for(Option::is_some);
            let end = match give_up {
                None => settled.await.map(|v| v.clone()),
                Some(at) => match tokio::time::timeout_at(at.into(), settled).await {
                    Ok(r) => r.map(|v| v.clone()),
                    Err(_) => return Err(timed_out(task_id, timeout)),
                },
            };
            if let Ok(Some(WatchEnd::Outcome(outcome))) = end {
                return Ok(outcome);
            }
        }
        // No watch, or it was refused: ask with a `wait` of our own.
        let (rid, rx) = {
            let mut state = self.inner.state.lock().unwrap();
            let rid = state.rid();
            let header = wire::encode_header("wait", vec![Value::from(rid), Value::from(task_id)]);
            (rid, self.send(&mut state, rid, header, None, true, false)?)
        };
        // Whether this future times out or is dropped (a `select!`, a `tokio::time::timeout`), the
        // broker lets go of the wait: it holds a bounded number per task.
        let _outstanding = Outstanding { connection: self, rid, unwait: Some(task_id) };
        let reply = match give_up {
            None => rx.await,
            Some(at) => match tokio::time::timeout_at(at.into(), rx).await {
                Ok(r) => r,
                Err(_) => return Err(timed_out(task_id, timeout)),
            },
        };
        let (header, body) = reply.unwrap_or_else(|_| Err(closed(&self.inner.address).into()))?;
        Ok(outcome_of(&header, body))
    }

    /// A request about one task (`status`, `explain`, `cancel`) on this broker; its answer's header.
    async fn task_request(&self, tag: &str, task_id: &str, resend: bool) -> Result<Header> {
        let (header, _) = self.request(tag, |rid| vec![Value::from(rid), Value::from(task_id)], None, resend).await?;
        Ok(header)
    }

    /// `status` of a task this broker knows.
    pub async fn status(&self, task_id: &str) -> Result<TaskInfo> {
        TaskInfo::from_status(&self.task_request("status", task_id, true).await?)
    }

    /// `explain` of a task this broker knows.
    pub async fn explain(&self, task_id: &str) -> Result<Explanation> {
        Explanation::from_value(self.task_request("explain", task_id, true).await?.get("value"))
    }

    /// `cancel` of a task this broker knows; never re-sent.
    pub async fn cancel(&self, task_id: &str) -> Result<bool> {
        Ok(self.task_request("cancel", task_id, false).await?.get("value").as_bool().unwrap_or(false))
    }

    /// `pause` or `resume` of `pool` on this broker.
    pub async fn pool_request(&self, tag: &str, pool: &str) -> std::result::Result<(), Refused> {
        self.request(tag, |rid| vec![Value::from(rid), Value::from(pool)], None, true).await.map(drop)
    }

    /// This broker's `stats`.
    pub async fn stats(&self) -> Result<Value> {
        let (h, _) = self.request("stats", |rid| vec![Value::from(rid)], None, true).await?;
        Ok(h.get("value").clone())
    }

    /// This broker's answer to `cluster` (nil: it is no member of a cluster).
    pub async fn cluster_map(&self) -> Result<Value> {
        let (h, _) = self.request("cluster", |rid| vec![Value::from(rid)], None, true).await?;
        Ok(h.get("value").clone())
    }

    /// A round trip to the broker.
    pub async fn ping(&self) -> Result<()> {
        Ok(self.request("ping", |rid| vec![Value::from(rid)], None, true).await.map(drop)?)
    }

    /// The broker's max_payload_bytes, as it said on connecting (None until it has, or if it never says).
    pub fn max_payload_bytes(&self) -> Option<usize> {
        self.inner.state.lock().unwrap().max_payload_bytes
    }

    /// How many times the connection was made again (and what was outstanding re-sent).
    pub fn reconnects(&self) -> usize {
        self.inner.state.lock().unwrap().reconnects
    }

    /// Close the connection: requests still waiting fail with `Error::Connection`.
    pub fn close(&self) {
        let _ = self.inner.outbox.send(Cmd::Close);
        let mut state = self.inner.state.lock().unwrap();
        close_state(&mut state, &self.inner.address);
    }
}

/// What a handle of a task submitted on a connection asks: that connection (the member that
/// accepted it, in a cluster), and the watch its outcome comes to.
struct Submitted {
    connection: Connection,
    watch: Arc<Watch>,
}

impl handle::Source for Submitted {
    fn status<'a>(&'a self, task_id: &'a str) -> Answer<'a, TaskInfo> {
        Box::pin(self.connection.status(task_id))
    }

    fn cancel<'a>(&'a self, task_id: &'a str) -> Answer<'a, bool> {
        Box::pin(self.connection.cancel(task_id))
    }

    fn explain<'a>(&'a self, task_id: &'a str) -> Answer<'a, Explanation> {
        Box::pin(self.connection.explain(task_id))
    }

    fn wait<'a>(&'a self, task_id: &'a str, timeout: Option<Duration>) -> Answer<'a, TaskOutcome> {
        Box::pin(self.connection.wait_ended(task_id, Some(&self.watch), timeout))
    }
}

fn close_state(state: &mut State, address: &str) {
    state.closed = true;
    for (_, mut p) in state.pending.drain() {
        if let Some(tx) = p.reply.take() {
            let _ = tx.send(Err(closed(address).into()));
        }
    }
    for (_, w) in state.watches.drain() {
        w.settle(WatchEnd::Gone);
    }
}

/// The error an `error` reply stands for: a cluster member refusing another member's pool says
/// which (`details`: `{"member": OWNER, "pool": POOL}`), and becomes [`Error::NotOwner`].
fn refusal(header: &Header) -> Error {
    let (code, message) = (header.str("code"), header.str("message"));
    let details = header.get("details");
    let detail = |key: &str| wire::field(details, key).and_then(Value::as_str).map(str::to_string);
    match (code, detail("member")) {
        ("FAILED_PRECONDITION", Some(member)) => {
            Error::NotOwner { pool: detail("pool").unwrap_or_default(), member, message: message.to_string() }
        }
        _ => Error::from_code(code, message),
    }
}

/// The member that owns the pool instead, when a member refused it for that reason.
fn moved_to(error: &Error) -> Option<String> {
    match error {
        Error::NotOwner { member, .. } => Some(member.clone()),
        _ => None,
    }
}

/// The `submit` header of `task` under `rid` (docs/protocol.md): always watched, so the outcome
/// comes under the rid too. `outcome_only` (a `call`) leaves the `accepted` out; it is written only
/// when set, so a plain submit is the message it always was.
fn submit_header(rid: i64, task: &Task, submission: Option<&str>, outcome_only: bool) -> Vec<u8> {
    let seconds = |d: Option<Duration>| d.map_or(Value::Nil, |d| Value::F64(d.as_secs_f64()));
    let mut fields = vec![
        Value::from(rid),
        Value::from(task.pool.as_str()),
        task.tenant.as_deref().map_or(Value::Nil, Value::from),
        Value::from(task.priority.as_str()),
        seconds(task.deadline),
        seconds(task.delay),
        task.key.as_deref().map_or(Value::Nil, Value::from),
        Value::from(task.max_retries),
        submission.map_or(Value::Nil, Value::from),
        Value::Boolean(true),
        task.wire_cost(),
    ];
    if outcome_only {
        fields.push(Value::Boolean(true));
    }
    wire::encode_header("submit", fields)
}

fn outcome_of(h: &Header, body: Option<Vec<u8>>) -> TaskOutcome {
    TaskOutcome {
        state: h.str("state").to_string(),
        body,
        error_type: h.str("error_type").to_string(),
        error_message: h.str("error_message").to_string(),
        traceback: h.str("traceback").to_string(),
    }
}

// ---------------------------------------------------------------------- the socket's task

/// Take one reply (a batch item or a lone message).
fn take_reply(inner: &Inner, state: &mut State, header: Header, body: Option<Vec<u8>>) {
    let rid = header.rid();
    if let Some(watch) = state.watches.get(&rid).cloned() {
        let has_id = watch.task_id.lock().unwrap().is_some();
        if header.tag == "outcome" || has_id {
            state.watches.remove(&rid);
            if header.tag == "outcome" {
                // A `call` no `accepted` answered: its request is still waiting, and this is its reply.
                if let Some(tx) = state.pending.remove(&rid).and_then(|mut p| p.reply.take()) {
                    let _ = tx.send(Ok((header, body)));
                    return;
                }
            }
            watch.settle(if header.tag == "outcome" {
                WatchEnd::Outcome(outcome_of(&header, body))
            } else {
                WatchEnd::Gone
            });
            return;
        }
    }
    if header.tag == "error" && header.str("code") == "UNAUTHENTICATED" {
        // The broker answers a message with a bad token once, whatever it held: every request sent
        // with this token shares its fate.
        let error = Error::from_code("UNAUTHENTICATED", crate::error::for_rust(header.str("message")));
        tracing::warn!(broker = %inner.address, %error, "the broker refused this client's token");
        state.refused = Some((Instant::now(), error.clone()));
        for (rid, mut p) in state.pending.drain() {
            state.watches.remove(&rid);
            if let Some(tx) = p.reply.take() {
                let _ = tx.send(Err(error.clone().into()));
            }
        }
        if !state.heard_hello {
            state.heard_hello = true;
            state.max_payload_bytes = None;
        }
        inner.rules.notify_waiters();
        return;
    }
    if header.tag == "error" && rid == 0 {
        // No request has rid 0: the broker could not read the message at all. Refused as it is, so
        // would every later one be: the wrong endpoint (the broker names the right one), or
        // another protocol version. Fail everything now, and every request until a new connection.
        let (code, message) = (header.str("code"), header.str("message"));
        let error = if code == "INVALID_ARGUMENT" && message.contains("endpoint") {
            Error::WrongEndpoint { address: inner.address.clone(), message: message.to_string() }
        } else {
            Error::from_code(code, message)
        };
        tracing::warn!(broker = %inner.address, %error, "the broker could not read this client's messages");
        state.misdirected = Some(error.clone());
        let rids: Vec<i64> = state.pending.keys().copied().collect();
        for rid in rids {
            fail_request(inner, state, rid, error.clone());
        }
        return;
    }
    let Some(mut pending) = state.pending.remove(&rid) else { return };
    if state.hello_rid == Some(rid) {
        state.heard_hello = true;
        let rule = |name: &str| wire::field(header.get("value"), name).cloned();
        state.max_payload_bytes =
            rule("max_payload_bytes").and_then(|v| v.as_u64()).filter(|n| *n > 0).map(|n| n as usize);
        state.member = rule("member").and_then(|v| v.as_str().map(str::to_string));
        inner.rules.notify_waiters();
    }
    let Some(tx) = pending.reply.take() else { return };
    if header.tag == "error" {
        state.watches.remove(&rid);
        let error = refusal(&header);
        let _ = tx.send(Err(Refused { owner: moved_to(&error), error }));
        return;
    }
    if header.tag == "accepted" {
        if let Some(watch) = state.watches.get(&rid) {
            *watch.task_id.lock().unwrap() = Some(header.str("id").to_string());
            *watch.last_wait.lock().unwrap() = Instant::now();
        }
    }
    let _ = tx.send(Ok((header, body)));
}

/// A handshake completed: after the first, re-send what is outstanding (but what `sent` holds:
/// requests held while no connection was up, leaving now), and ask the rules again.
fn connected(state: &mut State, handshakes: usize, posted: &mut Vec<Posted>, sent: &HashSet<i64>) {
    let first = state.connections == 0;
    state.connections += handshakes;
    state.refused = None; // a new connection (maybe a broker with another config) is asked afresh
    state.unreachable = None;
    state.misdirected = None;
    if first {
        tracing::debug!("connected to the broker");
    } else {
        tracing::info!(outstanding = state.pending.len(), "reconnected to the broker: re-sending what is outstanding");
    }
    if !first || handshakes > 1 {
        state.reconnects += 1;
        for (rid, p) in &state.pending {
            if p.resend && p.reply.is_some() && !sent.contains(rid) {
                posted.push((*rid, p.header.clone(), p.body.clone()));
            }
        }
        rewait(state, posted, None);
    }
}

/// Send a `wait` under each watched submit's rid whose outcome has not come (all of them, or those
/// not asked for since `older_than`).
fn rewait(state: &State, posted: &mut Vec<Posted>, older_than: Option<Instant>) {
    for (rid, watch) in &state.watches {
        let Some(id) = watch.task_id.lock().unwrap().clone() else { continue };
        let mut last = watch.last_wait.lock().unwrap();
        if older_than.is_some_and(|t| *last > t) {
            continue;
        }
        *last = Instant::now();
        posted.push((0, wire::encode_header("wait", vec![Value::from(*rid), Value::from(id)]), None));
    }
}

/// Fail one request that will get no reply; a failed `hello` also fails the callers waiting for
/// the broker's rules.
fn fail_request(inner: &Inner, state: &mut State, rid: i64, error: Error) {
    state.watches.remove(&rid);
    let Some(mut p) = state.pending.remove(&rid) else { return };
    if state.hello_rid == Some(rid) {
        state.hello_failure = Some((rid, error.clone()));
        inner.rules.notify_waiters();
    }
    if let Some(tx) = p.reply.take() {
        let _ = tx.send(Err(error.into()));
    }
}

/// Fail the requests whose request_timeout passed, saying why by the state of the links.
fn sweep(inner: &Inner, state: &mut State, channel: &Channel) {
    let now = Instant::now();
    let expired: Vec<i64> =
        state.pending.iter().filter(|(_, p)| p.expires.is_some_and(|t| t <= now)).map(|(r, _)| *r).collect();
    if expired.is_empty() {
        return;
    }
    let error = Error::connection(
        &inner.address,
        channel.dealer.silence(&format!(
            "no reply from the broker at {} within {} s",
            inner.address,
            inner.request_timeout.as_secs_f64()
        )),
    );
    for rid in expired {
        fail_request(inner, state, rid, error.clone());
    }
}

/// Waiting cannot help (the link says why): fail every request now, and every new one until a
/// handshake succeeds. Nothing of them can leave later: with `ZMQ_IMMEDIATE` libzmq queued none
/// (no connection completed), and those held here are dropped.
fn give_up(inner: &Inner, state: &mut State, reason: String, held: &mut Vec<Posted>) {
    let error = Error::connection(&inner.address, reason.clone());
    if state.unreachable.is_none() {
        tracing::warn!(%reason, "giving up on the broker until a connection succeeds");
    }
    state.unreachable = Some(reason);
    let rids: Vec<i64> = state.pending.keys().copied().collect();
    for rid in rids {
        fail_request(inner, state, rid, error.clone());
    }
    held.clear();
}

/// The task that owns the socket: sends what callers post, hands replies to them.
async fn run(channel: Channel, mut rx: mpsc::UnboundedReceiver<Cmd>, weak: Weak<Inner>) {
    let tick_every = weak.upgrade().map_or(Duration::from_secs(1), |i| {
        (i.request_timeout / 8).clamp(Duration::from_millis(10), Duration::from_secs(1))
    });
    let mut tick = tokio::time::interval(tick_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut posted: Vec<Posted> = Vec::new();
    // Messages libzmq would not take: no connection was up (ZMQ_IMMEDIATE), or its queue was full.
    let mut held: Vec<Posted> = Vec::new();
    let mut held_tried = Instant::now();
    let mut last_rewait = Instant::now();
    let mut ticked = false;
    loop {
        let Some(inner) = weak.upgrade() else { return };
        // Handshakes first: a connection's handshake comes before any reply on it.
        let handshakes = channel.dealer.handshakes();
        if handshakes > 0 {
            let mut state = inner.state.lock().unwrap();
            let sent = take_held(&state, &mut held, &mut posted);
            connected(&mut state, handshakes, &mut posted, &sent);
            drop(state);
            held_tried = Instant::now();
            Connection { inner: inner.clone() }.ask_rules(); // posts through the channel: taken below
        } else if !held.is_empty() && channel.dealer.is_up() && held_tried.elapsed() >= HELD_RETRY {
            take_held(&inner.state.lock().unwrap(), &mut held, &mut posted);
            held_tried = Instant::now();
        } else if !channel.dealer.is_up() {
            if let Some(reason) = channel.dealer.hopeless() {
                let mut state = inner.state.lock().unwrap();
                if state.unreachable.is_none() {
                    give_up(&inner, &mut state, reason, &mut held);
                }
            }
        }
        while let Some(replies) = channel.recv() {
            let mut state = inner.state.lock().unwrap();
            for (h, b) in replies {
                take_reply(&inner, &mut state, h, b);
            }
        }
        if std::mem::take(&mut ticked) {
            let mut state = inner.state.lock().unwrap();
            sweep(&inner, &mut state, &channel);
            if last_rewait.elapsed() >= REWAIT_INTERVAL {
                // A safety net for a reconnect the monitor did not report: repeats cost the broker nothing.
                rewait(&state, &mut posted, Some(last_rewait));
                last_rewait = Instant::now();
            }
        }
        // Everything callers posted since the last turn leaves as one batch.
        while let Ok(cmd) = rx.try_recv() {
            match cmd {
                Cmd::Send { rid, header, body } => posted.push((rid, header, body)),
                Cmd::Close => return,
            }
        }
        if !posted.is_empty() {
            let over = send_in_order(&mut held, std::mem::take(&mut posted), |items| channel.send(items));
            fail_unheld(&inner, &channel.dealer, over);
        }
        if channel.dealer.has_input() {
            continue;
        }
        drop(inner);
        let retry_held = (!held.is_empty() && channel.dealer.is_up()).then(|| held_tried + HELD_RETRY);
        tokio::select! {
            _ = channel.dealer.signals.changed() => {}
            cmd = rx.recv() => match cmd {
                Some(Cmd::Send { rid, header, body }) => posted.push((rid, header, body)),
                Some(Cmd::Close) | None => return,
            },
            _ = tick.tick() => ticked = true,
            _ = tokio::time::sleep_until(retry_held.unwrap_or_else(Instant::now).into()), if retry_held.is_some() => {}
        }
    }
}

/// Send what callers posted, packed into batches by `send` (which returns how many it took), behind
/// what libzmq refused earlier and never ahead of it: libzmq may refuse a send a moment after its
/// monitor reported a connection, and a caller's requests must reach the broker in the order made.
/// What is not sent is held, to leave with the next connection (or on a retry while one is up), up
/// to as many as a socket would queue; returns those past that: the broker has been away long.
fn send_in_order(
    held: &mut Vec<Posted>,
    mut posted: Vec<Posted>,
    send: impl FnOnce(&[Outgoing]) -> usize,
) -> Vec<Posted> {
    let mut unsent = if held.is_empty() {
        let items: Vec<Outgoing> = posted.iter().map(|(_, h, b)| (h.clone(), b.clone())).collect();
        let sent = send(&items);
        posted.split_off(sent)
    } else {
        posted
    };
    let room = (HIGH_WATER_MARK as usize).saturating_sub(held.len()).min(unsent.len());
    let over = unsent.split_off(room);
    held.extend(unsent);
    over
}

/// Fail the requests among messages no queue had room for.
fn fail_unheld(inner: &Inner, dealer: &Dealer, over: Vec<Posted>) {
    if over.is_empty() {
        return;
    }
    let error = Error::connection(
        &inner.address,
        dealer.silence(&format!("the send queue to the broker at {} is full", inner.address)),
    );
    let mut state = inner.state.lock().unwrap();
    for (rid, _, _) in over {
        fail_request(inner, &mut state, rid, error.clone());
    }
}

/// Move the held messages still wanted (a request still waiting for its reply, or a message that
/// answers none) to `posted`; returns the rids of the requests among them.
fn take_held(state: &State, held: &mut Vec<Posted>, posted: &mut Vec<Posted>) -> HashSet<i64> {
    let mut sent = HashSet::new();
    for (rid, header, body) in held.drain(..) {
        if rid == 0 {
            posted.push((rid, header, body));
        } else if state.pending.get(&rid).is_some_and(|p| p.reply.is_some()) {
            sent.insert(rid);
            posted.push((rid, header, body));
        }
    }
    sent
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first frame a client sends in a shared vector's step `step`, as bytes.
    fn vector_frame(name: &str, step: usize) -> Vec<u8> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/protocol-vectors").join(name);
        let vector: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let hex = vector["steps"][step]["send"][1].as_str().expect("a header frame");
        (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
    }

    #[test]
    fn a_message_posted_while_refused_ones_are_held_leaves_behind_them() {
        let message = |rid: i64| (rid, vec![rid as u8], None);
        let mut held = Vec::new();
        let mut sent: Vec<Vec<u8>> = Vec::new();
        // libzmq refuses the first (its pipe not attached yet, a moment after the monitor said "up").
        assert!(send_in_order(&mut held, vec![message(1)], |_| 0).is_empty());
        // The next would be taken now, but must not overtake it.
        let over = send_in_order(&mut held, vec![message(2), message(3)], |items| {
            sent.extend(items.iter().map(|(header, _)| header.clone()));
            items.len()
        });
        assert!(over.is_empty() && sent.is_empty());
        assert_eq!(held.iter().map(|m| m.0).collect::<Vec<_>>(), [1, 2, 3]);
        // The retry sends them as made; libzmq takes the first two only, and the third stays held.
        let retried = std::mem::take(&mut held);
        let over = send_in_order(&mut held, retried, |items| {
            sent.extend(items.iter().take(2).map(|(header, _)| header.clone()));
            2
        });
        assert!(over.is_empty());
        assert_eq!(sent, [vec![1], vec![2]]);
        assert_eq!(held.iter().map(|m| m.0).collect::<Vec<_>>(), [3]);
    }

    #[test]
    fn past_a_socket_s_queue_of_held_messages_the_rest_is_returned_to_fail() {
        let mut held: Vec<Posted> = (0..HIGH_WATER_MARK as i64 - 1).map(|rid| (rid, vec![], None)).collect();
        let over = send_in_order(&mut held, vec![(-1, vec![], None), (-2, vec![], None)], |_| unreachable!());
        assert_eq!(held.len(), HIGH_WATER_MARK as usize);
        assert_eq!(held.last().unwrap().0, -1);
        assert_eq!(over.iter().map(|m| m.0).collect::<Vec<_>>(), [-2]);
    }

    #[test]
    fn a_call_sends_the_submit_of_the_outcome_only_vector() {
        let task = Task::new("hi").pool("work");
        assert_eq!(submit_header(21, &task, None, true), vector_frame("submit-outcome-only.json", 0));
        // A plain submit stays the message it was: no trailing field a broker must know.
        let plain = submit_header(21, &task, None, false);
        let fields = |bytes: &[u8]| rmpv::decode::read_value(&mut &bytes[..]).unwrap().as_array().unwrap().len();
        assert_eq!(fields(&plain), 13);
        assert_eq!(fields(&submit_header(21, &task, None, true)), 14);
    }
}
