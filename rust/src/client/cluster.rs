//! The client's router over a cluster (docs/protocol.md, "Clusters"; docs/scaling.md,
//! "Partitioning pools over a cluster"): the map it learnt, a [`Connection`] per member, and where
//! each request goes.
//!
//! The connection the client was given (its "home") answers `hello`; when that names a cluster
//! member, the router asks it for the map (`cluster`, src/clustermap.rs) and keeps a connection to
//! every member (to its primary and standbys at once). A submit, pause or resume goes to the member
//! that owns the pool; a task id's requests go to the member whose name starts the id (`b2:3f0c…`).
//! A member that refuses a pool with `FailedPrecondition` naming another owner (a reload moved it)
//! makes the router read the map again, from that member, and try once more at the owner. `stats`
//! asks every member and merges their answers. Against a lone broker every request goes home.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use rmpv::Value;

use super::connection::{Connection, Refused};
use crate::clustermap::{member_of_task, ClusterMap};
use crate::error::{Error, Result};
use crate::wire;

/// How long `stats` waits for each member of a cluster at most (less when request_timeout is).
const STATS_WAIT: Duration = Duration::from_secs(5);

/// Routes a client's requests over the cluster its home broker belongs to, if it belongs to one.
pub(crate) struct Router {
    /// The connection the client was given.
    home: Connection,
    /// The cluster's map and a connection per member, once learnt.
    routes: Mutex<Option<Routes>>,
}

impl Router {
    /// A router whose first question goes to `home`.
    pub fn new(home: Connection) -> Router {
        Router { home, routes: Mutex::new(None) }
    }

    /// Learn the cluster's routes if the home broker is a member and they are not known yet: true
    /// when requests are to be routed. Waits for the broker's `hello` if none came yet.
    async fn learn(&self) -> Result<bool> {
        self.home.payload_limit().await?; // the `hello`'s answer says whether the broker is a member
        if self.home.member().is_none() {
            return Ok(false);
        }
        if self.routes.lock().unwrap().is_some() {
            return Ok(true);
        }
        match ClusterMap::parse(&self.home.cluster_map().await?)? {
            None => {
                // The broker left its cluster since its hello (a restart with another config).
                self.home.forget_member();
                Ok(false)
            }
            Some(map) => {
                if self.routes.lock().unwrap().is_none() {
                    self.take_map(&map)?;
                }
                Ok(true)
            }
        }
    }

    /// Route by `map` from now on: connect to its new members, close what it no longer lists.
    fn take_map(&self, map: &ClusterMap) -> Result<()> {
        let connect = |addresses: &[String]| {
            Connection::open(self.home.endpoint().member(addresses)?, self.home.request_timeout())
        };
        let gone = {
            let mut routes = self.routes.lock().unwrap();
            routes.get_or_insert_with(Routes::default).update(map, connect)?
        };
        for connection in gone {
            connection.close();
        }
        Ok(())
    }

    /// The connection that knows `task_id`: the member its id names (learning the map first, if
    /// need be); home for a lone broker's id.
    pub async fn for_task(&self, task_id: &str) -> Result<Connection> {
        if member_of_task(task_id).is_none() || !self.learn().await? {
            return Ok(self.home.clone());
        }
        let member = self.routes.lock().unwrap().as_ref().and_then(|r| r.for_task(task_id));
        Ok(member.unwrap_or_else(|| self.home.clone()))
    }

    /// `call` on the connection to `pool`'s owner (home for a lone broker, or for a pool the map does
    /// not list: it answers `NotFound` as a lone broker would). A refusal naming another owner
    /// re-reads the map from the member that refused, and tries once more at the owner.
    pub async fn on_owner<T, F, Fut>(&self, pool: &str, call: F) -> Result<T>
    where
        F: Fn(Connection) -> Fut,
        Fut: Future<Output = std::result::Result<T, Refused>>,
    {
        if !self.learn().await? {
            return Ok(call(self.home.clone()).await?);
        }
        let owner_of = |pool: &str| self.routes.lock().unwrap().as_ref().and_then(|r| r.for_pool(pool));
        let first = owner_of(pool).unwrap_or_else(|| self.home.clone());
        let refused = match call(first.clone()).await {
            Ok(value) => return Ok(value),
            Err(refused) => refused,
        };
        let Some(owner) = refused.owner else { return Err(refused.error) };
        if let Some(map) = ClusterMap::parse(&first.cluster_map().await?)? {
            self.take_map(&map)?;
        }
        let again = owner_of(pool)
            .filter(|again| !again.same(&first))
            .or_else(|| self.routes.lock().unwrap().as_ref().and_then(|r| r.member(&owner)));
        match again {
            Some(again) => Ok(call(again).await?),
            None => Err(refused.error),
        }
    }

