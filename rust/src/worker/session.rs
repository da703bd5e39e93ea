//! A worker's [`Session`]: its connection to one broker's worker endpoint (the primary and its
//! standbys), serving some of the worker's pools with some of its slots. A lone broker's worker has
//! one; a cluster's has one per member (src/worker/cluster.rs starts and retargets them).
//!
//! Flow control is by credit (docs/protocol.md, "Flow control and liveness"): `ready` states the
//! free slots, each `task` uses one, each `done` returns one, so the broker never sends more than
//! the session's slots at once. A pool's `fairness` and `max_in_flight`, when set, travel in `ready`
//! as the worker's settings, and the broker refuses the worker (`FailedPrecondition`) when they
//! disagree with its config, as it refuses a Python worker's.
//!
//! Liveness follows the Paranoid Pirate pattern: both sides heartbeat; when the broker has been
//! silent for `liveness` intervals the session drops its socket, waits (doubling, up to 32 s) and
//! registers again. Tasks running meanwhile still report; the broker ignores leases it gave away.
//!
//! Given a broker's primary and standbys, the session connects one socket to all of them
//! (`ZMQ_IMMEDIATE`: messages go only over a completed connection) and registers on every new
//! connection, so it serves a standby the moment that has taken over.
//!
//! The first session of a worker asks its broker for the cluster map before registering
//! ([`Role::Asking`]): a lone broker answers nil (an older one refuses the question) and the session
//! serves it; a member's map ends the session for the worker to serve the cluster. A member's
//! session asks for the map every few heartbeats and hands what it hears to the worker.
//!
//! A result over the broker's max_payload_bytes (from `welcome`) is not sent: the task fails with
//! `InvalidArgument` instead, and failure texts are cut to bounded sizes, so one task's output never
//! costs the connection and the other tasks on it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmpv::Value;
use tokio::sync::{mpsc, watch, Semaphore};

use crate::channel::{Channel, Endpoint, Outgoing};
use crate::clustermap::ClusterMap;
use crate::error::{Error, Result};
use crate::handler::{self, Failure, Handler, Outcome};
use crate::task::Payload;
use crate::wire::{self, Header, NIL_BODY};

const RECONNECT_DELAY_MAX: Duration = Duration::from_secs(32);
/// A member session asks its member for the cluster map every this many heartbeats, to follow
/// reloads (as the Python worker does).
const MAP_POLL_BEATS: u32 = 5;

/// What every session of one worker shares.
pub(super) struct Shared {
    /// The endpoint the worker was given (a member's is the same at the member's addresses).
    pub endpoint: Endpoint,
    pub heartbeat_interval: Duration,
    pub liveness: u32,
    pub handlers: HashMap<String, Handler>,
    /// Each pool's settings set explicitly (only pools with some).
    pub settings: HashMap<String, Vec<(Value, Value)>>,
    /// The worker's pools, in the order given.
    pub pools: Vec<String>,
    pub concurrency: u32,
}

/// What a connection does besides serving.
pub(super) enum Role {
    /// Ask the broker for the cluster map before registering: nil makes this a lone broker's worker.
    Asking,
    /// Serve a lone broker.
    Alone,
    /// Serve one member of a cluster: hand the maps it hears to the worker, take its pools and slots
    /// from it, and run at most the worker's `concurrency` handlers over all members (the gate).
    Member { maps: mpsc::UnboundedSender<ClusterMap>, target: watch::Receiver<Target>, gate: Arc<Semaphore> },
}

/// A member connection's pools and slots.
pub(super) type Target = (Vec<String>, u32);

/// How a connection's run ended.
pub(super) enum End {
    Stopped,
    /// The broker is a cluster member: its map.
    Cluster(ClusterMap),
}

/// One connection of a worker: to a lone broker, or to one member of a cluster.
pub(super) struct Session {
    shared: Arc<Shared>,
    role: Role,
    /// The broker's worker endpoints (its primary's, then its standbys'), to reconnect to.
    endpoint: Endpoint,
    channel: Channel,
    /// The pools served here, and the slots this connection offers.
    pools: Vec<String>,
    concurrency: u32,
    posted: Vec<Outgoing>,
    rid: i64,
    /// The rids of this connection's `cluster` questions and `ready`s not answered yet: each leaves with its
    /// answer, and all with the connection, so a long-lived worker's asking every few beats leaves nothing.
    map_rids: HashSet<i64>,
    ready_rids: HashSet<i64>,
    registered: bool,
    left: bool,
    running: u32,
    beats: u32,
    max_result_bytes: Option<usize>,
    last_heard: Instant,
    ready_sent: Instant,
    reconnect_delay: Duration,
}

