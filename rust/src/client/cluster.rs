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
//!
//! A worker's side is here too: which members it serves with which of its pools, and how its slots
//! are split between them (src/worker.rs acts on them).

use std::collections::HashMap;

use rmpv::Value;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::wire::entry;

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
    /// The member that answered.
    pub member: Option<String>,
    pub members: Vec<MapMember>,
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
    pub fn parse(value: &Value) -> Result<Option<ClusterMap>> {
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
            members.push(MapMember {
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

// ---------------------------------------------------------------------- a worker's side

/// Per member, in the map's order: (the worker's pools it owns, the worker's pools it still drains),
/// for each member with either. `draining` holds what each member last said it drains about itself
/// (only a member knows its own).
pub(crate) fn wanted_pools(
    map: &ClusterMap,
    mine: &[String],
    draining: &HashMap<String, Vec<String>>,
) -> Vec<(String, Vec<String>, Vec<String>)> {
    let mut out = Vec::new();
    for member in &map.members {
        let owned: Vec<String> = mine.iter().filter(|p| member.pools.contains(p)).cloned().collect();
        let drains = draining.get(&member.name);
        let leftover: Vec<String> = mine
            .iter()
            .filter(|p| drains.is_some_and(|d| d.contains(p)) && !member.pools.contains(p))
            .cloned()
            .collect();
        if !owned.is_empty() || !leftover.is_empty() {
            out.push((member.name.clone(), owned, leftover));
        }
    }
    out
}

/// `concurrency` slots over the members, in proportion to how many of the worker's pools each owns
/// (largest remainders first, ties by name), at least one each. The credit is split, not shared: a
/// broker only ever holds the credit a worker gave it, and the protocol cannot take back what an
/// idle member holds. `InvalidArgument` when there are more members than slots.
pub(crate) fn split_slots(concurrency: u32, owned: &[(String, usize)]) -> Result<HashMap<String, u32>> {
    if owned.is_empty() {
        return Ok(HashMap::new());
    }
    if owned.len() > concurrency as usize {
        let mut names: Vec<&str> = owned.iter().map(|(n, _)| n.as_str()).collect();
        names.sort_unstable();
        return Err(Error::InvalidArgument(format!(
            "concurrency {concurrency} is less than the {} cluster members that own this worker's pools ({}); \
             give it at least {}, or run one worker per member",
            owned.len(),
            names.join(", "),
            owned.len()
        )));
    }
    let total: usize = owned.iter().map(|(_, n)| (*n).max(1)).sum();
    let exact: HashMap<&str, f64> =
        owned.iter().map(|(n, c)| (n.as_str(), concurrency as f64 * (*c).max(1) as f64 / total as f64)).collect();
    let mut shares: HashMap<&str, u32> = exact.iter().map(|(n, x)| (*n, (x.floor() as u32).max(1))).collect();
    // Largest remainders: take from those furthest above their exact share, give to those furthest below.
    let by = |a: (f64, &str), b: (f64, &str)| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(b.1));
    while shares.values().sum::<u32>() > concurrency {
        let name = *shares
            .iter()
            .filter(|(_, s)| **s > 1)
            .map(|(n, s)| (*s as f64 - exact[n], *n))
            .max_by(|a, b| by(*a, *b))
            .map(|(_, n)| n)
            .as_ref()
            .expect("a share above one");
        *shares.get_mut(name).unwrap() -= 1;
    }
    while shares.values().sum::<u32>() < concurrency {
        let name = *shares
            .iter()
            .map(|(n, s)| (exact[n] - *s as f64, *n))
            .max_by(|a, b| by(*a, *b))
            .map(|(_, n)| n)
            .as_ref()
            .expect("a member");
        *shares.get_mut(name).unwrap() += 1;
    }
    Ok(shares.into_iter().map(|(n, s)| (n.to_string(), s)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_split_by_pools_owned_at_least_one_each() {
        let owned = |pairs: &[(&str, usize)]| pairs.iter().map(|(n, c)| (n.to_string(), *c)).collect::<Vec<_>>();
        let split = split_slots(6, &owned(&[("b1", 2), ("b2", 1)])).unwrap();
        assert_eq!((split["b1"], split["b2"]), (4, 2));
        let split = split_slots(4, &owned(&[("b1", 1), ("b2", 1), ("b3", 1)])).unwrap();
        assert_eq!(split.values().sum::<u32>(), 4);
        assert_eq!(split["b3"], 2, "ties go by name, largest first, as in Python");
        let split = split_slots(3, &owned(&[("b1", 10), ("b2", 1), ("b3", 1)])).unwrap();
        assert_eq!((split["b1"], split["b2"], split["b3"]), (1, 1, 1));
        assert!(
            matches!(split_slots(1, &owned(&[("b1", 1), ("b2", 1)])), Err(Error::InvalidArgument(m)) if m.contains("b1, b2"))
        );
    }

    #[test]
    fn a_worker_wants_the_members_that_own_or_drain_its_pools() {
        let member = |name: &str, pools: &[&str]| MapMember {
            name: name.into(),
            clients: vec![],
            workers: vec![],
            pools: pools.iter().map(|p| p.to_string()).collect(),
        };
        let members = vec![member("b1", &["a", "x"]), member("b2", &["b"]), member("b3", &["y"])];
        let map = ClusterMap { version: None, member: Some("b1".into()), members, draining: vec![] };
        let mine: Vec<String> = ["a", "b", "moved"].iter().map(|p| p.to_string()).collect();
        let draining = HashMap::from([("b3".to_string(), vec!["moved".to_string()])]);
        let wanted = wanted_pools(&map, &mine, &draining);
        assert_eq!(
            wanted,
            [
                ("b1".to_string(), vec!["a".to_string()], vec![]),
                ("b2".to_string(), vec!["b".to_string()], vec![]),
                ("b3".to_string(), vec![], vec!["moved".to_string()])
            ]
        );
    }

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
