//! The worker's router over a cluster: which members it serves with which of its pools, with how
//! many of its slots, and a [`Session`] per member doing it (docs/scaling.md, "Partitioning pools
//! over a cluster").
//!
//! The worker's first session learns the map (src/worker/session.rs); from then on
//! [`serve_cluster`] keeps one session per member that owns some of the worker's pools, or still
//! drains one, registered for those pools only. Its `concurrency` is split, not shared: each member
//! gets slots in proportion to how many of the worker's pools it owns, at least one each, and a gate
//! holds the handlers running at once to `concurrency` whatever the members hand it. Each member's
//! session asks for the map every few heartbeats and hands it here, so a pool a reload moved is
//! served on its old member until that has drained it, and on its new one from then on.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinSet;

use super::session::{End, Role, Session, Shared, Target};
use crate::clustermap::ClusterMap;
use crate::error::{Error, Result};

/// A member connection, as the worker of a cluster keeps it.
struct MemberRun {
    /// The pools and slots the connection serves: its current target.
    target: watch::Sender<Target>,
    stop: watch::Sender<bool>,
}

/// Serve a cluster from its first map: a connection per member that owns (or still drains) some of
/// the worker's pools, each with its share of the slots, following the maps they report.
pub(super) async fn serve_cluster(
    shared: Arc<Shared>,
    first: ClusterMap,
    mut stop: watch::Receiver<bool>,
) -> Result<()> {
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
                    Err(e) => {
                        failure = Some(Error::connection(
                            shared.endpoint.describe(),
                            format!("a connection to a member of the cluster failed: {e}"),
                        ));
                    }
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
        let endpoint = self.shared.endpoint.member(workers)?;
        let (target_tx, target) = watch::channel((pools.clone(), share));
        let (stop_tx, stop) = watch::channel(false);
        let role = Role::Member { maps: self.maps_tx.clone(), target, gate: self.gate.clone() };
        let session = Session::new(self.shared.clone(), endpoint, pools, share, role)?;
        let member = name.to_string();
        self.runs.spawn(async move { (member, session.drive(stop).await) });
        self.members.insert(name.to_string(), MemberRun { target: target_tx, stop: stop_tx });
        Ok(())
    }
}

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
    use crate::clustermap::ClusterMember;

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
        let member = |name: &str, pools: &[&str]| ClusterMember {
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
}
