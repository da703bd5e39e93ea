//! [`connect`] and [`Client`]: one DEALER socket to a broker's client endpoint, many requests in
//! flight on it.
//!
//! Every request gets a request id (`rid`); replies are matched to the waiting caller by it, so
//! submits pipeline instead of taking a round trip each, and what callers ask for during one
//! wake-up of the socket's task leaves as one batch (docs/protocol.md, "Batches").
//!
//! The connection outlives a broker restart (Lazy Pirate, docs/protocol.md "Reconnecting
//! clients"): libzmq reconnects by itself, the socket monitor reports each completed handshake,
//! and on every handshake after the first the client re-sends each request still waiting for its
//! reply (a `submit` with its same `submission` id, so the broker creates no second task), and a
//! `wait` for every watched task whose outcome has not come. `cancel` is never re-sent.
//!
//! On each connection the client asks the broker's rules (`hello`) and refuses a payload over its
//! `max_payload_bytes` itself, before sending anything.
//!
//! The address may list a broker's primary and its standbys (docs/scaling.md, "Standby"): the one
//! socket connects to all of them with `ZMQ_IMMEDIATE`, so requests are only queued on a completed
//! connection — the broker that serves, since a standby binds nothing until it takes over. A
//! request made while no connection is up is held here and leaves with the next one, as re-sent
//! requests do; `request_timeout` still bounds its wait. After a takeover the standby's handshake
//! is a new connection like a restarted broker's: what is outstanding is re-sent to it.
//!
//! Waiting is only for a broker that may yet answer (src/link.rs): when no address ever took the
//! connection (refused for a second), or the CURVE handshake cannot succeed, every request fails at
//! once with `Unavailable` naming the cause, and so do new ones until a handshake succeeds.
//!
//! A broker whose `hello` names a cluster member makes the client learn the cluster map and route
//! each request to the member it concerns (src/cluster.rs), over one such connection per member;
//! a lone broker is talked to as it always was.

use std::collections::{HashMap, HashSet};
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use rmpv::Value;
use tokio::sync::{mpsc, oneshot, watch, Notify};

use crate::address::{self, Addresses};
use crate::cluster::{member_of_task, ClusterMap, Routes};
use crate::error::{Error, Result};
use crate::explain::Explanation;
use crate::handle::{timed_out, Ended, Source, TaskHandle};
use crate::task::{Priority, Task, TaskInfo, TaskState};
use crate::transport::{curve_public_key, Dealer, Options, HIGH_WATER_MARK};
use crate::wire::{self, Direction, Header, BATCH_BYTES};

/// How long a request waits for its reply before failing with `Unavailable` (as the Python client).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The broker address the Python client defaults to.
pub const DEFAULT_CLIENT_ADDRESS: &str = "tcp://127.0.0.1:5555";
/// How often a `wait` for an unfinished watched task is sent again without a handshake seen
/// (docs/protocol.md, "Without a socket monitor"); with the monitor this is only a safety net.
const REWAIT_INTERVAL: Duration = Duration::from_secs(10);
/// How long after a refused token new requests fail at once (docs/protocol.md, "Bad tokens").
const REFUSAL_WINDOW: Duration = Duration::from_secs(1);
/// How soon requests libzmq would not queue while a connection was up are offered again (libzmq may
/// attach a new connection a moment after its monitor reports the handshake).
const HELD_RETRY: Duration = Duration::from_millis(20);

/// Start connecting to the broker's client endpoint at `address`; set options on the returned
/// [`Connect`], then `.await` it.
///
/// `address` may list a broker's primary and its standbys (a list, or one string with commas):
/// requests go to whichever serves, and after a takeover the client carries on with the new one by
/// itself, re-sending what was outstanding. Awaiting fails with `InvalidArgument` when no address is
/// given or libzmq cannot use one.
///
/// ```no_run
/// # async fn demo() -> cronoq::Result<()> {
/// let sched = cronoq::connect("tcp://127.0.0.1:5555")
///     .token(std::env::var("CRONOQ_TOKEN").unwrap_or_default())
///     .request_timeout(std::time::Duration::from_secs(10))
///     .await?;
/// let failover = cronoq::connect(["tcp://10.0.0.1:5555", "tcp://10.0.0.2:5555"]).await?;
/// # Ok(()) }
/// ```
pub fn connect(address: impl Addresses) -> Connect {
    Connect {
        addresses: address.into_strings(),
        token: Vec::new(),
        curve: None,
        request_timeout: DEFAULT_REQUEST_TIMEOUT,
        routing: true,
    }
}

