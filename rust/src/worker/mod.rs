//! [`Worker`]: serves pools for a broker, and [`Stopper`], which stops it gracefully.
//!
//! The worker talks to a broker through a [`Session`] (src/worker/session.rs: credit, heartbeats,
//! reconnecting, registering with a standby that took over). Its first session asks the broker for
//! the cluster map before it registers: a lone broker answers nil and that session serves it; a
//! cluster member answers with the map, and the worker then serves the cluster through a session
//! per member (src/worker/cluster.rs).

mod cluster;
mod session;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;
use tracing::Instrument;

use self::cluster::serve_cluster;
use self::session::{End, Role, Session, Shared};
use crate::address::Addresses;
use crate::channel::{Endpoint, Token};
use crate::error::{Error, Result};
use crate::handler::{self, Handler};
use crate::pool::PoolConfig;
use crate::task::Payload;

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
#[must_use = "a Worker does nothing until run"]
pub struct Worker {
    addresses: Vec<String>,
    token: Token,
    curve: Option<String>,
    concurrency: u32,
    heartbeat_interval: Duration,
    liveness: u32,
    pools: Vec<(PoolConfig, Handler)>,
    stop_tx: watch::Sender<bool>,
    phase: watch::Sender<Phase>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("addresses", &self.addresses)
            .field("token", &self.token)
            .field("curve_server_key", &self.curve)
            .field("concurrency", &self.concurrency)
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("liveness", &self.liveness)
            .field("pools", &self.pools.iter().map(|(p, _)| p).collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// Where a [`Worker`]'s `run` is: what [`Stopper::stop`] waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// `run` has not started: a stop asked now makes it return at once when it does.
    Idle,
    Running,
    /// `run` returned, or its future was dropped.
    Finished,
}

/// Stops a [`Worker`] gracefully: it takes no more tasks, lets the running ones finish and
/// report, then leaves. Cloneable; stopping twice is harmless.
///
/// A stop is never lost: asked before `run` starts (even before a spawned `run` was first
/// polled), `run` returns `Ok(())` at once without connecting.
#[derive(Clone, Debug)]
pub struct Stopper {
    stop: watch::Sender<bool>,
    phase: watch::Receiver<Phase>,
}

impl Stopper {
    /// Ask the worker to stop, and wait until its `run` has returned (at once if it has not
    /// started, or has already returned).
    ///
    /// Cancel-safe: the stop is asked before the first await, so dropping this future only stops
    /// the waiting.
    pub async fn stop(&self) {
        // `send_replace` keeps the value even while no receiver exists (before `run` subscribes);
        // `send` would drop it, and the stop with it.
        self.stop.send_replace(true);
        let mut phase = self.phase.clone();
        let _ = phase.wait_for(|p| *p != Phase::Running).await;
    }
}

/// Marks `run` finished however it ends (returned, or its future dropped).
struct Finishing(watch::Sender<Phase>);

impl Drop for Finishing {
    fn drop(&mut self) {
        self.0.send_replace(Phase::Finished);
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
        let (phase, _) = watch::channel(Phase::Idle);
        Worker {
            addresses: address.into_strings(),
            token: Token::None,
            curve: None,
            concurrency: 4,
            heartbeat_interval: Duration::from_secs(1),
            liveness: 3,
            pools: Vec::new(),
            stop_tx,
            phase,
        }
    }

    /// The token to show the broker (a `worker` or `admin` role's secret).
    pub fn token(mut self, token: impl AsRef<[u8]>) -> Worker {
        self.token = Token::Given(token.as_ref().to_vec());
        self
    }

    /// Read the token from the environment variable `variable` when `run` starts (as
    /// `cronoq-worker --token-env`): `run` fails with [`Error::MissingToken`] naming it if it is not set.
    pub fn token_env(mut self, variable: impl Into<String>) -> Worker {
        self.token = Token::Env(variable.into());
        self
    }

    /// Encrypt with CURVE: the broker's public key (40 Z85 characters or its `NAME.key` file).
    pub fn curve_server_key(mut self, key: impl Into<String>) -> Worker {
        self.curve = Some(key.into());
        self
    }

    /// At most `n` tasks at once over all pools (default 4). `run` fails with `InvalidArgument`
    /// for 0, as [`SchedulerBuilder::build`](crate::SchedulerBuilder::build) does.
    pub fn concurrency(mut self, n: u32) -> Worker {
        self.concurrency = n;
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
    #[must_use]
    pub fn stopper(&self) -> Stopper {
        Stopper { stop: self.stop_tx.clone(), phase: self.phase.subscribe() }
    }

    /// Serve until stopped. Returns the broker's refusal (`NotFound` for an undeclared pool,
    /// `FailedPrecondition` for settings that disagree with its config, `PermissionDenied`, ...)
    /// if it rejects this worker.
    ///
    /// Given a cluster member's address, the worker serves the whole cluster: it reads the map,
    /// registers with each member that owns some of its pools (through a connection of its own,
    /// with a share of the slots) and follows the map as the members report it.
    ///
    /// Cancel-safe in the sense tokio uses: dropping the future closes the connections at once
    /// (running handlers are not awaited, and the broker re-queues their tasks when it misses the
    /// worker), and a [`Stopper::stop`] waiting on it returns.
    ///
    /// # Errors
    ///
    /// `InvalidArgument` (no pool, concurrency 0, a bad address or key), `MissingToken`,
    /// `WrongEndpoint` (the broker's client endpoint), `Connection` (a CURVE handshake that cannot
    /// succeed at any address), and the broker's refusal of the worker, as above.
    pub async fn run(self) -> Result<()> {
        self.phase.send_replace(Phase::Running);
        let _finishing = Finishing(self.phase.clone());
        if *self.stop_tx.borrow() {
            return Ok(()); // stopped before it started
        }
        let span = tracing::info_span!("cronoq.worker", broker = %self.addresses.join(","));
        let result = self.serve().instrument(span.clone()).await;
        match &result {
            Ok(()) => tracing::info!(parent: &span, "the worker stopped"),
            Err(error) => tracing::error!(parent: &span, %error, "the worker cannot serve"),
        }
        result
    }

    async fn serve(self) -> Result<()> {
        if self.pools.is_empty() {
            return Err(Error::InvalidArgument(
                "a Worker needs at least one pool: add one with .pool(config, handler)".into(),
            ));
        }
        if self.concurrency == 0 {
            return Err(Error::InvalidArgument(
                "a Worker's concurrency must be at least 1, got 0: it is how many tasks run at once".into(),
            ));
        }
        let token = self.token.resolve()?;
        let endpoint = Endpoint::worker(&self.addresses, token, self.curve.as_deref()).await?;
        let shared = Arc::new(Shared {
            endpoint: endpoint.clone(),
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
        let first = Session::new(shared.clone(), endpoint, shared.pools.clone(), self.concurrency, Role::Asking)?;
        match first.drive(stop.clone()).await? {
            End::Stopped => Ok(()),
            End::Cluster(map) => serve_cluster(shared, map, stop).await,
        }
    }
}
