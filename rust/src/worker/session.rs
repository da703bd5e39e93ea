//! [`Worker`]: serves pools for a broker over one DEALER socket to its worker endpoint.
//!
//! Flow control is by credit (docs/protocol.md, "Flow control and liveness"): `ready` states the
//! free slots, each `task` uses one, each `done` returns one, so the broker never sends more than
//! `concurrency` tasks at once. A pool's `fairness` and `max_in_flight`, when set, travel in `ready`
//! as the worker's settings, and the broker refuses the worker (`FailedPrecondition`) when they
//! disagree with its config, as it refuses a Python worker's.
//!
//! Liveness follows the Paranoid Pirate pattern: both sides heartbeat; when the broker has been
//! silent for `liveness` intervals the worker drops its socket, waits (doubling, up to 32 s) and
//! registers again. Tasks running meanwhile still report; the broker ignores leases it gave away.
//!
//! Given a broker's primary and standbys, the worker connects one socket to all of them
//! (`ZMQ_IMMEDIATE`: messages go only over a completed connection) and registers on every new
//! connection, so it serves a standby the moment that has taken over.
//!
//! Before registering, the worker asks its broker for the cluster map (docs/protocol.md,
//! "Clusters"). A lone broker answers nil (an older one refuses the question): the worker registers
//! as always. A member answers with the map: the worker then serves each member that owns some of
//! its pools through a connection of its own, with a share of the slots (src/cluster.rs), and
//! follows the maps those connections hear: a pool a reload moved is served on its old member until
//! that has drained it, and on its new one from then on.
//!
//! A result over the broker's max_payload_bytes (from `welcome`) is not sent: the task fails with
//! `InvalidArgument` instead, and failure texts are cut to bounded sizes, so one task's output never
//! costs the connection and the other tasks on it.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmpv::Value;
use serde::Serialize;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinSet;

use crate::address::{self, Addresses};
use crate::cluster::{split_slots, wanted_pools, ClusterMap};
use crate::error::{Error, Result};
use crate::handler::{self, Failure, Handler, Outcome};
use crate::pool::PoolConfig;
use crate::task::Payload;
use crate::transport::{curve_public_key, Dealer, Options};
use crate::wire::{self, Direction, Header, BATCH_BYTES, NIL_BODY};

const RECONNECT_DELAY_MAX: Duration = Duration::from_secs(32);
/// A member connection asks its member for the cluster map every this many heartbeats, to follow
/// reloads (as the Python worker does).
const MAP_POLL_BEATS: u32 = 5;

/// Serves the tasks of its pools that the broker at an address hands it, `concurrency` at a time.
///
/// ```no_run
/// # async fn demo() -> cronoq::Result<()> {
/// use cronoq::{Payload, PoolConfig, Worker};
/// let worker = Worker::new("tcp://127.0.0.1:5556")
///     .concurrency(8)
///     .pool(PoolConfig::new("llm"), |payload: Payload| async move {
///         let prompt: String = payload.decode()?;
///         Ok::<_, cronoq::Error>(prompt.to_uppercase())
///     });
/// let stopper = worker.stopper();
/// tokio::spawn(async move { tokio::time::sleep(std::time::Duration::from_secs(3600)).await; stopper.stop().await });
/// worker.run().await?; // until stopped: running tasks finish first
/// # Ok(()) }
/// ```
pub struct Worker {
    addresses: Vec<String>,
    token: Vec<u8>,
    curve: Option<String>,
    concurrency: u32,
    heartbeat_interval: Duration,
    liveness: u32,
    pools: Vec<(PoolConfig, Handler)>,
    stop_tx: watch::Sender<bool>,
    done_rx: watch::Receiver<bool>,
    done_tx: watch::Sender<bool>,
}

/// Stops a running [`Worker`] gracefully: it takes no more tasks, lets the running ones finish and
/// report, then leaves. Cloneable.
#[derive(Clone)]
pub struct Stopper {
    stop: watch::Sender<bool>,
    done: watch::Receiver<bool>,
}

impl Stopper {
    /// Ask the worker to stop, and wait until its `run` has returned.
    pub async fn stop(&self) {
        let _ = self.stop.send(true);
        let mut done = self.done.clone();
        let _ = done.wait_for(|d| *d).await;
    }
}