/// Options of a connection to a broker; `.await` it for a [`Client`].
#[derive(Debug, Clone)]
#[must_use = "a Connect does nothing until awaited"]
pub struct Connect {
    addresses: Vec<String>,
    token: Vec<u8>,
    curve: Option<String>,
    request_timeout: Duration,
    routing: bool,
}

impl Connect {
    /// The token to show the broker (its secret's bytes); none for an open broker.
    pub fn token(mut self, token: impl AsRef<[u8]>) -> Connect {
        self.token = token.as_ref().to_vec();
        self
    }

    /// Encrypt the connection with CURVE: the broker's public key as 40 Z85 characters, or the path
    /// of its `NAME.key` file (from `cronoq keygen`).
    pub fn curve_server_key(mut self, key: impl Into<String>) -> Connect {
        self.curve = Some(key.into());
        self
    }

    /// How long a request waits for its reply (default 30 s), re-sent meanwhile across reconnects.
    pub fn request_timeout(mut self, timeout: Duration) -> Connect {
        self.request_timeout = timeout;
        self
    }

    /// Route over the cluster the broker is a member of (the default), or, with `false`, talk to
    /// this broker only: another member's pools are then refused with `FailedPrecondition` naming
    /// their owner, and task ids naming another member are `NotFound`.
    pub fn routing(mut self, routing: bool) -> Connect {
        self.routing = routing;
        self
    }

    async fn open(self) -> Result<Client> {
        let addresses = address::parse(&self.addresses, "broker address")?;
        let curve_key = self.curve.as_deref().map(curve_public_key).transpose()?;
        Client::start(addresses, self.token, curve_key, self.request_timeout, self.routing)
    }
}

impl Client {
    /// Connect to one broker's addresses (a primary, then its standbys) and start the socket's task;
    /// `routing`: follow a cluster if the broker is a member of one (a member's own connection does
    /// not). Must be called inside a tokio runtime.
    fn start(
        addresses: Vec<String>,
        token: Vec<u8>,
        curve_key: Option<Vec<u8>>,
        request_timeout: Duration,
        routing: bool,
    ) -> Result<Client> {
        let options = Options { curve_server_key: curve_key.clone(), monitor: true, heartbeat: Some((1000, 5000)) };
        let dealer = Dealer::connect(&addresses, &options)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let mut prefix = [0u8; 8];
        getrandom::getrandom(&mut prefix).expect("the operating system's random source");
        let inner = Arc::new(Inner {
            address: addresses.join(" or "),
            request_timeout,
            outbox: tx,
            rules: Notify::new(),
            routing,
            token: token.clone(),
            curve_key,
            routes: Mutex::new(None),
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
            }),
        });
        let client = Client { inner: inner.clone() };
        client.ask_rules();
        tokio::spawn(run(dealer, token, rx, Arc::downgrade(&inner)));
        Ok(client)
    }
}

impl IntoFuture for Connect {
    type Output = Result<Client>;
    type IntoFuture = Pin<Box<dyn Future<Output = Result<Client>> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.open())
    }
}

type Reply = std::result::Result<(Header, Option<Vec<u8>>), Refused>;

