//! [`connect`] and [`Client`]: what a program that submits tasks holds.
//!
//! A client is one [`Connection`] to the broker it was given (its primary and standbys:
//! src/client/connection.rs) and, unless `.routing(false)`, a [`Router`] over the cluster that
//! broker may be a member of (src/client/cluster.rs). Requests about a pool go to the pool's owner,
//! requests about a task to the member its id names; against a lone broker both are the one
//! connection, as they always were.

mod cluster;
mod connection;

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use self::cluster::Router;
use self::connection::Connection;
use crate::address::Addresses;
use crate::answers::{Explanation, TaskInfo};
use crate::channel::{Endpoint, Token};
use crate::clustermap::ClusterMap;
use crate::error::Result;
use crate::handle::{call_timed_out, TaskHandle};
use crate::stats::Stats;
use crate::task::{Payload, Task};

/// How long a request waits for its reply before failing with `Error::Connection` (as the Python client's `Unavailable`).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The broker address the Python client defaults to.
pub const DEFAULT_CLIENT_ADDRESS: &str = "tcp://127.0.0.1:5555";
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
        token: Token::None,
        curve: None,
        request_timeout: DEFAULT_REQUEST_TIMEOUT,
        routing: true,
        lazy: false,
    }
}

/// Options of a connection to a broker; `.await` it for a [`Client`].
#[derive(Debug, Clone)]
#[must_use = "a Connect does nothing until awaited"]
pub struct Connect {
    addresses: Vec<String>,
    token: Token,
    curve: Option<String>,
    request_timeout: Duration,
    routing: bool,
    lazy: bool,
}

impl Connect {
    /// The token to show the broker (its secret's bytes); none for an open broker.
    pub fn token(mut self, token: impl AsRef<[u8]>) -> Connect {
        self.token = Token::Given(token.as_ref().to_vec());
        self
    }

    /// Read the token from the environment variable `variable` when awaited (as the `cronoq`
    /// commands' `--token-env`): [`Error::MissingToken`](crate::Error::MissingToken) naming it if it is not set.
    pub fn token_env(mut self, variable: impl Into<String>) -> Connect {
        self.token = Token::Env(variable.into());
        self
    }

    /// Return at once, without asking the broker anything (`false`, the default: awaiting asks
    /// the broker a `ping` and fails as a request would).
    ///
    /// By default a mistake shows when the client is made: no broker at the address
    /// (`Error::Connection`, after the second of refused connections the Python client also allows), a
    /// CURVE mismatch (`Error::Connection`), the broker's worker endpoint given for its client endpoint
    /// ([`Error::WrongEndpoint`](crate::Error::WrongEndpoint)), a token it does not take (`Unauthenticated`). A lazy client
    /// meets them at its first request instead, and may be made before its broker starts.
    pub fn lazy(mut self, lazy: bool) -> Connect {
        self.lazy = lazy;
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
    /// this broker only: another member's pools are then refused with `Error::NotOwner` naming
    /// their owner, and task ids naming another member are `NotFound`.
    pub fn routing(mut self, routing: bool) -> Connect {
        self.routing = routing;
        self
    }

    async fn open(self) -> Result<Client> {
        let token = self.token.resolve()?;
        let endpoint = Endpoint::client(&self.addresses, token, self.curve.as_deref()).await?;
        let home = Connection::open(endpoint, self.request_timeout)?;
        if !self.lazy {
            if let Err(error) = home.ping().await {
                tracing::warn!(broker = %home.endpoint().describe(), %error, "cannot connect to the broker");
                home.close();
                return Err(error);
            }
        }
        let router = self.routing.then(|| Arc::new(Router::new(home.clone())));
        Ok(Client { home, router })
    }
}

impl IntoFuture for Connect {
    type Output = Result<Client>;
    type IntoFuture = Pin<Box<dyn Future<Output = Result<Client>> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.open())
    }
}

/// A connection to a broker's client endpoint (in a cluster, to every member). Cheap to clone:
/// clones share the connection.
#[derive(Clone)]
pub struct Client {
    /// The broker this client was given.
    home: Connection,
    /// Routes over the broker's cluster; None: `.routing(false)`, the home broker only.
    router: Option<Arc<Router>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("address", &self.home.endpoint().describe()).finish()
    }
}

impl Client {
    /// The connection that knows `task_id`: in a cluster, the member its id names.
    async fn for_task(&self, task_id: &str) -> Result<Connection> {
        match &self.router {
            Some(router) => router.for_task(task_id).await,
            None => Ok(self.home.clone()),
        }
    }

