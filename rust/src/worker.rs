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
//! A result over the broker's max_payload_bytes (from `welcome`) is not sent: the task fails with
//! `InvalidArgument` instead, and failure texts are cut to bounded sizes, so one task's output never
//! costs the connection and the other tasks on it.

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant};

use rmpv::Value;
use serde::Serialize;
use tokio::sync::{mpsc, watch};

use crate::address::{self, Addresses};
use crate::error::{Error, Result};
use crate::handler::{self, Failure, Handler, Outcome};
use crate::pool::PoolConfig;
use crate::task::Payload;
use crate::transport::{curve_public_key, Dealer, Options};
use crate::wire::{self, Direction, Header, BATCH_BYTES, NIL_BODY};

const RECONNECT_DELAY_MAX: Duration = Duration::from_secs(32);

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
        let handlers: HashMap<String, Handler> = self.pools.iter().map(|(p, h)| (p.name.clone(), h.clone())).collect();
        let mut stop = self.stop_tx.subscribe();
        let (finished_tx, mut finished) = mpsc::unbounded_channel::<(String, i64, Outcome)>();
        let mut s = Session {
            worker: &self,
            dealer: Dealer::connect(&addresses, &options)?,
            addresses,
            posted: Vec::new(),
            rid: 0,
            registered: false,
            left: false,
            running: 0,
            max_result_bytes: None,
            last_heard: Instant::now(),
            ready_sent: Instant::now(),
            reconnect_delay: self.heartbeat_interval,
        };
        s.send_ready();
        let mut tick = tokio::time::interval(self.heartbeat_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut stopping: Option<Instant> = None;
        let mut ticked = false;
        loop {
            if s.dealer.handshakes() > 0 {
                s.registered = false;
                if stopping.is_none() {
                    s.send_ready();
                }
            } else if let Some(why) = s.dealer.fatal() {
                // The CURVE handshake cannot succeed with any address: waiting serves nothing.
                return Err(Error::Unavailable(why));
            }
            while let Some(frames) = s.dealer.try_recv() {
                s.last_heard = Instant::now();
                let (header, body) = match frames.as_slice() {
                    [h] => (h.as_slice(), None),
                    [h, b] => (h.as_slice(), Some(b.as_slice())),
                    _ => continue,
                };
                let Ok(items) = wire::read(Direction::WorkerCommand, header, body) else { continue };
                for (command, body) in items.into_iter().flatten() {
                    if let Some(error) = s.obey(command, body, &handlers, &finished_tx, stopping.is_some()) {
                        s.flush();
                        return Err(error);
                    }
                }
            }
            while let Ok((id, attempt, outcome)) = finished.try_recv() {
                s.running -= 1;
                s.report(id, attempt, outcome);
            }
            // After what had arrived is taken: a `welcome` or `task` waiting must count first.
            if std::mem::take(&mut ticked) {
                s.on_tick(&options).await?;
            }
            if *stop.borrow() && stopping.is_none() {
                stopping = Some(Instant::now());
                if s.registered {
                    s.post("leave", vec![], None);
                } else {
                    s.left = true;
                }
            }
            if let Some(since) = stopping {
                let waited_enough = since.elapsed() > self.heartbeat_interval * self.liveness;
                if (s.left || waited_enough) && s.running == 0 {
                    s.post("bye", vec![], None);
                    s.flush();
                    // Give libzmq a moment to put the last frames on the wire (linger is 0).
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    return Ok(());
                }
            }
            s.flush();
            if s.dealer.has_input() {
                continue;
            }
            tokio::select! {
                _ = s.dealer.signals.changed() => {}
                Some((id, attempt, outcome)) = finished.recv() => {
                    s.running -= 1;
                    s.report(id, attempt, outcome);
                }
                _ = tick.tick() => ticked = true,
                _ = stop.changed(), if stopping.is_none() => {}
            }
        }
    }
}