/// Why a request got no answer it can use: the error, and for a cluster member's refusal of a pool
/// it does not own, the member that owns it (the `details` of a `FAILED_PRECONDITION`).
#[derive(Debug, Clone)]
pub(crate) struct Refused {
    error: Error,
    owner: Option<String>,
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

/// How a watched task's wait ended: its outcome, or nothing (the watch was refused or closed, and
/// an explicit `wait` is needed).
#[derive(Debug, Clone)]
pub(crate) enum WatchEnd {
    Outcome(Ended),
    Gone,
}

/// A task submitted with `watch`: its outcome comes under the submit's rid.
pub(crate) struct Watch {
    task_id: Mutex<Option<String>>,
    ended: watch::Sender<Option<WatchEnd>>,
    last_wait: Mutex<Instant>,
}

impl Watch {
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
    /// handshake cannot succeed): requests fail at once with `Unavailable` saying so, until a
    /// handshake succeeds.
    unreachable: Option<String>,
    /// The `hello` (by rid) that failed, and how: callers waiting for the rules fail as it did.
    hello_failure: Option<(i64, Error)>,
}

impl State {
    fn rid(&mut self) -> i64 {
        self.next_rid += 1;
        self.next_rid
    }
}

struct Inner {
    /// Every address, as messages name them ("A or B" for a primary and its standby).
    address: String,
    request_timeout: Duration,
    outbox: mpsc::UnboundedSender<Cmd>,
    rules: Notify,
    /// Route over the cluster the broker belongs to (false for a member's own connection).
    routing: bool,
    /// What a member's connection is opened with.
    token: Vec<u8>,
    curve_key: Option<Vec<u8>>,
    /// The cluster's map and a connection per member, once learnt (src/cluster.rs).
    routes: Mutex<Option<Routes>>,
    state: Mutex<State>,
}

/// A connection to a broker's client endpoint. Cheap to clone: clones share the connection.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("address", &self.inner.address).finish()
    }
}

fn unavailable_closed() -> Error {
    Error::Unavailable("the client connection was closed".into())
}

