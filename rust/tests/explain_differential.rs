//! `explain` of the Rust embedded Scheduler against the Python one, over random combinations of
//! what shapes a wait: fair and plain pools, weights and default weights, tenant trees, ceilings
//! (some reached), default ceilings, minimums, `max_in_flight`, `share_by`, paused pools,
//! priorities, deadlines, delays and costs. Each scenario is run by both schedulers (the Python one
//! of this checkout, in one process for all of them); every figure that does not come off a clock
//! must agree.
//!
//! A scenario holds every slot with tasks that never end (blockers: they fit every ceiling and
//! `max_in_flight`, so all of them start), then queues the rest, so that no dispatch happens while
//! the tasks are explained and both sides explain the same state.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cronoq::{Error, Fairness, Payload, PoolConfig, Priority, Scheduler, ShareBy, Task, TaskState};
use serde_json::{json, Value};

mod support;

/// How many random scenarios a run compares.
const SCENARIOS: u64 = 100;

/// Tenant names: a tree under acme, a smaller one under globex, a lone tenant, and no tenant.
const TENANTS: [Option<&str>; 8] = [
    Some("acme"),
    Some("acme/search"),
    Some("acme/search/alice"),
    Some("acme/ads"),
    Some("globex"),
    Some("globex/x"),
    Some("initech"),
    None,
];

/// SplitMix64: a seeded, dependency-free source of the scenarios (the same seed, the same scenario).
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

/// The nodes a task of `tenant` counts against: its path from the top (`acme`, `acme/search`, ...).
fn path(tenant: Option<&str>) -> Vec<String> {
    let Some(tenant) = tenant else { return vec![String::new()] };
    let parts: Vec<&str> = tenant.split('/').collect();
    (1..=parts.len()).map(|n| parts[..n].join("/")).collect()
}

fn scenario(seed: u64) -> Value {
    let mut rng = Random(seed);
    let pools = 1 + rng.below(3) as usize;
    let concurrency = 1 + rng.below(4) as usize;
    let task = |rng: &mut Random, pool: usize, share_by: &Value| {
        let cost = if share_by == "cost" { json!(rng.pick(&[0.5, 1.0, 2.0, 3.0])) } else { Value::Null };
        json!({"pool": format!("p{pool}"), "tenant": rng.pick(&TENANTS), "cost": cost})
    };
    let share_bys: Vec<Value> =
        (0..pools).map(|_| rng.pick(&[None, Some("dispatches"), Some("cost"), Some("runtime")]).into()).collect();
    let blockers: Vec<Value> = (0..concurrency)
        .map(|_| {
            let pool = rng.below(pools as u64) as usize;
            task(&mut rng, pool, &share_bys[pool])
        })
        .collect();
    // What the blockers run of each pool and node: every ceiling and max_in_flight leaves them room.
    let mut running: BTreeMap<(String, String), u64> = BTreeMap::new();
    for b in &blockers {
        for node in path(b["tenant"].as_str()) {
            *running.entry((b["pool"].as_str().unwrap().to_string(), node)).or_default() += 1;
        }
    }
    let pool_configs: Vec<Value> = (0..pools)
        .map(|p| {
            let name = format!("p{p}");
            let in_pool = blockers.iter().filter(|b| b["pool"] == name.as_str()).count() as u64;
            let at_least = |node: &str| running.get(&(name.clone(), node.to_string())).copied().unwrap_or(0).max(1);
            let mut weights = serde_json::Map::new();
            let mut limits = serde_json::Map::new();
            let mut minimums = serde_json::Map::new();
            for tenant in TENANTS.iter().flatten() {
                if rng.chance(30) {
                    weights.insert(tenant.to_string(), json!(rng.pick(&[0.5, 1.0, 2.0, 3.0])));
                }
                if rng.chance(25) {
                    limits.insert(tenant.to_string(), json!(at_least(tenant) + rng.below(2)));
                }
                if rng.chance(15) {
                    minimums.insert(tenant.to_string(), json!(1 + rng.below(2)));
                }
            }
            // A default ceiling holds every node, tasks without a tenant too.
            let most_of_a_tenant = TENANTS.iter().map(|t| at_least(t.unwrap_or(""))).max().unwrap_or(1);
            let default_limit = rng.chance(20).then(|| most_of_a_tenant + rng.below(2));
            let max_in_flight = rng.chance(30).then(|| in_pool.max(1) + rng.below(2));
            // As the pools' checks require: a minimum within every ceiling above it (a default one
            // too), and the outermost minimums within max_in_flight.
            for (tenant, minimum) in &mut minimums {
                let ceilings = path(Some(tenant))
                    .into_iter()
                    .filter_map(|node| limits.get(&node).and_then(Value::as_u64).or(default_limit));
                if let Some(lowest) = ceilings.min() {
                    *minimum = json!(minimum.as_u64().unwrap().min(lowest));
                }
            }
            let outermost: u64 = minimums
                .iter()
                .filter(|(t, _)| !path(Some(t)).iter().rev().skip(1).any(|above| minimums.contains_key(above)))
                .map(|(_, m)| m.as_u64().unwrap())
                .sum();
            if max_in_flight.is_some_and(|cap| outermost > cap) {
                minimums.clear();
            }
            json!({
                "name": name,
                "fair": rng.chance(50),
                "weights": weights,
                "limits": limits,
                "minimums": minimums,
                "max_in_flight": max_in_flight,
                "default_weight": if rng.chance(20) { json!(rng.pick(&[0.5, 2.0])) } else { Value::Null },
                "default_tenant_limit": default_limit,
                "share_by": share_bys[p],
            })
        })
        .collect();
    let paused: Vec<String> = (0..pools).filter(|_| rng.chance(20)).map(|p| format!("p{p}")).collect();
    let count = 3 + rng.below(8);
    let tasks: Vec<Value> = (0..count)
        .map(|n| {
            let pool = rng.below(pools as u64) as usize;
            let mut t = task(&mut rng, pool, &share_bys[pool]);
            t["priority"] = json!(rng.pick(&["critical", "high", "normal", "low"]));
            // Deadlines far off and apart, so that both sides order them alike.
            t["deadline"] = if rng.chance(20) { json!(300 + 10 * n) } else { Value::Null };
            t["delay"] = if rng.chance(15) { json!(600) } else { Value::Null };
            t
        })
        .collect();
    json!({"seed": seed, "concurrency": concurrency, "pools": pool_configs, "blockers": blockers,
           "paused": paused, "tasks": tasks})
}

