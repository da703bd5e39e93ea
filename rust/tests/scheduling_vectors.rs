//! The shared scheduling vectors (docs/scheduling-vectors/), replayed through this crate's core.
//!
//! tests/core/test_scheduling_vectors.py replays the same files through the Python core: both must make
//! every decision the vectors record (which worker gets which task, in order; what expires; which
//! leases are current; when the next wake-up is; what a running task is charged).
//!
//! Vectors that `needs` tenant trees (tenant paths such as `acme/search`) are replayed like the
//! others: this crate's core orders tenant trees as the Python core does.

use std::path::PathBuf;

use cronoq::core::{Core, NewTask, PoolSettings, ShareBy};
use serde_json::{json, Value as Json};

fn vectors() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/scheduling-vectors");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("docs/scheduling-vectors exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
}

fn per_tenant<T>(pool: &Json, key: &str, value: impl Fn(&Json) -> T) -> Vec<(String, T)> {
    pool.get(key)
        .and_then(Json::as_object)
        .map(|m| m.iter().map(|(t, v)| (t.clone(), value(v))).collect())
        .unwrap_or_default()
}

fn pools_of(pools: &Json) -> Vec<PoolSettings> {
    pools
        .as_array()
        .unwrap()
        .iter()
        .map(|p| PoolSettings {
            name: p["name"].as_str().unwrap().to_string(),
            tenant_weights: per_tenant(p, "tenant_weights", |w| w.as_f64().unwrap()),
            fair_share: p.get("fair_share").and_then(Json::as_bool).unwrap_or(false),
            max_in_flight: p.get("max_in_flight").and_then(Json::as_u64).map(|n| n as u32),
            share_by: ShareBy::parse(p.get("share_by").and_then(Json::as_str).unwrap_or("dispatches")).unwrap(),
            tenant_limits: per_tenant(p, "tenant_limits", |n| n.as_u64().unwrap() as u32),
            tenant_rates: per_tenant(p, "tenant_rates", |r| r.as_f64().unwrap()),
            tenant_minimums: per_tenant(p, "tenant_minimums", |n| n.as_u64().unwrap() as u32),
            default_weight: p.get("default_weight").and_then(Json::as_f64),
            default_tenant_limit: p.get("default_tenant_limit").and_then(Json::as_u64).map(|n| n as u32),
        })
        .collect()
}

fn priority(name: &str) -> u8 {
    ["critical", "high", "normal", "low"].iter().position(|p| *p == name).expect("a priority") as u8
}