impl Client {
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
            return Err(unavailable_closed());
        }
        if let Some((at, error)) = &state.refused {
            if at.elapsed() < REFUSAL_WINDOW {
                return Err(error.clone());
            }
        }
        if let Some(reason) = &state.unreachable {
            return Err(Error::Unavailable(reason.clone()));
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

    async fn request(
        &self,
        tag: &str,
        fields: impl FnOnce(i64) -> Vec<Value>,
        body: Option<Vec<u8>>,
        resend: bool,
    ) -> Reply {
        let rx = {
            let mut state = self.inner.state.lock().unwrap();
            let rid = state.rid();
            let header = wire::encode_header(tag, fields(rid));
            self.send(&mut state, rid, header, body, resend, true)?
        };
        rx.await.unwrap_or_else(|_| Err(unavailable_closed().into()))
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
    async fn payload_limit(&self) -> Result<Option<usize>> {
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
                    return Err(unavailable_closed());
                }
                if let Some(reason) = &state.unreachable {
                    return Err(Error::Unavailable(reason.clone()));
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
                return Err(Error::Unavailable(format!(
                    "no reply from the broker at {} within {} s; is it running?",
                    self.inner.address,
                    self.inner.request_timeout.as_secs_f64()
                )));
            }
        }
    }

    // ------------------------------------------------------------------ API

    /// Queue a task; returns its handle once the broker has accepted it (durably, when the broker
    /// keeps a data_dir). A payload over the broker's max_payload_bytes, or a name longer than it
    /// takes, is refused here with `InvalidArgument` and nothing is sent.
    ///
    /// In a cluster it goes to the member that owns the task's pool (the handle then asks that
    /// member); a member refusing the pool for another owner makes the client read the map again and
    /// try once more there.
    pub async fn submit(&self, task: Task) -> Result<TaskHandle> {
        if self.learn_routes().await? {
            let task = &task;
            return self.routed(&task.pool, |conn| async move { conn.submit_here(task).await }).await;
        }
        Ok(self.submit_here(&task).await?)
    }

    /// `submit` on this connection's broker.
    async fn submit_here(&self, task: &Task) -> std::result::Result<TaskHandle, Refused> {
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
        let watch = Arc::new(Watch {
            task_id: Mutex::new(None),
            ended: watch::channel(None).0,
            last_wait: Mutex::new(Instant::now()),
        });
        let (rid, rx) = {
            let mut state = self.inner.state.lock().unwrap();
            let rid = state.rid();
            state.next_submission += 1;
            let submission = format!("{}-{:x}", state.prefix, state.next_submission);
            let seconds = |d: Option<Duration>| d.map_or(Value::Nil, |d| Value::F64(d.as_secs_f64()));
            let header = wire::encode_header(
                "submit",
                vec![
                    Value::from(rid),
                    Value::from(task.pool.as_str()),
                    task.tenant.as_deref().map_or(Value::Nil, Value::from),
                    Value::from(task.priority.as_str()),
                    seconds(task.deadline),
                    seconds(task.delay),
                    task.key.as_deref().map_or(Value::Nil, Value::from),
                    Value::from(task.max_retries),
                    Value::from(submission),
                    Value::Boolean(true),
                ],
            );
            // Watch from the start: the outcome may come right behind the `accepted`.
            state.watches.insert(rid, watch.clone());
            (rid, self.send(&mut state, rid, header, Some(body), true, true)?)
        };
        let reply = rx.await.unwrap_or_else(|_| Err(unavailable_closed().into()));
        let (header, _) = match reply {
            Ok(reply) => reply,
            Err(e) => {
                self.inner.state.lock().unwrap().watches.remove(&rid);
                return Err(e);
            }
        };
        Ok(TaskHandle {
            id: header.str("id").to_string(),
            duplicate: header.bool("duplicate"),
            source: Source::Client(self.clone(), Some(watch)),
        })
    }

    /// Wait for a task's value by id, also one another connection submitted (see
    /// [`TaskHandle::result`]).
    pub async fn result<T: serde::de::DeserializeOwned>(&self, task_id: &str) -> Result<T> {
        let conn = self.for_task(task_id).await?;
        conn.wait_ended(task_id, None, None).await?.into_result(task_id)?.decode()
    }

    /// Like [`result`](Self::result), giving up with `Timeout` after `timeout`.
    pub async fn result_timeout<T: serde::de::DeserializeOwned>(&self, task_id: &str, timeout: Duration) -> Result<T> {
        let conn = self.for_task(task_id).await?;
        conn.wait_ended(task_id, None, Some(timeout)).await?.into_result(task_id)?.decode()
    }

    pub(crate) async fn wait_ended(
        &self,
        task_id: &str,
        watch: Option<&Arc<Watch>>,
        timeout: Option<Duration>,
    ) -> Result<Ended> {
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
            if let Ok(Some(WatchEnd::Outcome(ended))) = end {
                return Ok(ended);
            }
        }
        // No watch, or it was refused: ask with a `wait` of our own.
        let (rid, rx) = {
            let mut state = self.inner.state.lock().unwrap();
            let rid = state.rid();
            let header = wire::encode_header("wait", vec![Value::from(rid), Value::from(task_id)]);
            (rid, self.send(&mut state, rid, header, None, true, false)?)
        };
        let reply = match give_up {
            None => rx.await,
            Some(at) => match tokio::time::timeout_at(at.into(), rx).await {
                Ok(r) => r,
                Err(_) => {
                    // Tell the broker to let go of the wait.
                    let mut state = self.inner.state.lock().unwrap();
                    if state.pending.remove(&rid).is_some() {
                        let header = wire::encode_header("unwait", vec![Value::from(rid), Value::from(task_id)]);
                        let _ = self.inner.outbox.send(Cmd::Send { rid: 0, header, body: None });
                    }
                    return Err(timed_out(task_id, timeout));
                }
            },
        };
        let (header, body) = reply.unwrap_or_else(|_| Err(unavailable_closed().into()))?;
        Ok(ended_of(&header, body))
    }

    /// A request about one task (`status`, `explain`, `cancel`), on the connection to the member the
    /// task's id names; its answer's header.
    async fn task_request(&self, tag: &str, task_id: &str, resend: bool) -> Result<Header> {
        let conn = self.for_task(task_id).await?;
        let (header, _) = conn.request(tag, |rid| vec![Value::from(rid), Value::from(task_id)], None, resend).await?;
        Ok(header)
    }

    /// A snapshot of a task: state, attempts, timings. NotFound for a task this token may not see.
    pub async fn status(&self, task_id: &str) -> Result<TaskInfo> {
        let h = self.task_request("status", task_id, true).await?;
        Ok(TaskInfo {
            id: h.str("id").to_string(),
            pool: h.str("pool").to_string(),
            tenant: h.opt_str("tenant").map(str::to_string),
            priority: Priority::parse(h.str("priority"))?,
            state: TaskState::parse(h.str("state"))?,
            attempts: h.int("attempts").max(0) as u32,
            submitted_at: h.opt_float("submitted_at").unwrap_or(0.0),
            started_at: h.opt_float("started_at"),
            finished_at: h.opt_float("finished_at"),
            deadline: h.opt_float("deadline"),
            error: h.opt_str("error").map(str::to_string),
        })
    }

    /// Why the task is where it is: what stands before it while it waits (higher classes, deadline
    /// tasks, its place in its queue, its tenant's path in the fair share, a paused pool, busy
    /// workers, a delay) and when it may start, or how each attempt of a task that ran ended
    /// (docs/scheduling.md, "Why is my task waiting?"). NotFound for a task this token may not see.
    pub async fn explain(&self, task_id: &str) -> Result<Explanation> {
        let h = self.task_request("explain", task_id, true).await?;
        Explanation::from_value(h.get("value"))
    }

    /// Cancel a task not yet dispatched; false if it already runs or has finished. Never re-sent:
    /// `Unavailable` when no reply comes.
    pub async fn cancel(&self, task_id: &str) -> Result<bool> {
        let h = self.task_request("cancel", task_id, false).await?;
        Ok(h.get("value").as_bool().unwrap_or(false))
    }

    /// Stop dispatching `pool` (admin token); in a cluster, on the member that owns it.
    pub async fn pause(&self, pool: &str) -> Result<()> {
        self.pool_request("pause", pool).await
    }

    /// Dispatch `pool` again (admin token); in a cluster, on the member that owns it.
    pub async fn resume(&self, pool: &str) -> Result<()> {
        self.pool_request("resume", pool).await
    }

    async fn pool_request(&self, tag: &'static str, pool: &str) -> Result<()> {
        let here = |conn: Client| {
            let pool = pool.to_string();
            async move { conn.request(tag, |rid| vec![Value::from(rid), Value::from(pool)], None, true).await.map(drop) }
        };
        if self.learn_routes().await? {
            return self.routed(pool, here).await;
        }
        Ok(here(self.clone()).await?)
    }

    /// The broker's per-pool statistics (admin token), as a msgpack map.
    ///
    /// In a cluster, every member's, merged as the Python client merges them: `pools` holds every
    /// member's pools (each naming its `member`), `workers` the sum, `members` each member's own
    /// answer, or `{"unreachable": why}` for one that did not answer within 5 s (or the
    /// request_timeout, if shorter); `cluster` is the map's version.
    pub async fn stats(&self) -> Result<Value> {
        if self.learn_routes().await? {
            let members = self.inner.routes.lock().unwrap().as_ref().map(Routes::members).unwrap_or_default();
            let version = self.inner.routes.lock().unwrap().as_ref().and_then(|r| r.version.clone());
            return cluster_stats(members, version, STATS_WAIT.min(self.inner.request_timeout)).await;
        }
        self.stats_here().await
    }

    async fn stats_here(&self) -> Result<Value> {
        let (h, _) = self.request("stats", |rid| vec![Value::from(rid)], None, true).await?;
        Ok(h.get("value").clone())
    }

    /// The cluster map as the broker gives it (members, their addresses and pools, the map's
    /// version; docs/protocol.md, "Clusters"), or `None` from a broker that is no member of a
    /// cluster. Routing follows the map read here.
    pub async fn cluster(&self) -> Result<Option<Value>> {
        let value = self.cluster_map_here().await?;
        if let Some(map) = ClusterMap::parse(&value)? {
            if self.inner.routing && self.inner.routes.lock().unwrap().is_some() {
                self.take_map(&map)?;
            }
            return Ok(Some(value));
        }
        Ok(None)
    }

    /// A round trip to the broker; `Unavailable` when it does not answer in time.
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

    /// Close the connection (every member's, in a cluster): requests still waiting fail with
    /// `Unavailable`.
    pub async fn close(&self) {
        let members = self.inner.routes.lock().unwrap().take().map(|mut r| r.take_all()).unwrap_or_default();
        for member in members {
            Box::pin(member.close()).await;
        }
        let _ = self.inner.outbox.send(Cmd::Close);
        let mut state = self.inner.state.lock().unwrap();
        close_state(&mut state);
    }

    // ------------------------------------------------------------------ cluster

    /// Whether two handles share one connection.
    fn same(&self, other: &Client) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// This connection's broker's answer to `cluster` (nil: it is no member of a cluster).
    async fn cluster_map_here(&self) -> Result<Value> {
        let (h, _) = self.request("cluster", |rid| vec![Value::from(rid)], None, true).await?;
        Ok(h.get("value").clone())
    }

    /// Learn the cluster's routes if the broker is a member and they are not known yet: true when
    /// requests are to be routed. Waits for the broker's `hello` if none came yet.
    async fn learn_routes(&self) -> Result<bool> {
        if !self.inner.routing {
            return Ok(false);
        }
        self.payload_limit().await?; // the `hello`'s answer says whether the broker is a member
        if self.inner.state.lock().unwrap().member.is_none() {
            return Ok(false);
        }
        if self.inner.routes.lock().unwrap().is_some() {
            return Ok(true);
        }
        match ClusterMap::parse(&self.cluster_map_here().await?)? {
            None => {
                // The broker left its cluster since its hello (a restart with another config).
                self.inner.state.lock().unwrap().member = None;
                Ok(false)
            }
            Some(map) => {
                if self.inner.routes.lock().unwrap().is_none() {
                    self.take_map(&map)?;
                }
                Ok(true)
            }
        }
    }

    /// Route by `map` from now on: connect to its new members, close what it no longer lists.
    fn take_map(&self, map: &ClusterMap) -> Result<()> {
        let connect = |addresses: &[String]| {
            let addresses = address::parse(addresses, "cluster member address")?;
            let inner = &self.inner;
            Client::start(addresses, inner.token.clone(), inner.curve_key.clone(), inner.request_timeout, false)
        };
        let gone = {
            let mut routes = self.inner.routes.lock().unwrap();
            routes.get_or_insert_with(Routes::default).update(map, connect)?
        };
        for conn in gone {
            tokio::spawn(async move { conn.close().await });
        }
        Ok(())
    }

    /// The connection that knows `task_id`: in a cluster, the member its id names (learning the map
    /// first, if need be); else this one.
    async fn for_task(&self, task_id: &str) -> Result<Client> {
        if !self.inner.routing || member_of_task(task_id).is_none() || !self.learn_routes().await? {
            return Ok(self.clone());
        }
        Ok(self.inner.routes.lock().unwrap().as_ref().and_then(|r| r.for_task(task_id)).unwrap_or_else(|| self.clone()))
    }

    /// `call` on the connection to `pool`'s owner (this one for a pool the map does not list: it
    /// answers `NotFound` as a lone broker would). A refusal naming another owner re-reads the map
    /// from the member that refused, and tries once more at the owner.
    async fn routed<T, F, Fut>(&self, pool: &str, call: F) -> Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, Refused>>,
    {
        let owner_of = |pool: &str| self.inner.routes.lock().unwrap().as_ref().and_then(|r| r.for_pool(pool));
        let conn = owner_of(pool).unwrap_or_else(|| self.clone());
        let refused = match call(conn.clone()).await {
            Ok(value) => return Ok(value),
            Err(refused) => refused,
        };
        let Some(owner) = refused.owner else { return Err(refused.error) };
        if let Some(map) = ClusterMap::parse(&Box::pin(conn.cluster_map_here()).await?)? {
            self.take_map(&map)?;
        }
        let again = owner_of(pool)
            .filter(|again| !again.same(&conn))
            .or_else(|| self.inner.routes.lock().unwrap().as_ref().and_then(|r| r.member(&owner)));
        match again {
            Some(again) => Ok(call(again).await?),
            None => Err(refused.error),
        }
    }
}