/// What one command from the broker asks of the connection's loop.
enum Next {
    Serve,
    Stop(Error),
    Cluster(ClusterMap),
}

impl Session {
    /// A session with `endpoint` serving `pools` with `concurrency` slots; it connects at once and
    /// registers when driven.
    pub fn new(
        shared: Arc<Shared>,
        endpoint: Endpoint,
        pools: Vec<String>,
        concurrency: u32,
        role: Role,
    ) -> Result<Session> {
        let channel = endpoint.open()?;
        let interval = shared.heartbeat_interval;
        Ok(Session {
            shared,
            role,
            endpoint,
            channel,
            pools,
            concurrency,
            posted: Vec::new(),
            rid: 0,
            map_rids: HashSet::new(),
            ready_rids: HashSet::new(),
            registered: false,
            left: false,
            running: 0,
            beats: 0,
            max_result_bytes: None,
            last_heard: Instant::now(),
            ready_sent: Instant::now(),
            reconnect_delay: interval,
        })
    }

    /// Serve until `stop` (gracefully: running tasks finish and report), a refusal (`Err`), or the
    /// broker's answer that it is a cluster member (`End::Cluster`, for a connection that asked).
    pub async fn drive(mut self, mut stop: watch::Receiver<bool>) -> Result<End> {
        let (finished_tx, mut finished) = mpsc::unbounded_channel::<(String, i64, Outcome)>();
        self.register();
        let mut tick = tokio::time::interval(self.shared.heartbeat_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut stopping: Option<Instant> = None;
        let mut ticked = false;
        loop {
            if self.channel.dealer.handshakes() > 0 {
                tracing::info!(broker = %self.endpoint.describe(), "connected: registering");
                self.registered = false;
                if stopping.is_none() {
                    self.register();
                }
            } else if let Some(why) = self.channel.dealer.fatal() {
                // The CURVE handshake cannot succeed with any address: waiting serves nothing.
                return Err(Error::connection(self.endpoint.describe(), why));
            }
            while let Some(commands) = self.channel.recv() {
                self.last_heard = Instant::now();
                for (command, body) in commands {
                    match self.obey(command, body, &finished_tx, stopping.is_some()) {
                        Next::Serve => {}
                        Next::Stop(error) => {
                            self.flush();
                            return Err(error);
                        }
                        Next::Cluster(map) => return Ok(End::Cluster(map)),
                    }
                }
            }
            while let Ok((id, attempt, outcome)) = finished.try_recv() {
                self.running -= 1;
                self.report(id, attempt, outcome);
            }
            // After what had arrived is taken: a `welcome` or `task` waiting must count first.
            if std::mem::take(&mut ticked) {
                self.on_tick().await?;
            }
            if *stop.borrow() && stopping.is_none() {
                stopping = Some(Instant::now());
                if self.registered {
                    self.post("leave", vec![], None);
                } else {
                    self.left = true;
                }
            }
            if let Some(since) = stopping {
                let waited_enough = since.elapsed() > self.shared.heartbeat_interval * self.shared.liveness;
                if (self.left || waited_enough) && self.running == 0 {
                    self.post("bye", vec![], None);
                    self.flush();
                    // Give libzmq a moment to put the last frames on the wire (linger is 0).
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    return Ok(End::Stopped);
                }
            }
            self.flush();
            if self.channel.dealer.has_input() {
                continue;
            }
            let retargeted = async {
                match &mut self.role {
                    Role::Member { target, .. } => target.changed().await.is_ok(),
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = self.channel.dealer.signals.changed() => {}
                Some((id, attempt, outcome)) = finished.recv() => {
                    self.running -= 1;
                    self.report(id, attempt, outcome);
                }
                _ = tick.tick() => ticked = true,
                _ = stop.changed(), if stopping.is_none() => {}
                true = retargeted, if stopping.is_none() => self.retarget(),
            }
        }
    }

    fn post(&mut self, tag: &str, fields: Vec<Value>, body: Option<Vec<u8>>) {
        self.posted.push((wire::encode_header(tag, fields), body));
    }

    /// Send what this turn produced, as one batch where it fits.
    fn flush(&mut self) {
        if self.posted.is_empty() {
            return;
        }
        // What libzmq does not take (no connection is up) is not kept: the worker registers
        // afresh on every new connection.
        self.channel.send(&std::mem::take(&mut self.posted));
    }

    fn next_rid(&mut self) -> i64 {
        self.rid += 1;
        self.rid
    }

    /// Register; first, on a connection that must find out, ask whether the broker is a cluster member.
    fn register(&mut self) {
        if matches!(self.role, Role::Asking) {
            self.ask_map();
        } else {
            self.send_ready();
        }
    }

    fn ask_map(&mut self) {
        let rid = self.next_rid();
        self.map_rids.insert(rid);
        self.ready_sent = Instant::now();
        self.post("cluster", vec![Value::from(rid)], None);
    }

    fn send_ready(&mut self) {
        let rid = self.next_rid();
        self.ready_rids.insert(rid);
        let pools = self.pools.iter().map(|p| Value::from(p.as_str())).collect();
        let settings: Vec<(Value, Value)> = self
            .pools
            .iter()
            .filter_map(|p| self.shared.settings.get(p).map(|s| (Value::from(p.as_str()), Value::Map(s.clone()))))
            .collect();
        let slots = self.concurrency.saturating_sub(self.running);
        self.ready_sent = Instant::now();
        let fields = vec![
            Value::from(rid),
            Value::Array(pools),
            Value::from(slots),
            Value::Map(settings),
            Value::from(self.concurrency.max(self.running)),
        ];
        self.post("ready", fields, None);
    }

    /// The worker gave this member connection other pools or another share: register again.
    fn retarget(&mut self) {
        let Role::Member { target, .. } = &mut self.role else { return };
        let (pools, share) = target.borrow_and_update().clone();
        if pools == self.pools && share == self.concurrency {
            return;
        }
        self.pools = pools;
        self.concurrency = share;
        self.send_ready();
    }

    /// Act on one command.
    fn obey(
        &mut self,
        command: Header,
        body: Option<Vec<u8>>,
        finished: &mpsc::UnboundedSender<(String, i64, Outcome)>,
        stopping: bool,
    ) -> Next {
        match command.tag {
            "task" => {
                let id = command.str("id").to_string();
                let attempt = command.int("attempt");
                let pool = command.str("pool").to_string();
                let payload = Payload::from_msgpack(body.unwrap_or_else(|| NIL_BODY.to_vec()));
                self.running += 1;
                let finished = finished.clone();
                let gate = match &self.role {
                    Role::Member { gate, .. } => Some(gate.clone()),
                    _ => None,
                };
                match self.shared.handlers.get(&pool).cloned() {
                    Some(handler) => {
                        tokio::spawn(async move {
                            // In a cluster, at most `concurrency` handlers over every member at once.
                            let _permit = match gate {
                                Some(gate) => gate.acquire_owned().await.ok(),
                                None => None,
                            };
                            let outcome = handler::run(handler, payload).await;
                            if let Err(failure) = &outcome {
                                tracing::warn!(task = %id, pool, attempt, r#type = %failure.r#type,
                                    message = %failure.message, "a handler failed");
                            }
                            let _ = finished.send((id, attempt, outcome));
                        });
                    }
                    None => {
                        let failure = Failure {
                            r#type: "LookupError".into(),
                            message: format!("this worker does not serve pool {pool:?}"),
                            traceback: String::new(),
                        };
                        let _ = finished.send((id, attempt, Err(failure)));
                    }
                }
            }
            "welcome" => {
                self.ready_rids.remove(&command.rid());
                self.registered = true;
                self.max_result_bytes = command.get("max_payload_bytes").as_u64().map(|n| n as usize);
                self.reconnect_delay = self.shared.heartbeat_interval;
            }
            "reregister" => {
                self.registered = false;
                if !stopping {
                    self.send_ready();
                }
            }
            "left" => self.left = true,
            "ok" if self.map_rids.remove(&command.rid()) => {
                return self.take_map(ClusterMap::parse(command.get("value")).ok().flatten(), stopping);
            }
            "error" if self.map_rids.remove(&command.rid()) => {
                // A broker that does not know `cluster` (an older one) is a lone broker.
                return self.take_map(None, stopping);
            }
            "error" => {
                let code = command.str("code");
                let moved = code == "FAILED_PRECONDITION" && wire::field(command.get("details"), "member").is_some();
                if self.ready_rids.remove(&command.rid()) && moved && matches!(self.role, Role::Member { .. }) {
                    // A pool moved to another member between the map this connection had and its
                    // `ready`: read the map again (the worker then moves the pool) rather than stop.
                    self.ask_map();
                    return Next::Serve;
                }
                // A refused registration is a mistake of configuration, and a refused token no longer
                // serves: stop and report it. An error about a message without a rid (a `done` the
                // broker could not take) costs only that message.
                let message = command.str("message");
                if command.rid() == 0 && code == "INVALID_ARGUMENT" && message.contains("endpoint") {
                    // The broker could not read a message at all and names its other endpoint:
                    // this is its client endpoint. No retry can help.
                    let error =
                        Error::WrongEndpoint { address: self.endpoint.describe(), message: message.to_string() };
                    tracing::error!(%error, "the broker refused this worker");
                    return Next::Stop(error);
                }
                if command.rid() != 0 || code == "UNAUTHENTICATED" || code == "PERMISSION_DENIED" {
                    let error = Error::from_code(code, crate::error::for_rust(message));
                    tracing::error!(%error, "the broker refused this worker");
                    return Next::Stop(error);
                }
                tracing::warn!(code, message, "the broker refused a message of this worker");
            }
            _ => {} // heartbeat: being heard is all it says
        }
        Next::Serve
    }

    /// The broker's answer to `cluster`: nil (or a refusal) for a lone broker.
    fn take_map(&mut self, map: Option<ClusterMap>, stopping: bool) -> Next {
        match (&self.role, map) {
            (Role::Asking, Some(map)) => return Next::Cluster(map),
            (Role::Asking, None) => {
                self.role = Role::Alone;
                if !stopping {
                    self.send_ready();
                }
            }
            (Role::Member { maps, .. }, Some(map)) => {
                let _ = maps.send(map);
            }
            _ => {}
        }
        Next::Serve
    }

    /// Report a finished lease with `done`.
    fn report(&mut self, id: String, attempt: i64, outcome: Outcome) {
        let failure = match outcome {
            Ok(result) => match self.max_result_bytes {
                Some(limit) if result.len() > limit => Failure {
                    r#type: "InvalidArgument".into(),
                    message: format!(
                        "the result is {} bytes as msgpack, over the broker's max_payload_bytes = {limit}; return less, \
                         or store the data elsewhere and return a reference to it",
                        result.len()
                    ),
                    traceback: String::new(),
                },
                _ => {
                    self.post("done", vec![Value::from(id), Value::from(attempt), Value::Boolean(true), "".into(), "".into(), "".into()], Some(result));
                    return;
                }
            },
            Err(failure) => failure,
        };
        let fields = vec![
            Value::from(id),
            Value::from(attempt),
            Value::Boolean(false),
            Value::from(wire::clip(&failure.r#type, wire::MAX_ERROR_TYPE_BYTES)),
            Value::from(wire::clip(&failure.message, wire::MAX_ERROR_MESSAGE_BYTES)),
            Value::from(wire::clip(&failure.traceback, wire::MAX_TRACEBACK_BYTES)),
        ];
        self.post("done", fields, None);
    }

    /// One heartbeat period: beat, or reconnect when the broker has been silent too long.
    async fn on_tick(&mut self) -> Result<()> {
        let interval = self.shared.heartbeat_interval;
        let liveness = self.shared.liveness;
        if self.last_heard.elapsed() > interval * liveness {
            self.flush();
            tokio::time::sleep(self.reconnect_delay).await;
            self.reconnect_delay = (self.reconnect_delay * 2).min(RECONNECT_DELAY_MAX);
            self.channel = self.endpoint.open()?;
            self.map_rids.clear(); // the old connection's questions are answered on it or not at all
            self.ready_rids.clear();
            self.registered = false;
            self.last_heard = Instant::now();
            self.register();
        } else if self.registered {
            self.post("heartbeat", vec![], None);
            self.beats += 1;
            if matches!(self.role, Role::Member { .. }) && self.beats % MAP_POLL_BEATS == 0 {
                self.ask_map(); // follow the cluster's map: a reload may have moved a pool
            }
        } else if self.ready_sent.elapsed() > interval * liveness {
            // No answer for a while: the broker may have come up since, ask again. (Not sooner: a
            // `welcome` and tasks may be on their way, and a second `ready` would count them twice.)
            self.register();
        }
        Ok(())
    }
}