/// One run of a worker: its connection and what it knows of the broker.
struct Session<'a> {
    worker: &'a Worker,
    dealer: Dealer,
    /// The broker's worker endpoints: its primary's, then its standbys'.
    addresses: Vec<String>,
    posted: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    rid: i64,
    registered: bool,
    left: bool,
    running: u32,
    max_result_bytes: Option<usize>,
    last_heard: Instant,
    ready_sent: Instant,
    reconnect_delay: Duration,
}

impl Session<'_> {
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
            message.push(self.worker.token.clone());
            message.extend(frames);
            let _ = self.dealer.send(&message);
        }
    }

    fn send_ready(&mut self) {
        self.rid += 1;
        let pools = self.worker.pools.iter().map(|(p, _)| Value::from(p.name.as_str())).collect();
        let settings: Vec<(Value, Value)> = self
            .worker
            .pools
            .iter()
            .map(|(p, _)| (Value::from(p.name.as_str()), Value::Map(p.explicit_settings())))
            .filter(|(_, s)| matches!(s, Value::Map(m) if !m.is_empty()))
            .collect();
        let slots = self.worker.concurrency.saturating_sub(self.running);
        self.ready_sent = Instant::now();
        let fields = vec![
            Value::from(self.rid),
            Value::Array(pools),
            Value::from(slots),
            Value::Map(settings),
            Value::from(self.worker.concurrency),
        ];
        self.post("ready", fields, None);
    }

    /// Act on one command; Some(error) when the broker refused this worker.
    fn obey(
        &mut self,
        command: Header,
        body: Option<Vec<u8>>,
        handlers: &HashMap<String, Handler>,
        finished: &mpsc::UnboundedSender<(String, i64, Outcome)>,
        stopping: bool,
    ) -> Option<Error> {
        match command.tag {
            "task" => {
                let id = command.str("id").to_string();
                let attempt = command.int("attempt");
                let pool = command.str("pool").to_string();
                let payload = Payload::from_msgpack(body.unwrap_or_else(|| NIL_BODY.to_vec()));
                self.running += 1;
                let finished = finished.clone();
                match handlers.get(&pool).cloned() {
                    Some(handler) => {
                        tokio::spawn(async move {
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
                self.registered = true;
                self.max_result_bytes = command.get("max_payload_bytes").as_u64().map(|n| n as usize);
                self.reconnect_delay = self.worker.heartbeat_interval;
            }
            "reregister" => {
                self.registered = false;
                if !stopping {
                    self.send_ready();
                }
            }
            "left" => self.left = true,
            "error" => {
                // A refused registration is a mistake of configuration, and a refused token no longer
                // serves: stop and report it. An error about a message without a rid (a `done` the
                // broker could not take) costs only that message.
                let code = command.str("code");
                if command.rid() != 0 || code == "UNAUTHENTICATED" || code == "PERMISSION_DENIED" {
                    return Some(Error::from_code(code, command.str("message")));
                }
            }
            _ => {} // heartbeat: being heard is all it says
        }
        None
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
    async fn on_tick(&mut self, options: &Options) -> Result<()> {
        let interval = self.worker.heartbeat_interval;
        if self.last_heard.elapsed() > interval * self.worker.liveness {
            self.flush();
            tokio::time::sleep(self.reconnect_delay).await;
            self.reconnect_delay = (self.reconnect_delay * 2).min(RECONNECT_DELAY_MAX);
            self.dealer = Dealer::connect(&self.addresses, options)?;
            self.registered = false;
            self.last_heard = Instant::now();
            self.send_ready();
        } else if self.registered {
            self.post("heartbeat", vec![], None);
        } else if self.ready_sent.elapsed() > interval * self.worker.liveness {
            // No answer for a while: the broker may have come up since, ask again. (Not sooner: a
            // `welcome` and tasks may be on their way, and a second `ready` would count them twice.)
            self.send_ready();
        }
        Ok(())
    }
}