/// How long `stats` waits for each member of a cluster at most (less when request_timeout is).
const STATS_WAIT: Duration = Duration::from_secs(5);

/// Every member's `stats`, waiting `wait` for each at most, merged as `Client::stats` says.
async fn cluster_stats(members: Vec<(String, Client)>, version: Option<String>, wait: Duration) -> Result<Value> {
    let asks = members.iter().map(|(_, conn)| {
        let conn = conn.clone();
        tokio::spawn(async move { tokio::time::timeout(wait, conn.stats_here()).await })
    });
    let asks: Vec<_> = asks.collect();
    let unreachable = |why: String| Value::Map(vec![(Value::from("unreachable"), Value::from(why))]);
    let mut answers: Vec<(Value, Value)> = Vec::new();
    let mut pools: Vec<(Value, Value)> = Vec::new();
    let mut workers: i64 = 0;
    for ((name, _), ask) in members.iter().zip(asks) {
        let answer = match ask.await {
            Ok(Ok(Ok(answer))) => answer,
            Ok(Ok(Err(e))) => {
                if matches!(e, Error::NotFound(_) | Error::Unauthenticated(_) | Error::PermissionDenied(_)) {
                    return Err(e);
                }
                unreachable(format!("{}: {}", e.code(), e.message()))
            }
            Ok(Err(_)) | Err(_) => unreachable(format!("no answer within {} s", wait.as_secs_f64())),
        };
        workers += wire::field(&answer, "workers").and_then(|w| w.as_i64()).unwrap_or(0);
        for (pool, stats) in wire::field(&answer, "pools").and_then(|p| p.as_map().cloned()).unwrap_or_default() {
            let draining = wire::field(&stats, "draining").and_then(|d| d.as_bool()).unwrap_or(false);
            let mut entry = stats.as_map().cloned().unwrap_or_default();
            entry.retain(|(k, _)| k.as_str() != Some("member"));
            entry.push((Value::from("member"), Value::from(name.as_str())));
            match pools.iter_mut().find(|(p, _)| *p == pool) {
                // The owner's entry wins over a draining one.
                Some(slot) if !draining => slot.1 = Value::Map(entry),
                Some(_) => {}
                None => pools.push((pool, Value::Map(entry))),
            }
        }
        answers.push((Value::from(name.as_str()), answer));
    }
    Ok(Value::Map(vec![
        (Value::from("cluster"), version.map_or(Value::Nil, Value::from)),
        (Value::from("members"), Value::Map(answers)),
        (Value::from("pools"), Value::Map(pools)),
        (Value::from("workers"), Value::from(workers)),
    ]))
}