    /// Queue a task; returns its handle once the broker has accepted it (durably, when the broker
    /// keeps a data_dir). A payload over the broker's max_payload_bytes, or a name longer than it
    /// takes, is refused here with `InvalidArgument` and nothing is sent.
    ///
    /// In a cluster it goes to the member that owns the task's pool (the handle then asks that
    /// member); a member refusing the pool for another owner makes the client read the map again and
    /// try once more there.
    ///
    /// # Errors
    ///
    /// What the broker refuses the task with (`InvalidArgument`, `NotFound` for an undeclared pool,
    /// `PermissionDenied`, `ResourceExhausted`, ...); `InvalidArgument` before sending for a payload
    /// over `max_payload_bytes`; `Connection` when the broker does not answer in time.
    pub async fn submit(&self, task: Task) -> Result<TaskHandle> {
        let task = &task;
        match &self.router {
            Some(router) => router.on_owner(&task.pool, |conn| async move { conn.submit(task).await }).await,
            None => Ok(self.home.submit(task).await?),
        }
    }

    /// Submit a task and wait for its value, in one request: `submit` then `result` for a caller
    /// that wants the value and not the task's id (an API handler that hands work to a pool and
    /// answers with what came back). The broker answers with the task's outcome alone, without the
    /// `accepted` a submit waits for: a message per task fewer on both sides.
    ///
    /// The task is as durable as a submitted one, and the call is re-sent when the connection is made
    /// again (a restarted broker, a standby taking over), finding the first task by its submission
    /// id: one task runs. So `request_timeout` does not bound it; [`call_timeout`](Self::call_timeout)
    /// does. In a cluster it goes to the member that owns the pool, as `submit` does. An older broker
    /// answers `accepted` first anyway; the call then waits on for the outcome.
    ///
    /// Without the id the task cannot be cancelled, asked about or waited on again: use `submit` and
    /// [`TaskHandle::result`] for that. Dropping the future (a `select!`, a `tokio::time::timeout`)
    /// forgets the call: nothing is re-sent, and the task goes on.
    ///
    /// # Errors
    ///
    /// What [`submit`](Self::submit) and [`result`](Self::result) return: the broker's refusal
    /// (`InvalidArgument`, `NotFound` for an undeclared pool, `PermissionDenied`, ...), the task's
    /// failure (`TaskFailed`, `Cancelled`, `DeadlineExceeded`), `Decode` when the value is not a `T`,
    /// `Connection` when the connection fails.
    pub async fn call<T: serde::de::DeserializeOwned>(&self, task: Task) -> Result<T> {
        self.call_payload(&task).await?.decode()
    }

    /// Like [`call`](Self::call), giving up with `Timeout` after `timeout` (the task goes on and runs
    /// to its end; its outcome is dropped when it comes).
    ///
    /// # Errors
    ///
    /// As [`call`](Self::call), and `Timeout` when `timeout` runs out first.
    pub async fn call_timeout<T: serde::de::DeserializeOwned>(&self, task: Task, timeout: Duration) -> Result<T> {
        // One bound over all of it (learning a cluster's map, a retry at a moved pool's owner, the
        // wait): dropping the inner future is what forgets the call.
        match tokio::time::timeout(timeout, self.call_payload(&task)).await {
            Ok(payload) => payload?.decode(),
            Err(_) => Err(call_timed_out(&task.pool, timeout)),
        }
    }

    async fn call_payload(&self, task: &Task) -> Result<Payload> {
        let (id, outcome) = match &self.router {
            Some(router) => router.on_owner(&task.pool, |conn| async move { conn.call(task).await }).await?,
            None => self.home.call(task).await?,
        };
        outcome.into_result(&id)
    }

    /// Wait for a task's value by id, also one another connection submitted (see
    /// [`TaskHandle::result`]).
    ///
    /// # Errors
    ///
    /// The task's failure (`TaskFailed`, `Cancelled`, `DeadlineExceeded`), `NotFound`, `Decode` when
    /// the result is not a `T`, `Connection` when the connection fails.
    pub async fn result<T: serde::de::DeserializeOwned>(&self, task_id: &str) -> Result<T> {
        let conn = self.for_task(task_id).await?;
        conn.wait_ended(task_id, None, None).await?.into_result(task_id)?.decode()
    }

    /// Like [`result`](Self::result), giving up with `Timeout` after `timeout`.
    ///
    /// # Errors
    ///
    /// As [`result`](Self::result), and `Timeout` when `timeout` runs out first.
    pub async fn result_timeout<T: serde::de::DeserializeOwned>(&self, task_id: &str, timeout: Duration) -> Result<T> {
        let conn = self.for_task(task_id).await?;
        conn.wait_ended(task_id, None, Some(timeout)).await?.into_result(task_id)?.decode()
    }

