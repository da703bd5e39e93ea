//! The cluster map (docs/protocol.md, "Clusters"; docs/scaling.md, "Partitioning pools over a
//! cluster"), as a member answers `cluster`: what the client's router and the worker's both read.
//!
//! A cluster is a few brokers ("members") that divide the declared pools between them, each pool
//! owned by exactly one. A member names itself in its `hello` answer (and a worker asks `cluster`
//! before it registers); the map lists each member's client and worker endpoints (its primary's,
//! then its standbys') and the pools it owns, and the answering member's pools it still drains.
//! A task id made by a member starts with the member's name and a colon (`b2:3f0c…`).
//!
//! The routers that act on it are src/client/cluster.rs and src/worker/cluster.rs. No I/O here.

use rmpv::Value;

use crate::error::{Error, Result};
use crate::wire::entry;

/// What separates a member's name from the rest of a task id it made.
pub(crate) const TASK_ID_SEPARATOR: char = ':';

/// The member a task id names (its part before the first colon), or None for a lone broker's id.
pub(crate) fn member_of_task(task_id: &str) -> Option<&str> {
    task_id.split_once(TASK_ID_SEPARATOR).map(|(name, _)| name).filter(|name| !name.is_empty())
}

/// One member as the map lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct ClusterMember {
    /// Its name (the prefix of the task ids it makes).
    pub name: String,
    /// Its client endpoints: the primary's first, then its standbys'.
    pub clients: Vec<String>,
    /// Its worker endpoints, in the same order.
    pub workers: Vec<String>,
    /// The declared pools it owns.
    pub pools: Vec<String>,
}

/// A cluster member's answer to `cluster`: [`Client::cluster`](crate::Client::cluster) returns it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct ClusterMap {
    /// Changes whenever the placement does.
    pub version: Option<String>,
    /// The member that answered.
    pub member: Option<String>,
    /// Every member, with its addresses and the pools it owns.
    pub members: Vec<ClusterMember>,
    /// Pools the answering member still holds tasks of, though it owns them no more.
    pub draining: Vec<String>,
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
    pub(crate) fn parse(value: &Value) -> Result<Option<ClusterMap>> {
        let bad = |what: &str| Error::Unavailable(format!("{what}: {value}"));
        let entries = match value {
            Value::Nil => return Ok(None),
            Value::Map(entries) => entries,
            _ => return Err(bad("the broker answered `cluster` with something that is no cluster map")),
        };
        let Some(Value::Array(listed)) = entry(entries, "members") else {
            return Err(bad("the broker answered `cluster` with something that is no cluster map"));
        };
        let mut members = Vec::new();
        for member in listed {
            let fields = match member {
                Value::Map(fields) => fields,
                _ => return Err(bad("the cluster map lists a member that is no map")),
            };
            let name = entry(fields, "name").and_then(Value::as_str);
            let clients = strings(entry(fields, "clients")).filter(|c| !c.is_empty());
            let (Some(name), Some(clients)) = (name, clients) else {
                return Err(bad("the cluster map lists a member without a name or client addresses"));
            };
            members.push(ClusterMember {
                name: name.to_string(),
                clients,
                workers: strings(entry(fields, "workers")).unwrap_or_default(),
                pools: strings(entry(fields, "pools")).unwrap_or_default(),
            });
        }
        let version = entry(entries, "version").and_then(Value::as_str).map(str::to_string);
        let member = entry(entries, "member").and_then(Value::as_str).map(str::to_string);
        let draining = strings(entry(entries, "draining")).unwrap_or_default();
        Ok(Some(ClusterMap { version, member, members, draining }))
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