    /// Every member's `stats` merged (see `Client::stats`), or the lone broker's.
    pub async fn stats(&self) -> Result<Value> {
        if !self.learn().await? {
            return self.home.stats().await;
        }
        let (members, version) = {
            let routes = self.routes.lock().unwrap();
            (routes.as_ref().map(Routes::members).unwrap_or_default(), routes.as_ref().and_then(|r| r.version.clone()))
        };
        cluster_stats(members, version, STATS_WAIT.min(self.home.request_timeout())).await
    }

    /// The home broker's cluster map (None: it is no member), which routing follows from now on
    /// if it routes already.
    pub async fn cluster(&self) -> Result<Option<ClusterMap>> {
        let value = self.home.cluster_map().await?;
        let Some(map) = ClusterMap::parse(&value)? else { return Ok(None) };
        if self.routes.lock().unwrap().is_some() {
            self.take_map(&map)?;
        }
        Ok(Some(map))
    }

    /// Close every member's connection (not home's: its owner closes it).
    pub fn close(&self) {
        let members = self.routes.lock().unwrap().take().map(|mut r| r.take_all()).unwrap_or_default();
        for member in members {
            member.close();
        }
    }
}

/// Every member's `stats`, waiting `wait` for each at most, merged as `Client::stats` says.
async fn cluster_stats(members: Vec<(String, Connection)>, version: Option<String>, wait: Duration) -> Result<Value> {
    let asks = members.iter().map(|(_, conn)| {
        let conn = conn.clone();
        tokio::spawn(async move { tokio::time::timeout(wait, conn.stats()).await })
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

/// The latest cluster map a client learnt, and a connection to each of its members.
#[derive(Default)]
pub(crate) struct Routes {
    pub version: Option<String>,
    /// Member names in the map's order, each with its connection.
    members: Vec<(String, Connection)>,
    addresses: HashMap<String, Vec<String>>,
    owners: HashMap<String, String>,
}

impl Routes {
    /// Take a map: connect (with `connect`) to new members, or to members whose addresses changed;
    /// returns the connections no longer wanted (the caller closes them).
    pub fn update(
        &mut self,
        map: &ClusterMap,
        connect: impl Fn(&[String]) -> Result<Connection>,
    ) -> Result<Vec<Connection>> {
        let addresses: HashMap<String, Vec<String>> =
            map.members.iter().map(|m| (m.name.clone(), m.clients.clone())).collect();
        let mut kept: HashMap<String, Connection> = HashMap::new();
        let mut gone = Vec::new();
        for (name, conn) in self.members.drain(..) {
            if addresses.get(&name) == self.addresses.get(&name) {
                kept.insert(name, conn);
            } else {
                gone.push(conn); // gone from the map, or moved: new requests go to the new address
            }
        }
        let mut members = Vec::new();
        for member in &map.members {
            let conn = match kept.remove(&member.name) {
                Some(conn) => conn,
                None => match connect(&member.clients) {
                    Ok(conn) => conn,
                    Err(e) => {
                        gone.extend(members.into_iter().map(|(_, c)| c));
                        gone.extend(kept.into_values());
                        return Err(e);
                    }
                },
            };
            members.push((member.name.clone(), conn));
        }
        self.members = members;
        self.owners = map.members.iter().flat_map(|m| m.pools.iter().map(|p| (p.clone(), m.name.clone()))).collect();
        self.addresses = addresses;
        self.version = map.version.clone();
        Ok(gone)
    }

    /// The connection to the member called `name`.
    pub fn member(&self, name: &str) -> Option<Connection> {
        self.members.iter().find(|(n, _)| n == name).map(|(_, c)| c.clone())
    }

    /// The connection to the owner of `pool`; None when the map does not list the pool.
    pub fn for_pool(&self, pool: &str) -> Option<Connection> {
        self.owners.get(pool).and_then(|owner| self.member(owner))
    }

    /// The connection to the member whose name starts `task_id`; None for an id naming no member.
    pub fn for_task(&self, task_id: &str) -> Option<Connection> {
        member_of_task(task_id).and_then(|name| self.member(name))
    }

    /// Every member's name and connection, in the map's order.
    pub fn members(&self) -> Vec<(String, Connection)> {
        self.members.clone()
    }

    /// Forget every member; their connections, for the caller to close.
    pub fn take_all(&mut self) -> Vec<Connection> {
        self.owners.clear();
        self.addresses.clear();
        self.members.drain(..).map(|(_, c)| c).collect()
    }
}