fn close_state(state: &mut State) {
    state.closed = true;
    for (_, mut p) in state.pending.drain() {
        if let Some(tx) = p.reply.take() {
            let _ = tx.send(Err(unavailable_closed().into()));
        }
    }
    for (_, w) in state.watches.drain() {
        w.settle(WatchEnd::Gone);
    }
}

/// The member a `FAILED_PRECONDITION` says owns the pool instead (its `details`), or None.
fn moved_to(error: &Error, details: &Value) -> Option<String> {
    let Error::FailedPrecondition(_) = error else { return None };
    wire::field(details, "member").and_then(Value::as_str).map(str::to_string)
}

fn ended_of(h: &Header, body: Option<Vec<u8>>) -> Ended {
    Ended {
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
            watch.settle(if header.tag == "outcome" {
                WatchEnd::Outcome(ended_of(&header, body))
            } else {
                WatchEnd::Gone
            });
            return;
        }
    }
    if header.tag == "error" && header.str("code") == "UNAUTHENTICATED" {
        // The broker answers a message with a bad token once, whatever it held: every request sent
        // with this token shares its fate.
        let error = Error::from_code("UNAUTHENTICATED", header.str("message"));
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
        let error = Error::from_code(header.str("code"), header.str("message"));
        let _ = tx.send(Err(Refused { owner: moved_to(&error, header.get("details")), error }));
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
fn sweep(inner: &Inner, state: &mut State, dealer: &Dealer) {
    let now = Instant::now();
    let expired: Vec<i64> =
        state.pending.iter().filter(|(_, p)| p.expires.is_some_and(|t| t <= now)).map(|(r, _)| *r).collect();
    if expired.is_empty() {
        return;
    }
    let error = Error::Unavailable(dealer.silence(&format!(
        "no reply from the broker at {} within {} s",
        inner.address,
        inner.request_timeout.as_secs_f64()
    )));
    for rid in expired {
        fail_request(inner, state, rid, error.clone());
    }
}

/// Waiting cannot help (the link says why): fail every request now, and every new one until a
/// handshake succeeds. Nothing of them can leave later: with `ZMQ_IMMEDIATE` libzmq queued none
/// (no connection completed), and those held here are dropped.
fn give_up(inner: &Inner, state: &mut State, reason: String, held: &mut Vec<Posted>) {
    let error = Error::Unavailable(reason.clone());
    state.unreachable = Some(reason);
    let rids: Vec<i64> = state.pending.keys().copied().collect();
    for rid in rids {
        fail_request(inner, state, rid, error.clone());
    }
    held.clear();
}

/// The task that owns the socket: sends what callers post, hands replies to them.
async fn run(dealer: Dealer, token: Vec<u8>, mut rx: mpsc::UnboundedReceiver<Cmd>, weak: Weak<Inner>) {
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
        let handshakes = dealer.handshakes();
        if handshakes > 0 {
            let mut state = inner.state.lock().unwrap();
            let sent = take_held(&state, &mut held, &mut posted);
            connected(&mut state, handshakes, &mut posted, &sent);
            drop(state);
            held_tried = Instant::now();
            Client { inner: inner.clone() }.ask_rules(); // posts through the channel: taken below
        } else if !held.is_empty() && dealer.is_up() && held_tried.elapsed() >= HELD_RETRY {
            take_held(&inner.state.lock().unwrap(), &mut held, &mut posted);
            held_tried = Instant::now();
        } else if !dealer.is_up() {
            if let Some(reason) = dealer.hopeless() {
                let mut state = inner.state.lock().unwrap();
                if state.unreachable.is_none() {
                    give_up(&inner, &mut state, reason, &mut held);
                }
            }
        }
        while let Some(frames) = dealer.try_recv() {
            let (header, body) = match frames.as_slice() {
                [h] => (h.as_slice(), None),
                [h, b] => (h.as_slice(), Some(b.as_slice())),
                _ => continue,
            };
            let Ok(items) = wire::read(Direction::ClientReply, header, body) else { continue };
            let mut state = inner.state.lock().unwrap();
            for (h, b) in items.into_iter().flatten() {
                take_reply(&inner, &mut state, h, b);
            }
        }
        if std::mem::take(&mut ticked) {
            let mut state = inner.state.lock().unwrap();
            sweep(&inner, &mut state, &dealer);
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
            let unsent = flush(&dealer, &token, std::mem::take(&mut posted));
            hold(&inner, &dealer, &mut held, unsent);
        }
        if dealer.has_input() {
            continue;
        }
        drop(inner);
        let retry_held = (!held.is_empty() && dealer.is_up()).then(|| held_tried + HELD_RETRY);
        tokio::select! {
            _ = dealer.signals.changed() => {}
            cmd = rx.recv() => match cmd {
                Some(Cmd::Send { rid, header, body }) => posted.push((rid, header, body)),
                Some(Cmd::Close) | None => return,
            },
            _ = tick.tick() => ticked = true,
            _ = tokio::time::sleep_until(retry_held.unwrap_or_else(Instant::now).into()), if retry_held.is_some() => {}
        }
    }
}