impl Worker {
    /// A worker for the broker's worker endpoint at `address` (4 slots, no pool yet).
    ///
    /// `address` may list the worker endpoints of a broker's primary and its standbys (a list, or
    /// one string with commas): the worker serves whichever serves, and registers with a standby
    /// the moment it has taken over. `run` fails with `InvalidArgument` when none is given.
    pub fn new(address: impl Addresses) -> Worker {
        let (stop_tx, _) = watch::channel(false);
        let (done_tx, done_rx) = watch::channel(false);
        Worker {
            addresses: address.into_strings(),
            token: Vec::new(),
            curve: None,
            concurrency: 4,
            heartbeat_interval: Duration::from_secs(1),
            liveness: 3,
            pools: Vec::new(),
            stop_tx,
            done_rx,
            done_tx,
        }
    }

    /// The token to show the broker (a `worker` or `admin` role's secret).
    pub fn token(mut self, token: impl AsRef<[u8]>) -> Worker {
        self.token = token.as_ref().to_vec();
        self
    }

    /// Encrypt with CURVE: the broker's public key (40 Z85 characters or its `NAME.key` file).
    pub fn curve_server_key(mut self, key: impl Into<String>) -> Worker {
        self.curve = Some(key.into());
        self
    }

    /// At most `n` tasks at once over all pools (default 4; 0 is taken as 1).
    pub fn concurrency(mut self, n: u32) -> Worker {
        self.concurrency = n.max(1);
        self
    }

    /// Heartbeat every `interval` (default 1 s); the broker is taken as lost after `liveness`
    /// silent intervals (default 3).
    pub fn heartbeat(mut self, interval: Duration, liveness: u32) -> Worker {
        self.heartbeat_interval = interval.max(Duration::from_millis(10));
        self.liveness = liveness.max(1);
        self
    }

    /// Serve `pool` with `handler`: an async function of the task's [`Payload`] returning its value
    /// (any `Serialize`) or an error (any `Display + Debug`, which the client sees as
    /// `TaskFailed { type, message, traceback }`).
    pub fn pool<F, Fut, T, E>(mut self, pool: PoolConfig, handler: F) -> Worker
    where
        F: Fn(Payload) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<T, E>> + Send + 'static,
        T: Serialize + 'static,
        E: std::fmt::Display + std::fmt::Debug + 'static,
    {
        self.pools.retain(|(p, _)| p.name != pool.name);
        self.pools.push((pool, handler::handler(handler)));
        self
    }

    /// A handle that stops this worker gracefully.
    pub fn stopper(&self) -> Stopper {
        Stopper { stop: self.stop_tx.clone(), done: self.done_rx.clone() }
    }

    /// Serve until stopped. Returns the broker's refusal (`NotFound` for an undeclared pool,
    /// `FailedPrecondition` for settings that disagree with its config, `PermissionDenied`, ...)
    /// if it rejects this worker.
    ///
    /// Given a cluster member's address, the worker serves the whole cluster: it reads the map,
    /// registers with each member that owns some of its pools (through a connection of its own,
    /// with a share of the slots) and follows the map as the members report it.
    pub async fn run(self) -> Result<()> {
        let done = self.done_tx.clone();
        let result = self.serve().await;
        let _ = done.send(true);
        result
    }

    async fn serve(self) -> Result<()> {
        if self.pools.is_empty() {
            return Err(Error::InvalidArgument(
                "a Worker needs at least one pool: add one with .pool(config, handler)".into(),
            ));
        }
        let addresses = address::parse(&self.addresses, "broker address")?;
        let options = Options {
            curve_server_key: self.curve.as_deref().map(curve_public_key).transpose()?,
            // Handshakes: register on every new connection (a restarted broker, or a standby that
            // took over, does not know this worker; a `ready` sent while none was up was dropped).
            monitor: true,
            heartbeat: None,
        };
        let shared = Arc::new(Shared {
            token: self.token.clone(),
            options,
            heartbeat_interval: self.heartbeat_interval,
            liveness: self.liveness,
            handlers: self.pools.iter().map(|(p, h)| (p.name.clone(), h.clone())).collect(),
            settings: self
                .pools
                .iter()
                .map(|(p, _)| (p.name.clone(), p.explicit_settings()))
                .filter(|(_, s)| !s.is_empty())
                .collect(),
            pools: self.pools.iter().map(|(p, _)| p.name.clone()).collect(),
            concurrency: self.concurrency,
        });
        let stop = self.stop_tx.subscribe();
        // Ask first whether the broker is a member of a cluster (a lone broker answers nil).
        let first = Session::new(shared.clone(), addresses, shared.pools.clone(), self.concurrency, Role::Asking)?;
        match first.drive(stop.clone()).await? {
            End::Stopped => Ok(()),
            End::Cluster(map) => serve_cluster(shared, map, stop).await,
        }
    }
}

