//! A client's view of a cluster: the map it learnt, one connection per member, and where each
//! request goes (docs/protocol.md, "Clusters"; docs/scaling.md, "Partitioning pools over a cluster").
//!
//! A cluster is a few brokers ("members") that divide the declared pools between them, each pool
//! owned by exactly one. A member names itself in its `hello` answer; the client then asks it for the
//! map (`cluster`) and keeps a connection to every member (to its primary and standbys at once). A
//! submit, pause or resume goes to the member that owns the pool; a task id's requests go to the
//! member whose name starts the id (`b2:3f0c…`). A member that refuses a pool with
//! `FailedPrecondition` naming another owner (a reload moved it) makes the client read the map
//! again, from that member, and try once more at the owner.

use std::collections::HashMap;

use rmpv::Value;

use crate::client::Client;
use crate::error::{Error, Result};

/// What separates a member's name from the rest of a task id it made.
pub(crate) const TASK_ID_SEPARATOR: char = ':';

/// The member a task id names (its part before the first colon), or None for a lone broker's id.
pub(crate) fn member_of_task(task_id: &str) -> Option<&str> {
    task_id.split_once(TASK_ID_SEPARATOR).map(|(name, _)| name).filter(|name| !name.is_empty())
}

/// One member as the map lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MapMember {
    pub name: String,
    /// Its client endpoints: the primary's first, then its standbys'.
    pub clients: Vec<String>,
    /// Its worker endpoints, in the same order.
    pub workers: Vec<String>,
    /// The declared pools it owns.
    pub pools: Vec<String>,
}

/// A member's answer to `cluster`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClusterMap {
    /// Changes whenever the placement does.
    pub version: Option<String>,
    pub members: Vec<MapMember>,
}

fn key<'a>(map: &'a [(Value, Value)], name: &str) -> Option<&'a Value> {
    map.iter().find(|(k, _)| k.as_str() == Some(name)).map(|(_, v)| v)
}

fn strings(value: Option<&Value>) -> Option<Vec<String>> {
    match value {
        None | Some(Value::Nil) => Some(Vec::new()),
        Some(Value::Array(items)) => items.iter().map(|v| v.as_str().map(str::to_string)).collect(),
        Some(_) => None,
    }
}

impl ClusterMap {
    /// Read a `cluster` answer; None for a broker that is no member of a cluster (it answers nil).
    /// `Unavailable` for something that is no map, as the Python client says.
    pub fn parse(value: &Value) -> Result<Option<ClusterMap>> {
        let bad = |what: &str| Error::Unavailable(format!("{what}: {value}"));
        let entries = match value {
            Value::Nil => return Ok(None),
            Value::Map(entries) => entries,
            _ => return Err(bad("the broker answered `cluster` with something that is no cluster map")),
        };
        let Some(Value::Array(listed)) = key(entries, "members") else {
            return Err(bad("the broker answered `cluster` with something that is no cluster map"));
        };
        let mut members = Vec::new();
        for member in listed {
            let fields = match member {
                Value::Map(fields) => fields,
                _ => return Err(bad("the cluster map lists a member that is no map")),
            };
            let name = key(fields, "name").and_then(Value::as_str);
            let clients = strings(key(fields, "clients")).filter(|c| !c.is_empty());
            let (Some(name), Some(clients)) = (name, clients) else {
                return Err(bad("the cluster map lists a member without a name or client addresses"));
            };
            members.push(MapMember {
                name: name.to_string(),
                clients,
                workers: strings(key(fields, "workers")).unwrap_or_default(),
                pools: strings(key(fields, "pools")).unwrap_or_default(),
            });
        }
        let version = key(entries, "version").and_then(Value::as_str).map(str::to_string);
        Ok(Some(ClusterMap { version, members }))
    }
}

/// The latest cluster map a client learnt, and a connection to each of its members.
#[derive(Default)]
pub(crate) struct Routes {
    pub version: Option<String>,
    /// Member names in the map's order, each with its connection.
    members: Vec<(String, Client)>,
    addresses: HashMap<String, Vec<String>>,
    owners: HashMap<String, String>,
}

impl Routes {
    /// Take a map: connect (with `connect`) to new members, or to members whose addresses changed;
    /// returns the connections no longer wanted (the caller closes them).
    pub fn update(&mut self, map: &ClusterMap, connect: impl Fn(&[String]) -> Result<Client>) -> Result<Vec<Client>> {
        let addresses: HashMap<String, Vec<String>> =
            map.members.iter().map(|m| (m.name.clone(), m.clients.clone())).collect();
        let mut kept: HashMap<String, Client> = HashMap::new();
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
    pub fn member(&self, name: &str) -> Option<Client> {
        self.members.iter().find(|(n, _)| n == name).map(|(_, c)| c.clone())
    }

    /// The connection to the owner of `pool`; None when the map does not list the pool.
    pub fn for_pool(&self, pool: &str) -> Option<Client> {
        self.owners.get(pool).and_then(|owner| self.member(owner))
    }

    /// The connection to the member whose name starts `task_id`; None for an id naming no member.
    pub fn for_task(&self, task_id: &str) -> Option<Client> {
        member_of_task(task_id).and_then(|name| self.member(name))
    }

    /// Every member's name and connection, in the map's order.
    pub fn members(&self) -> Vec<(String, Client)> {
        self.members.clone()
    }

    /// Forget every member; their connections, for the caller to close.
    pub fn take_all(&mut self) -> Vec<Client> {
        self.owners.clear();
        self.addresses.clear();
        self.members.drain(..).map(|(_, c)| c).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_ids_name_their_member_before_a_colon() {
        assert_eq!(member_of_task("b2:3f0c"), Some("b2"));
        assert_eq!(member_of_task("0123456789abcdef0123456789abcdef"), None);
        assert_eq!(member_of_task(":3f0c"), None);
    }

    #[test]
    fn a_map_reads_as_the_protocol_shows_it_and_nil_is_no_cluster() {
        let value = Value::Map(vec![
            (Value::from("version"), Value::from("0c5d")),
            (Value::from("member"), Value::from("b1")),
            (
                Value::from("members"),
                Value::Array(vec![Value::Map(vec![
                    (Value::from("name"), Value::from("b1")),
                    (Value::from("clients"), Value::Array(vec![Value::from("tcp://10.0.0.1:5555")])),
                    (Value::from("workers"), Value::Array(vec![Value::from("tcp://10.0.0.1:5556")])),
                    (Value::from("pools"), Value::Array(vec![Value::from("llm")])),
                ])]),
            ),
            (Value::from("draining"), Value::Array(vec![])),
        ]);
        let map = ClusterMap::parse(&value).unwrap().unwrap();
        assert_eq!(map.version.as_deref(), Some("0c5d"));
        assert_eq!(map.members[0].pools, ["llm"]);
        assert_eq!(ClusterMap::parse(&Value::Nil).unwrap(), None);
        assert!(matches!(ClusterMap::parse(&Value::from(3)), Err(Error::Unavailable(_))));
    }
}