/// Send posted messages, packed into batches; returns those libzmq would not take (no connection
/// is up, or its send queue is full), in order.
fn flush(dealer: &Dealer, token: &[u8], mut posted: Vec<Posted>) -> Vec<Posted> {
    let items: Vec<(Vec<u8>, Option<Vec<u8>>)> = posted.iter().map(|(_, h, b)| (h.clone(), b.clone())).collect();
    let mut sent = 0;
    for (frames, carried) in wire::pack(&items, BATCH_BYTES) {
        let mut message = Vec::with_capacity(frames.len() + 1);
        message.push(token.to_vec());
        message.extend(frames);
        if !dealer.send(&message) {
            return posted.split_off(sent);
        }
        sent += carried;
    }
    Vec::new()
}

/// Keep messages libzmq would not take, to send with the next connection (or on a retry while one
/// is up). Past as many as a socket would queue the broker has been away long: the requests beyond
/// fail now.
fn hold(inner: &Inner, dealer: &Dealer, held: &mut Vec<Posted>, mut unsent: Vec<Posted>) {
    if unsent.is_empty() {
        return;
    }
    let room = (HIGH_WATER_MARK as usize).saturating_sub(held.len()).min(unsent.len());
    let over = unsent.split_off(room);
    held.extend(unsent);
    if over.is_empty() {
        return;
    }
    let error =
        Error::Unavailable(dealer.silence(&format!("the send queue to the broker at {} is full", inner.address)));
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