    /// A snapshot of a task: state, attempts, timings. NotFound for a task this token may not see.
    ///
    /// # Errors
    ///
    /// `NotFound` for a task this token may not see (or one long gone); `Connection`.
    pub async fn status(&self, task_id: &str) -> Result<TaskInfo> {
        self.for_task(task_id).await?.status(task_id).await
    }

    /// Why the task is where it is: what stands before it while it waits (higher classes, deadline
    /// tasks, its place in its queue, its tenant's path in the fair share, a paused pool, busy
    /// workers, a delay) and when it may start, or how each attempt of a task that ran ended
    /// (docs/scheduling.md, "Why is my task waiting?"). NotFound for a task this token may not see.
    ///
    /// # Errors
    ///
    /// `NotFound` as for [`status`](Self::status); `Connection`; `Unavailable` for a map that cannot be read.
    pub async fn explain(&self, task_id: &str) -> Result<Explanation> {
        self.for_task(task_id).await?.explain(task_id).await
    }

    /// Cancel a task not yet dispatched; false if it already runs or has finished. Never re-sent:
    /// `Connection` when no reply comes.
    ///
    /// # Errors
    ///
    /// `NotFound`, `PermissionDenied`; `Connection` when no reply comes (it is not re-sent).
    pub async fn cancel(&self, task_id: &str) -> Result<bool> {
        self.for_task(task_id).await?.cancel(task_id).await
    }

    /// Stop dispatching `pool` (admin token); in a cluster, on the member that owns it.
    ///
    /// # Errors
    ///
    /// `PermissionDenied` without an admin token, `NotFound` for an undeclared pool, `Connection`.
    pub async fn pause(&self, pool: &str) -> Result<()> {
        self.pool_request("pause", pool).await
    }

    /// Dispatch `pool` again (admin token); in a cluster, on the member that owns it.
    ///
    /// # Errors
    ///
    /// As [`pause`](Self::pause).
    pub async fn resume(&self, pool: &str) -> Result<()> {
        self.pool_request("resume", pool).await
    }

    async fn pool_request(&self, tag: &'static str, pool: &str) -> Result<()> {
        match &self.router {
            Some(router) => router.on_owner(pool, |conn| async move { conn.pool_request(tag, pool).await }).await,
            None => Ok(self.home.pool_request(tag, pool).await?),
        }
    }

    /// The broker's statistics (admin token): per pool, workers, schedules, memory and store.
    ///
    /// In a cluster, every member's, merged as the Python client merges them: `pools` holds every
    /// member's pools (each naming its `member`), `workers` the sum, `members` each member's own
    /// answer, or `{"unreachable": why}` for one that did not answer within 5 s (or the
    /// request_timeout, if shorter); `cluster` is the map's version.
    ///
    /// # Errors
    ///
    /// `PermissionDenied` without an admin (or viewer) token, `Decode` for a map that does not read,
    /// `Connection`.
    pub async fn stats(&self) -> Result<Stats> {
        let value = match &self.router {
            Some(router) => router.stats().await?,
            None => self.home.stats().await?,
        };
        Stats::from_value(value)
    }

    /// The cluster map as the broker gives it (members, their addresses and pools, the map's
    /// version; docs/protocol.md, "Clusters"), or `None` from a broker that is no member of a
    /// cluster. Routing follows the map read here.
    ///
    /// # Errors
    ///
    /// `Connection` when the broker does not answer, `Unavailable` when it answers with no map.
    pub async fn cluster(&self) -> Result<Option<ClusterMap>> {
        match &self.router {
            Some(router) => router.cluster().await,
            None => ClusterMap::parse(&self.home.cluster_map().await?),
        }
    }

    /// A round trip to the broker; `Connection` when it does not answer in time.
    ///
    /// # Errors
    ///
    /// `Connection` (no answer in time, no broker, a CURVE mismatch), `Unauthenticated`,
    /// `WrongEndpoint`.
    pub async fn ping(&self) -> Result<()> {
        self.home.ping().await
    }

    /// The broker's max_payload_bytes, as it said on connecting (None until it has, or if it never says).
    #[must_use]
    pub fn max_payload_bytes(&self) -> Option<usize> {
        self.home.max_payload_bytes()
    }

    /// How many times the connection was made again (and what was outstanding re-sent).
    #[must_use]
    pub fn reconnects(&self) -> usize {
        self.home.reconnects()
    }

    /// Close the connection (every member's, in a cluster): requests still waiting fail with
    /// `Error::Connection`.
    pub async fn close(&self) {
        if let Some(router) = &self.router {
            router.close();
        }
        self.home.close();
    }
}