/// Runs the scenarios read from stdin with the Python embedded Scheduler; prints each task's
/// `waiting` (null when it has none), scenario by scenario, as JSON.
const PYTHON_RUNNER: &str = r#"
import asyncio, dataclasses, json, sys
import cronoq

def options(task):
    given = {"pool": task["pool"], "tenant": task["tenant"], "cost": task["cost"]}
    for key in ("priority", "deadline", "delay"):
        if task.get(key) is not None:
            given[key] = task[key]
    return given

async def run(s):
    gate = asyncio.Event()
    async def hold(payload):
        await gate.wait()
    pools = [cronoq.Pool(p["name"], hold, tenant_weights=p["weights"] or None, fair_share=p["fair"],
                         max_in_flight=p["max_in_flight"], tenant_limits=p["limits"] or None,
                         default_weight=p["default_weight"], default_tenant_limit=p["default_tenant_limit"],
                         share_by=p["share_by"], tenant_minimums=p["minimums"] or None) for p in s["pools"]]
    sched = cronoq.Scheduler(pools, concurrency=s["concurrency"])
    await sched.__aenter__()
    for b in s["blockers"]:  # each started before the next comes, as on the Rust side
        t = await sched.submit(0, **options(b))
        while (await t.status()).state != "running":
            await asyncio.sleep(0.002)
    for name in s["paused"]:
        await sched.pause(name)
    tasks = [await sched.submit(0, **options(t)) for t in s["tasks"]]
    out = []
    for t in tasks:
        waiting = (await t.explain()).waiting
        out.append(None if waiting is None else dataclasses.asdict(waiting))
    gate.set()  # every task may end now: the answers are in
    await sched.__aexit__(None, None, None)
    return out

async def main():
    print(json.dumps([await run(s) for s in json.load(sys.stdin)]))

asyncio.run(main())
"#;

fn rust_task(t: &Value) -> Task {
    let mut task = Task::new(0).pool(t["pool"].as_str().unwrap());
    if let Some(tenant) = t["tenant"].as_str() {
        task = task.tenant(tenant);
    }
    if let Some(cost) = t["cost"].as_f64() {
        task = task.cost(cost);
    }
    if let Some(priority) = t["priority"].as_str() {
        task = task.priority(Priority::parse(priority).unwrap());
    }
    if let Some(deadline) = t["deadline"].as_u64() {
        task = task.deadline(Duration::from_secs(deadline));
    }
    if let Some(delay) = t["delay"].as_u64() {
        task = task.delay(Duration::from_secs(delay));
    }
    task
}