/// What every connection of one worker shares.
struct Shared {
    token: Vec<u8>,
    options: Options,
    heartbeat_interval: Duration,
    liveness: u32,
    handlers: HashMap<String, Handler>,
    /// Each pool's settings set explicitly (only pools with some).
    settings: HashMap<String, Vec<(Value, Value)>>,
    /// The worker's pools, in the order given.
    pools: Vec<String>,
    concurrency: u32,
}

/// What a connection does besides serving.
enum Role {
    /// Ask the broker for the cluster map before registering: nil makes this a lone broker's worker.
    Asking,
    /// Serve a lone broker.
    Alone,
    /// Serve one member of a cluster: hand the maps it hears to the worker, take its pools and slots
    /// from it, and run at most the worker's `concurrency` handlers over all members (the gate).
    Member { maps: mpsc::UnboundedSender<ClusterMap>, target: watch::Receiver<Target>, gate: Arc<Semaphore> },
}

/// A member connection's pools and slots.
type Target = (Vec<String>, u32);

/// How a connection's run ended.
enum End {
    Stopped,
    /// The broker is a cluster member: its map.
    Cluster(ClusterMap),
}

/// A member connection, as the worker of a cluster keeps it.
struct MemberRun {
    /// The pools and slots the connection serves: its current target.
    target: watch::Sender<Target>,
    stop: watch::Sender<bool>,
}

/// Serve a cluster from its first map: a connection per member that owns (or still drains) some of
/// the worker's pools, each with its share of the slots, following the maps they report.
async fn serve_cluster(shared: Arc<Shared>, first: ClusterMap, mut stop: watch::Receiver<bool>) -> Result<()> {
    let (maps_tx, mut maps) = mpsc::unbounded_channel();
    let mut c = ClusterWork {
        shared: shared.clone(),
        maps_tx,
        gate: Arc::new(Semaphore::new(shared.concurrency as usize)),
        members: HashMap::new(),
        draining: HashMap::new(),
        runs: JoinSet::new(),
    };
    let mut failure: Option<Error> = c.follow(&first).err();
    while failure.is_none() && !*stop.borrow() {
        tokio::select! {
            Some(map) = maps.recv() => failure = c.follow(&map).err(),
            Some(ended) = c.runs.join_next() => {
                // A member connection ends by itself only on a refusal, which stops the whole worker
                // as it would stop it alone; one left because it serves nothing more ends Ok.
                match ended {
                    Ok((_, Ok(_))) => {}
                    Ok((_, Err(e))) => failure = Some(e),
                    Err(e) => failure = Some(Error::Unavailable(format!("a member connection failed: {e}"))),
                }
            }
            _ = stop.changed() => {}
        }
    }
    for run in c.members.values() {
        let _ = run.stop.send(true);
    }
    while let Some(ended) = c.runs.join_next().await {
        if let Ok((_, Err(e))) = ended {
            failure.get_or_insert(e);
        }
    }
    failure.map_or(Ok(()), Err)
}

struct ClusterWork {
    shared: Arc<Shared>,
    maps_tx: mpsc::UnboundedSender<ClusterMap>,
    gate: Arc<Semaphore>,
    members: HashMap<String, MemberRun>,
    /// What each member last said it drains (only a member knows its own).
    draining: HashMap<String, Vec<String>>,
    runs: JoinSet<(String, Result<End>)>,
}

impl ClusterWork {
    /// Serve `map`: start, retarget or leave member connections so that each member that owns (or
    /// still drains) some of the worker's pools serves them with its share of the slots.
    fn follow(&mut self, map: &ClusterMap) -> Result<()> {
        if let Some(name) = &map.member {
            self.draining.insert(name.clone(), map.draining.clone());
        }
        let wanted = wanted_pools(map, &self.shared.pools, &self.draining);
        let owned: Vec<(String, usize)> = wanted.iter().map(|(n, owned, _)| (n.clone(), owned.len())).collect();
        let shares = match split_slots(self.shared.concurrency, &owned) {
            Ok(shares) => shares,
            Err(e) if self.members.is_empty() => return Err(e),
            // Already serving: one slot each (the gate still holds handlers to `concurrency`).
            Err(_) => owned.iter().map(|(n, _)| (n.clone(), 1)).collect(),
        };
        for (name, owned, leftover) in &wanted {
            let existing = self.members.get(name);
            // Only a member knows which pools it still drains: another's map may add pools to its
            // connection, never take them away.
            let kept: Vec<String> = match existing {
                Some(run) if map.member.as_deref() != Some(name) => run.target.borrow().0.clone(),
                _ => Vec::new(),
            };
            let pools: Vec<String> = self
                .shared
                .pools
                .iter()
                .filter(|p| owned.contains(p) || leftover.contains(p) || kept.contains(p))
                .cloned()
                .collect();
            let share = shares[name]; // `owned` lists every member of `wanted`
            match self.members.get(name) {
                Some(run) => {
                    let target = (pools, share);
                    run.target.send_if_modified(|t| {
                        let changed = *t != target;
                        *t = target;
                        changed
                    });
                }
                None => {
                    let Some(member) = map.members.iter().find(|m| &m.name == name) else { continue };
                    if member.workers.is_empty() {
                        continue;
                    }
                    self.start(name, &member.workers, pools, share)?;
                }
            }
        }
        let leaving: Vec<String> = self
            .members
            .keys()
            .filter(|n| map.member.as_deref() == Some(n.as_str()) && !wanted.iter().any(|(w, _, _)| w == *n))
            .cloned()
            .collect();
        for name in leaving {
            // The member no longer owns or drains any pool of this worker: leave it.
            if let Some(run) = self.members.remove(&name) {
                let _ = run.stop.send(true);
            }
        }
        Ok(())
    }