/// Replay one vector; the steps whose answer differs from the recorded one.
fn replay(vector: &Json) -> Vec<String> {
    let mut core = Core::new(&pools_of(&vector["pools"])).expect("valid pools");
    let mut wrong = Vec::new();
    for (n, step) in vector["steps"].as_array().unwrap().iter().enumerate() {
        let op = step["op"].as_str().unwrap();
        let now = step.get("now").and_then(Json::as_f64).unwrap_or(0.0);
        let s = |k: &str| step[k].as_str().unwrap().to_string();
        let attempt = || step["attempt"].as_i64().unwrap();
        let ran_for = step.get("ran_for").and_then(Json::as_f64);
        let got: Option<Json> = match op {
            "add_worker" => {
                let pools: Vec<String> =
                    step["pools"].as_array().unwrap().iter().map(|p| p.as_str().unwrap().to_string()).collect();
                core.add_worker(&s("worker"), &pools, step["slots"].as_u64().unwrap() as u32).expect("known pools");
                None
            }
            "grant" => {
                core.grant(&s("worker"), step["slots"].as_u64().unwrap() as u32);
                None
            }
            "remove_worker" => {
                Some(json!(core.remove_worker(&s("worker"), now).iter().map(|id| id.to_string()).collect::<Vec<_>>()))
            }
            "submit" => {
                core.submit(
                    NewTask {
                        id: s("id"),
                        pool: s("pool"),
                        tenant: step["tenant"].as_str().map(str::to_string),
                        priority: priority(step["priority"].as_str().unwrap()),
                        deadline: step["deadline"].as_f64(),
                        not_before: step["not_before"].as_f64(),
                        attempts: 0,
                        cost: step.get("cost").and_then(Json::as_f64),
                    },
                    now,
                )
                .expect("the vectors submit valid tasks");
                None
            }
            "dispatch" => {
                let limit = step["limit"].as_u64().map(|l| l as usize);
                Some(json!(core
                    .dispatch(now, limit)
                    .iter()
                    .map(|a| json!([a.worker.to_string(), a.task.to_string()]))
                    .collect::<Vec<_>>()))
            }
            "expire" => {
                let mut ids: Vec<String> = core.expire(now).iter().map(|t| t.id.to_string()).collect();
                ids.sort();
                Some(json!(ids))
            }
            "finish" => Some(json!(
                attempt() > 0 && core.finish(&s("id"), &s("worker"), attempt() as u32, now, ran_for).unwrap().is_some()
            )),
            "requeue" => Some(json!(
                attempt() > 0
                    && core
                        .requeue(&s("id"), now, &s("worker"), attempt() as u32, step["not_before"].as_f64(), ran_for)
                        .unwrap()
            )),
            "configure" => {
                core.configure(&pools_of(&step["pools"]), Some(now)).expect("valid pools");
                None
            }
            "charged_for" => Some(core.charged_for(&s("id")).map_or(Json::Null, |t| json!(t))),
            "cancel" => Some(json!(core.cancel(&s("id")).is_some())),
            "pause" => {
                core.pause(&s("pool")).unwrap();
                None
            }
            "resume" => {
                core.resume(&s("pool")).unwrap();
                None
            }
            "next_wakeup" => Some(core.next_wakeup().map_or(Json::Null, |t| json!(t))),
            other => {
                wrong.push(format!("step {n}: unknown op {other:?}"));
                continue;
            }
        };
        if let (Some(got), Some(expected)) = (got, step.get("expect")) {
            let same = match (&got, expected) {
                (Json::Number(a), Json::Number(b)) => a.as_f64() == b.as_f64(),
                _ => &got == expected,
            };
            if !same {
                wrong.push(format!("step {n} ({op}): got {got}, expected {expected}"));
            }
        }
    }
    wrong
}

fn needs_trees(vector: &Json) -> bool {
    vector.get("needs").and_then(Json::as_array).is_some_and(|n| n.iter().any(|f| f == "tenant_trees"))
}

#[test]
fn the_rust_core_makes_every_decision_of_every_vector() {
    let files = vectors();
    assert!(files.len() >= 20, "expected the shared vectors, found {}", files.len());
    let mut failures = Vec::new();
    let (mut decisions, mut trees) = (0, 0);
    for file in &files {
        let vector: Json = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        trees += usize::from(needs_trees(&vector));
        decisions += vector["steps"].as_array().unwrap().iter().filter(|s| s.get("expect").is_some()).count();
        for w in replay(&vector) {
            failures.push(format!("{}: {w}", file.file_name().unwrap().to_string_lossy()));
        }
    }
    assert!(failures.is_empty(), "{} wrong decisions:\n{}", failures.len(), failures.join("\n"));
    // The tree vectors are the only ones that reach the tree's deeper levels: keep some.
    assert!(trees >= 1, "expected vectors that need tenant trees");
    println!("{} vectors ({trees} with tenant trees), {decisions} decisions agreed", files.len());
}

#[test]
fn a_changed_expectation_is_caught() {
    let file = vectors().into_iter().find(|f| f.ends_with("weights-three-to-one.json")).unwrap();
    let mut vector: Json = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let step = vector["steps"].as_array_mut().unwrap().iter_mut().find(|s| s["op"] == "dispatch").unwrap();
    step["expect"].as_array_mut().unwrap().swap(0, 1);
    assert_eq!(replay(&vector).len(), 1);
}