async fn rust_waits(s: &Value) -> Value {
    let gate = Arc::new(tokio::sync::Notify::new());
    let mut pools = Vec::new();
    for p in s["pools"].as_array().unwrap() {
        let mut pool = PoolConfig::new(p["name"].as_str().unwrap());
        let weights = p["weights"].as_object().unwrap();
        if !weights.is_empty() {
            pool.fairness = Some(Fairness::weights(weights.iter().map(|(t, w)| (t.clone(), w.as_f64().unwrap()))));
        } else if p["fair"].as_bool().unwrap() {
            pool.fairness = Some(Fairness::equal());
        }
        pool.max_in_flight = p["max_in_flight"].as_u64().map(|n| n as u32);
        for (tenant, limit) in p["limits"].as_object().unwrap() {
            pool = pool.tenant_limit(tenant.as_str(), limit.as_u64().unwrap() as u32);
        }
        for (tenant, minimum) in p["minimums"].as_object().unwrap() {
            pool = pool.tenant_minimum(tenant.as_str(), minimum.as_u64().unwrap() as u32);
        }
        if let Some(weight) = p["default_weight"].as_f64() {
            pool = pool.default_weight(weight);
        }
        if let Some(limit) = p["default_tenant_limit"].as_u64() {
            pool = pool.default_tenant_limit(limit as u32);
        }
        match p["share_by"].as_str() {
            Some("dispatches") => pool = pool.share_by(ShareBy::Dispatches),
            Some("cost") => pool = pool.share_by(ShareBy::Cost),
            Some("runtime") => pool = pool.share_by(ShareBy::Runtime),
            _ => {}
        }
        pools.push(pool);
    }
    let names: Vec<String> = pools.iter().map(|p| p.name.clone()).collect();
    let mut builder = Scheduler::builder(pools).concurrency(s["concurrency"].as_u64().unwrap() as u32);
    for name in &names {
        let gate = gate.clone();
        builder = builder.handler(name, move |_: Payload| {
            let gate = gate.clone();
            async move {
                gate.notified().await;
                Ok::<_, Error>(())
            }
        });
    }
    let sched = builder.build().unwrap();
    // Each blocker is started before the next comes: the Python scheduler dispatches within
    // `submit`, this one in its driver, and the order of arrivals and dispatches decides the tags.
    for b in s["blockers"].as_array().unwrap() {
        let blocker = sched.submit(rust_task(b)).await.unwrap();
        while blocker.status().await.unwrap().state != TaskState::Running {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    for name in s["paused"].as_array().unwrap() {
        sched.pause(name.as_str().unwrap()).await.unwrap();
    }
    let mut tasks = Vec::new();
    for t in s["tasks"].as_array().unwrap() {
        tasks.push(sched.submit(rust_task(t)).await.unwrap());
    }
    let mut out = Vec::new();
    for t in &tasks {
        let waiting = t.explain().await.unwrap().waiting;
        out.push(waiting.map_or(Value::Null, |w| serde_json::to_value(w).unwrap()));
    }
    let closing = sched.close(); // no more dispatches: the blockers end as the gate opens
    tokio::pin!(closing);
    while tokio::time::timeout(Duration::from_millis(5), &mut closing).await.is_err() {
        gate.notify_waiters();
    }
    Value::Array(out)
}

/// Where `mine` (Rust's) and `theirs` (Python's) differ, as "path: Rust …, Python …". The timed
/// figures are compared by presence only, and the estimate (and its note) not at all: whether
/// there is an estimate depends on how the measured rates compare, and each side takes its first
/// rate sample at another moment of the scenario.
fn differences(at: &str, mine: &Value, theirs: &Value, out: &mut Vec<String>) {
    match (mine, theirs) {
        (Value::Object(m), _) => {
            for (key, value) in m {
                let here = format!("{at}.{key}");
                if support::EXPLAIN_TIMED.contains(&key.as_str()) {
                    let measured = ["estimate", "estimate_note"].contains(&key.as_str());
                    if !measured && value.is_null() != theirs[key].is_null() {
                        out.push(format!("{here}: Rust {value}, Python {}", theirs[key]));
                    }
                } else {
                    differences(&here, value, &theirs[key], out);
                }
            }
        }
        (Value::Array(m), Value::Array(t)) if m.len() == t.len() => {
            for (i, (a, b)) in m.iter().zip(t).enumerate() {
                differences(&format!("{at}[{i}]"), a, b, out);
            }
        }
        (Value::Number(a), Value::Number(b)) => {
            let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            if (a - b).abs() > 1e-9 * a.abs().max(b.abs()).max(1.0) {
                out.push(format!("{at}: Rust {a}, Python {b}"));
            }
        }
        _ if mine != theirs => out.push(format!("{at}: Rust {mine}, Python {theirs}")),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_agrees_with_python_over_random_combinations() {
    let scenarios: Vec<Value> = (1..=SCENARIOS).map(scenario).collect();
    let python = support::python_json(PYTHON_RUNNER, serde_json::to_string(&scenarios).unwrap().as_bytes());
    let python = python.as_array().unwrap();
    let mut failures = Vec::new();
    let mut explained = 0;
    for (s, theirs) in scenarios.iter().zip(python) {
        let mine = rust_waits(s).await;
        explained += mine.as_array().unwrap().iter().filter(|w| !w.is_null()).count();
        let mut found = Vec::new();
        differences("", &mine, theirs, &mut found);
        if !found.is_empty() {
            failures.push(format!("scenario {s}:\n  {}", found.join("\n  ")));
        }
    }
    assert!(failures.is_empty(), "{} of {SCENARIOS} scenarios differ:\n{}", failures.len(), failures.join("\n"));
    // Every scenario explains some waiting tasks: the comparison is not of empty answers.
    assert!(explained as u64 >= 3 * SCENARIOS, "only {explained} waits explained");
}