    fn start(&mut self, name: &str, workers: &[String], pools: Vec<String>, share: u32) -> Result<()> {
        let addresses = address::parse(workers, "cluster member worker address")?;
        let (target_tx, target) = watch::channel((pools.clone(), share));
        let (stop_tx, stop) = watch::channel(false);
        let role = Role::Member { maps: self.maps_tx.clone(), target, gate: self.gate.clone() };
        let session = Session::new(self.shared.clone(), addresses, pools, share, role)?;
        let member = name.to_string();
        self.runs.spawn(async move { (member, session.drive(stop).await) });
        self.members.insert(name.to_string(), MemberRun { target: target_tx, stop: stop_tx });
        Ok(())
    }
}

/// One connection of a worker: to a lone broker, or to one member of a cluster.
struct Session {
    shared: Arc<Shared>,
    role: Role,
    dealer: Dealer,
    /// The broker's worker endpoints: its primary's, then its standbys'.
    addresses: Vec<String>,
    /// The pools served here, and the slots this connection offers.
    pools: Vec<String>,
    concurrency: u32,
    posted: Vec<(Vec<u8>, Option<Vec<u8>>)>,
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
    fn new(
        shared: Arc<Shared>,
        addresses: Vec<String>,
        pools: Vec<String>,
        concurrency: u32,
        role: Role,
    ) -> Result<Session> {
        let dealer = Dealer::connect(&addresses, &shared.options)?;
        let interval = shared.heartbeat_interval;
        Ok(Session {
            shared,
            role,
            dealer,
            addresses,
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
    async fn drive(mut self, mut stop: watch::Receiver<bool>) -> Result<End> {
        let (finished_tx, mut finished) = mpsc::unbounded_channel::<(String, i64, Outcome)>();
        self.register();
        let mut tick = tokio::time::interval(self.shared.heartbeat_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut stopping: Option<Instant> = None;
        let mut ticked = false;
        loop {
            if self.dealer.handshakes() > 0 {
                self.registered = false;
                if stopping.is_none() {
                    self.register();
                }
            } else if let Some(why) = self.dealer.fatal() {
                // The CURVE handshake cannot succeed with any address: waiting serves nothing.
                return Err(Error::Unavailable(why));
            }
            while let Some(frames) = self.dealer.try_recv() {
                self.last_heard = Instant::now();
                let (header, body) = match frames.as_slice() {
                    [h] => (h.as_slice(), None),
                    [h, b] => (h.as_slice(), Some(b.as_slice())),
                    _ => continue,
                };
                let Ok(items) = wire::read(Direction::WorkerCommand, header, body) else { continue };
                for (command, body) in items.into_iter().flatten() {
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
            if self.dealer.has_input() {
                continue;
            }
            let retargeted = async {
                match &mut self.role {
                    Role::Member { target, .. } => target.changed().await.is_ok(),
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = self.dealer.signals.changed() => {}
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
        let items = std::mem::take(&mut self.posted);
        for (frames, _) in wire::pack(&items, BATCH_BYTES) {
            let mut message = Vec::with_capacity(frames.len() + 1);
            message.push(self.shared.token.clone());
            message.extend(frames);
            let _ = self.dealer.send(&message);
        }
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
                if command.rid() != 0 || code == "UNAUTHENTICATED" || code == "PERMISSION_DENIED" {
                    return Next::Stop(Error::from_code(code, command.str("message")));
                }
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
            self.dealer = Dealer::connect(&self.addresses, &self.shared.options)?;
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
