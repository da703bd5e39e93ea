//! The embedded Scheduler: the broker's rules in one process, the same errors as a broker's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cronoq::{Error, Fairness, Payload, PoolConfig, Priority, Scheduler, ShareBy, Task, TaskState, Value};
use serde_json::json;

mod support;

#[derive(Debug)]
struct Oops(u32);

impl std::fmt::Display for Oops {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "oops {}", self.0)
    }
}

fn echo(pool: &str) -> Scheduler {
    Scheduler::builder(vec![PoolConfig::new(pool), PoolConfig::new("idle")])
        .handler(pool, |p: Payload| async move {
            let n: i64 = p.decode()?;
            if n < 0 {
                return Err(Error::InvalidArgument(format!("negative: {n}")));
            }
            Ok(n * 10)
        })
        .build()
        .unwrap()
}

#[tokio::test]
async fn results_and_failures() {
    let sched = echo("work");
    let ok = sched.submit(Task::new(4).pool("work")).await.unwrap();
    assert_eq!(ok.result::<i64>().await.unwrap(), 40);
    assert_eq!(sched.result::<i64>(ok.id()).await.unwrap(), 40);
    let info = sched.status(ok.id()).await.unwrap();
    assert_eq!(
        (info.state, info.attempts, info.priority, info.cost),
        (TaskState::Succeeded, 1, Priority::Normal, None)
    );
    // A task's cost is in its snapshot and its explanation, as the broker's `info` gives it.
    let costly = sched.submit(Task::new(1).pool("work").cost(2.5)).await.unwrap();
    assert_eq!(costly.status().await.unwrap().cost, Some(2.5));
    assert_eq!(costly.explain().await.unwrap().cost, Some(2.5));
    let bad = sched.submit(Task::new(-1).pool("work")).await.unwrap();
    match bad.result::<i64>().await {
        Err(Error::TaskFailed { r#type, message, .. }) => {
            assert_eq!(r#type, "Error");
            assert!(message.contains("negative: -1"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(sched.status(bad.id()).await.unwrap().error.as_deref(), Some("Error: INVALID_ARGUMENT: negative: -1"));
}

#[tokio::test]
async fn a_call_returns_the_value_the_failure_or_a_timeout() {
    let sched = echo("work");
    assert_eq!(sched.call::<i64>(Task::new(4).pool("work")).await.unwrap(), 40);
    assert!(matches!(sched.call::<i64>(Task::new(-1).pool("work")).await, Err(Error::TaskFailed { .. })));
    assert!(matches!(sched.call::<i64>(Task::new(1).pool("nope")).await, Err(Error::NotFound(_))));
    // "idle" has no handler: nothing runs it, and the call gives up naming the pool.
    let late = sched.call_timeout::<i64>(Task::new(1).pool("idle"), Duration::from_millis(50)).await;
    assert!(matches!(&late, Err(Error::Timeout(m)) if m.contains("pool \"idle\"")), "{late:?}");
    assert_eq!(sched.call_timeout::<i64>(Task::new(2).pool("work"), Duration::from_secs(60)).await.unwrap(), 20);
}

#[tokio::test]
async fn refusals_carry_the_codes() {
    let sched = echo("work");
    assert!(matches!(sched.submit(Task::new(1).pool("nope")).await, Err(Error::NotFound(_))));
    assert!(matches!(sched.submit(Task::new(1).pool("work").key("cronoq:x")).await, Err(Error::InvalidArgument(_))));
    assert!(matches!(sched.submit(Task::new(1).pool("work").max_retries(1001)).await, Err(Error::InvalidArgument(_))));
    assert!(matches!(
        sched.submit(Task::new(1).pool("work").tenant("x".repeat(201))).await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        sched.submit(Task::new(1).pool("work").deadline(Duration::ZERO)).await,
        Err(Error::InvalidArgument(_))
    ));
    let small = Scheduler::builder(vec![PoolConfig::new("p")]).max_payload_bytes(8).build().unwrap();
    assert!(
        matches!(small.submit(Task::new("a long payload").pool("p")).await, Err(Error::InvalidArgument(m)) if m.contains("max_payload_bytes"))
    );
    assert!(matches!(sched.status("nope").await, Err(Error::NotFound(_))));
    let mut weights = PoolConfig::new("w");
    weights.fairness = Some(Fairness::weights([("a", -1.0)]));
    assert!(matches!(Scheduler::new(vec![weights]), Err(Error::InvalidArgument(_))));
    assert!(matches!(Scheduler::new(vec![PoolConfig::new("p"), PoolConfig::new("p")]), Err(Error::InvalidArgument(_))));
    assert!(Scheduler::new(vec![]).is_err());
    assert!(matches!(
        Scheduler::builder(vec![PoolConfig::new("p")]).handler("q", |_: Payload| async { Ok::<_, Error>(()) }).build(),
        Err(Error::NotFound(_))
    ));
    assert!(matches!(
        Scheduler::builder(vec![PoolConfig::new("p")]).concurrency(0).build(),
        Err(Error::InvalidArgument(m)) if m.contains("concurrency")
    ));
}

#[tokio::test]
async fn deadlines_cancel_delay_and_keys() {
    let sched = echo("work");
    let late = sched.submit(Task::new(1).pool("idle").deadline(Duration::from_millis(100))).await.unwrap();
    assert!(matches!(late.result::<Value>().await, Err(Error::DeadlineExceeded(_))));
    assert_eq!(sched.status(late.id()).await.unwrap().state, TaskState::Expired);
    let waiting = sched.submit(Task::new(1).pool("idle")).await.unwrap();
    assert!(sched.cancel(waiting.id()).await.unwrap());
    assert!(matches!(waiting.result::<Value>().await, Err(Error::Cancelled(_))));
    assert!(!sched.cancel(waiting.id()).await.unwrap());
    // The handle asks the same of the scheduler it came from; a pool without a handler has no
    // worker, as a broker's pool no worker serves.
    let queued = sched.submit(Task::new(1).pool("idle")).await.unwrap();
    assert_eq!(queued.status().await.unwrap().state, TaskState::Queued);
    let waiting = queued.explain().await.unwrap().waiting.expect("queued");
    assert_eq!((waiting.workers, waiting.estimate), (0, None));
    assert_eq!(waiting.estimate_note, "no worker serves pool 'idle'");
    assert!(queued.cancel().await.unwrap());
    assert_eq!(queued.status().await.unwrap().state, TaskState::Cancelled);
    assert!(!queued.cancel().await.unwrap());
    let why = queued.explain().await.unwrap();
    assert_eq!((why.state, why.waiting, why.history.len()), (TaskState::Cancelled, None, 0));
    let first = sched.submit(Task::new(1).pool("idle").key("k")).await.unwrap();
    let again = sched.submit(Task::new(2).pool("idle").key("k")).await.unwrap();
    assert!(again.duplicate() && again.id() == first.id() && !first.duplicate());
    let other_tenant = sched.submit(Task::new(2).pool("idle").key("k").tenant("t")).await.unwrap();
    assert_ne!(other_tenant.id(), first.id());
    let delayed = sched.submit(Task::new(7).pool("work").delay(Duration::from_millis(200))).await.unwrap();
    assert_eq!(sched.status(delayed.id()).await.unwrap().state, TaskState::Delayed);
    let why = delayed.explain().await.unwrap();
    let waiting = why.waiting.expect("delayed");
    assert!(why.not_before.is_some() && waiting.delayed_for.is_some_and(|s| s > 0.0 && s <= 0.2), "{waiting:?}");
    assert!(!waiting.retry && waiting.estimate_note.ends_with("(its delay); then it queues"), "{waiting:?}");
    assert_eq!(delayed.result::<i64>().await.unwrap(), 70);
    assert!(matches!(
        sched.submit(Task::new(1).pool("idle")).await.unwrap().result_timeout::<Value>(Duration::from_millis(50)).await,
        Err(Error::Timeout(_))
    ));
}

#[tokio::test]
async fn retries_run_again_until_max_retries() {
    let runs = Arc::new(AtomicU32::new(0));
    let counted = runs.clone();
    let sched = Scheduler::builder(vec![PoolConfig::new("flaky")])
        .handler("flaky", move |p: Payload| {
            let counted = counted.clone();
            async move {
                let succeed_on: u32 = p.decode().unwrap();
                let run = counted.fetch_add(1, Ordering::SeqCst) + 1;
                if run < succeed_on {
                    Err(Oops(run))
                } else {
                    Ok(run)
                }
            }
        })
        .build()
        .unwrap();
    let task = sched.submit(Task::new(2).pool("flaky").max_retries(1)).await.unwrap();
    assert_eq!(task.result::<u32>().await.unwrap(), 2);
    assert_eq!(sched.status(task.id()).await.unwrap().attempts, 2);
    runs.store(0, Ordering::SeqCst);
    let task = sched.submit(Task::new(5).pool("flaky").max_retries(1)).await.unwrap();
    assert_eq!(
        task.result::<u32>().await,
        Err(Error::TaskFailed { r#type: "Oops".into(), message: "oops 2".into(), traceback: "Oops(2)".into() })
    );
}

#[tokio::test]
async fn a_panicking_handler_fails_only_its_task() {
    let sched = Scheduler::builder(vec![PoolConfig::new("p")])
        .handler("p", |p: Payload| async move {
            let n: u32 = p.decode().unwrap();
            assert!(n != 13, "unlucky {n}");
            Ok::<_, Error>(n)
        })
        .build()
        .unwrap();
    let bad = sched.submit(Task::new(13).pool("p")).await.unwrap();
    let good = sched.submit(Task::new(14).pool("p")).await.unwrap();
    assert!(matches!(bad.result::<u32>().await, Err(Error::TaskFailed { r#type, .. }) if r#type == "panic"));
    assert_eq!(good.result::<u32>().await.unwrap(), 14);
}

#[tokio::test]
async fn concurrency_priority_and_max_in_flight() {
    let running = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let order = Arc::new(Mutex::new(Vec::new()));
    let (r, m, o) = (running.clone(), most.clone(), order.clone());
    let mut capped = PoolConfig::new("p");
    capped.max_in_flight = Some(2);
    let sched = Scheduler::builder(vec![capped])
        .concurrency(8)
        .handler("p", move |p: Payload| {
            let (r, m, o) = (r.clone(), m.clone(), o.clone());
            async move {
                let name: String = p.decode().unwrap();
                o.lock().unwrap().push(name);
                let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                m.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                r.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, Error>(())
            }
        })
        .build()
        .unwrap();
    sched.pause("p").await.unwrap();
    let mut handles = Vec::new();
    for (name, priority) in [
        ("low", Priority::Low),
        ("normal", Priority::Normal),
        ("critical", Priority::Critical),
        ("high", Priority::High),
    ] {
        handles.push(sched.submit(Task::new(name).pool("p").priority(priority)).await.unwrap());
    }
    for n in 0..6 {
        handles.push(sched.submit(Task::new(format!("more-{n}")).pool("p").priority(Priority::Low)).await.unwrap());
    }
    sched.resume("p").await.unwrap();
    for h in &handles {
        h.result::<()>().await.unwrap();
    }
    assert_eq!(most.load(Ordering::SeqCst), 2, "max_in_flight is 2");
    assert_eq!(&order.lock().unwrap()[..4], ["critical", "high", "normal", "low"]);
    sched.close().await;
    assert!(matches!(sched.submit(Task::new(1).pool("p")).await, Err(Error::FailedPrecondition(_))));
}

/// Runs `sched`'s queued tasks of pool `p` one at a time and returns the first letter of each
/// payload, in the order they ran.
async fn run_in_order(sched: Scheduler, order: Arc<Mutex<String>>, tasks: Vec<Task>) -> String {
    sched.pause("p").await.unwrap();
    let mut handles = Vec::new();
    for task in tasks {
        handles.push(sched.submit(task).await.unwrap());
    }
    sched.resume("p").await.unwrap();
    for h in handles {
        h.result::<()>().await.unwrap();
    }
    let letters = order.lock().unwrap().clone();
    letters
}

fn recording(pool: PoolConfig, order: Arc<Mutex<String>>) -> Scheduler {
    Scheduler::builder(vec![pool])
        .concurrency(1)
        .handler("p", move |p: Payload| {
            let order = order.clone();
            async move {
                let name: String = p.decode()?;
                order.lock().unwrap().push(name.chars().next().unwrap());
                Ok::<_, Error>(())
            }
        })
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_pool_that_shares_by_cost_charges_each_task_its_cost() {
    let order = Arc::new(Mutex::new(String::new()));
    let sched = recording(PoolConfig::new("p").share_by(ShareBy::Cost), order.clone());
    let mut tasks: Vec<Task> = (0..8).map(|n| Task::new(format!("l{n}")).pool("p").tenant("light").cost(1.0)).collect();
    tasks.extend((0..3).map(|n| Task::new(format!("h{n}")).pool("p").tenant("heavy").cost(4.0)));
    // Equal weights, so equal summed cost: a heavy task for every four light ones.
    assert_eq!(run_in_order(sched, order, tasks).await, "lhllllhlllh");
}

#[tokio::test]
async fn a_tenant_under_its_minimum_goes_first() {
    let order = Arc::new(Mutex::new(String::new()));
    let mut pool = PoolConfig::new("p").tenant_minimum("b", 1);
    pool.fairness = Some(Fairness::weights([("a", 10.0)]));
    let sched = recording(pool, order.clone());
    let mut tasks: Vec<Task> = (0..4).map(|n| Task::new(format!("a{n}")).pool("p").tenant("a")).collect();
    tasks.push(Task::new("b0").pool("p").tenant("b"));
    // By weight b would wait behind a's ten; with nothing of it running it is under its minimum.
    assert_eq!(run_in_order(sched, order, tasks).await, "baaaa");
}

#[tokio::test]
async fn tenant_trees_share_by_weight_at_every_level() {
    let order = Arc::new(Mutex::new(String::new()));
    let mut pool = PoolConfig::new("p");
    pool.fairness = Some(Fairness::weights([("acme", 3.0), ("globex", 1.0), ("acme/a", 1.0), ("acme/b", 1.0)]));
    let sched = recording(pool, order.clone());
    let mut tasks: Vec<Task> = (0..4).map(|n| Task::new(format!("g{n}")).pool("p").tenant("globex")).collect();
    tasks.extend((0..6).map(|n| Task::new(format!("a{n}")).pool("p").tenant("acme/a")));
    tasks.extend((0..6).map(|n| Task::new(format!("b{n}")).pool("p").tenant("acme/b")));
    // acme gets three dispatches for each of globex's, and shares them evenly between acme/a and
    // acme/b. The order is the Python core's, computed with cronoq.core.SchedulerCore on the same
    // pool and submissions (one slot, a finish before each dispatch) and written down here.
    assert_eq!(run_in_order(sched, order, tasks).await, "gabagbabgabagbab");
}

#[tokio::test]
async fn a_ceiling_on_a_parent_node_caps_its_whole_subtree() {
    // top-level node -> (running now, most at once)
    let counts: Arc<Mutex<HashMap<String, (u32, u32)>>> = Arc::default();
    let seen = counts.clone();
    let pool = PoolConfig::new("p").tenant_limit("acme", 2);
    let sched = Scheduler::builder(vec![pool])
        .concurrency(8)
        .handler("p", move |p: Payload| {
            let seen = seen.clone();
            async move {
                let tenant: String = p.decode()?;
                let top = tenant.split('/').next().unwrap().to_string();
                {
                    let mut counts = seen.lock().unwrap();
                    let (running, most) = counts.entry(top.clone()).or_default();
                    *running += 1;
                    *most = (*most).max(*running);
                }
                tokio::time::sleep(Duration::from_millis(30)).await;
                seen.lock().unwrap().get_mut(&top).unwrap().0 -= 1;
                Ok::<_, Error>(())
            }
        })
        .build()
        .unwrap();
    sched.pause("p").await.unwrap();
    let mut handles = Vec::new();
    for _ in 0..3 {
        for tenant in ["acme/a", "acme/b", "acme", "globex"] {
            handles.push(sched.submit(Task::new(tenant).pool("p").tenant(tenant)).await.unwrap());
        }
    }
    sched.resume("p").await.unwrap();
    for h in &handles {
        h.result::<()>().await.unwrap();
    }
    let most: HashMap<String, u32> = counts.lock().unwrap().iter().map(|(t, (_, most))| (t.clone(), *most)).collect();
    // acme's own tasks and its sub-tenants' count against its ceiling together, never more than
    // two at once; globex, beside it, runs all three of its tasks at once in the free slots.
    let expected: HashMap<String, u32> =
        [("acme", 2), ("globex", 3)].into_iter().map(|(t, n)| (t.to_string(), n)).collect();
    assert_eq!(most, expected);
}

#[tokio::test]
async fn an_unlisted_tenant_weighs_the_default_weight_and_untenanted_tasks_still_weigh_one() {
    let order = Arc::new(Mutex::new(String::new()));
    let mut pool = PoolConfig::new("p").default_weight(3.0);
    pool.fairness = Some(Fairness::weights([("listed", 1.0)]));
    let sched = recording(pool, order.clone());
    let mut tasks: Vec<Task> = (0..4).map(|n| Task::new(format!("l{n}")).pool("p").tenant("listed")).collect();
    tasks.extend((0..4).map(|n| Task::new(format!("n{n}")).pool("p")));
    tasks.extend((0..12).map(|n| Task::new(format!("u{n}")).pool("p").tenant("unlisted")));
    // Three dispatches of the unlisted tenant for each of the listed one's and of the untenanted
    // tasks', though it queued last (the Python scheduler's order, ties to the earlier arrival).
    assert_eq!(run_in_order(sched, order, tasks).await, "lnuuulnuuulnuuulnuuu");
}

#[tokio::test]
async fn an_unlisted_tenant_never_runs_more_than_the_default_tenant_limit() {
    // tenant -> (running now, most at once)
    let counts: Arc<Mutex<HashMap<String, (u32, u32)>>> = Arc::default();
    let seen = counts.clone();
    let pool = PoolConfig::new("p").default_tenant_limit(2).tenant_limit("big", 4);
    let sched = Scheduler::builder(vec![pool])
        .concurrency(16)
        .handler("p", move |p: Payload| {
            let seen = seen.clone();
            async move {
                let tenant: String = p.decode()?;
                {
                    let mut counts = seen.lock().unwrap();
                    let (running, most) = counts.entry(tenant.clone()).or_default();
                    *running += 1;
                    *most = (*most).max(*running);
                }
                tokio::time::sleep(Duration::from_millis(30)).await;
                seen.lock().unwrap().get_mut(&tenant).unwrap().0 -= 1;
                Ok::<_, Error>(())
            }
        })
        .build()
        .unwrap();
    sched.pause("p").await.unwrap();
    let mut handles = Vec::new();
    for _ in 0..6 {
        for tenant in ["a", "b", "big"] {
            handles.push(sched.submit(Task::new(tenant).pool("p").tenant(tenant)).await.unwrap());
        }
        handles.push(sched.submit(Task::new("untenanted").pool("p")).await.unwrap());
    }
    sched.resume("p").await.unwrap();
    for h in &handles {
        h.result::<()>().await.unwrap();
    }
    let most: HashMap<String, u32> = counts.lock().unwrap().iter().map(|(t, (_, most))| (t.clone(), *most)).collect();
    // Each unlisted tenant, and the untenanted tasks as one more, at most two at once; the listed
    // ceiling overrides the default. With sixteen slots each reaches its ceiling.
    let expected: HashMap<String, u32> =
        [("a", 2), ("b", 2), ("untenanted", 2), ("big", 4)].into_iter().map(|(t, n)| (t.to_string(), n)).collect();
    assert_eq!(most, expected);
}

#[tokio::test]
async fn bad_default_weights_and_tenant_limits_are_refused_naming_the_pool_and_the_setting() {
    for weight in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let refused = Scheduler::new(vec![PoolConfig::new("p").default_weight(weight)]);
        assert!(
            matches!(&refused, Err(Error::InvalidArgument(m)) if m.contains("\"p\"") && m.contains("default_weight")),
            "{:?}",
            refused.err()
        );
    }
    let refused = Scheduler::new(vec![PoolConfig::new("p").default_tenant_limit(0)]);
    assert!(
        matches!(&refused, Err(Error::InvalidArgument(m)) if m.contains("\"p\"") && m.contains("default_tenant_limit")),
        "{:?}",
        refused.err()
    );
    // A minimum no default ceiling lets it reach is refused as one above a listed ceiling is.
    let above = Scheduler::new(vec![PoolConfig::new("p").tenant_minimum("a", 3).default_tenant_limit(2)]);
    assert!(
        matches!(&above, Err(Error::InvalidArgument(m)) if m.contains("its own ceiling is 2")),
        "{:?}",
        above.err()
    );
}

#[tokio::test]
async fn shares_rates_and_minimums_refuse_bad_settings_in_a_sentence() {
    let sched = echo("work");
    let bad_cost = sched.submit(Task::new(1).pool("work").cost(-1.0)).await;
    assert!(
        matches!(&bad_cost, Err(Error::InvalidArgument(m)) if m.contains("cost must be a positive number")),
        "{bad_cost:?}"
    );
    // A tenant path is refused as the Python core refuses it, naming what is wrong.
    for (tenant, problem) in [
        ("acme//search", "has an empty segment"),
        ("/acme", "has an empty segment"),
        ("acme/", "has an empty segment"),
        ("a/b/c/d/e/f/g/h/i", "has 9 levels; at most 8 are allowed"),
    ] {
        let refused = sched.submit(Task::new(1).pool("work").tenant(tenant)).await;
        assert!(matches!(&refused, Err(Error::InvalidArgument(m)) if m.contains(problem)), "{tenant}: {refused:?}");
    }
    let limit = Scheduler::new(vec![PoolConfig::new("p").tenant_limit("acme//x", 1)]);
    assert!(
        matches!(&limit, Err(Error::InvalidArgument(m)) if m.contains("tenant_limits") && m.contains("empty segment")),
        "{:?}",
        limit.err()
    );
    let rate = Scheduler::new(vec![PoolConfig::new("p").tenant_rate("a", 0.0)]);
    assert!(matches!(&rate, Err(Error::InvalidArgument(m)) if m.contains("rate of tenant")), "{:?}", rate.err());
    let mut capped = PoolConfig::new("p").tenant_minimum("a", 2).tenant_minimum("b", 2);
    capped.max_in_flight = Some(3);
    let minimums = Scheduler::new(vec![capped]);
    assert!(
        matches!(&minimums, Err(Error::InvalidArgument(m)) if m.contains("guarantee 4 running tasks")),
        "{:?}",
        minimums.err()
    );
    let above = Scheduler::new(vec![PoolConfig::new("p").tenant_minimum("a", 3).tenant_limit("a", 2)]);
    assert!(
        matches!(&above, Err(Error::InvalidArgument(m)) if m.contains("its own ceiling is 2")),
        "{:?}",
        above.err()
    );
}

#[tokio::test]
async fn a_rate_limited_tenant_waits_for_its_tokens_and_the_scheduler_wakes_for_them() {
    let starts = Arc::new(Mutex::new(Vec::new()));
    let seen = starts.clone();
    let sched = Scheduler::builder(vec![PoolConfig::new("p").tenant_rate("a", 4.0)])
        .concurrency(8)
        .handler("p", move |_: Payload| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(std::time::Instant::now());
                Ok::<_, Error>(())
            }
        })
        .build()
        .unwrap();
    let before = std::time::Instant::now();
    let mut handles = Vec::new();
    for n in 0..6 {
        handles.push(sched.submit(Task::new(n).pool("p").tenant("a")).await.unwrap());
    }
    // Nothing else happens: only the refill's wake-up can start the last two.
    for h in handles {
        h.result_timeout::<()>(Duration::from_secs(60)).await.unwrap();
    }
    let starts = starts.lock().unwrap();
    // A bucket of 4 tokens at 4 a second: the fifth start comes a quarter of a second after the
    // first dispatch at the earliest, the sixth half a second (lower bounds: a busy machine only
    // makes the waits longer).
    assert!(starts[4] - before >= Duration::from_millis(240), "{:?}", starts[4] - before);
    assert!(starts[5] - before >= Duration::from_millis(490), "{:?}", starts[5] - before);
}

/// The scenario of `explain_answers_as_the_python_scheduler_does`, run by the Python embedded
/// Scheduler of this checkout: it prints the `waiting` of each task it explains, as JSON.
const PYTHON_EXPLAIN_SCENARIO: &str = r#"
import asyncio, dataclasses, json, os, sys
import cronoq

async def main():
    gate = asyncio.Event()
    async def hold(payload):
        await gate.wait()
    pools = [
        cronoq.Pool("llm", hold, tenant_weights={"acme": 3, "globex": 1}),
        cronoq.Pool("batch", hold),
        cronoq.Pool("limited", hold, tenant_limits={"acme": 1}, tenant_rates={"globex": 0.1}),
        cronoq.Pool("tree", hold, tenant_weights={"acme": 3, "globex": 1, "acme/search": 2}),
        cronoq.Pool("subcap", hold, tenant_limits={"acme/search": 1}),
    ]
    sched = cronoq.Scheduler(pools, concurrency=4)
    await sched.__aenter__()
    first = [await sched.submit(0, pool="llm", tenant="globex"),
             await sched.submit(0, pool="limited", tenant="acme"),
             await sched.submit(0, pool="limited", tenant="globex"),
             await sched.submit(0, pool="subcap", tenant="acme/search")]
    for t in first:
        while (await t.status()).state != "running":
            await asyncio.sleep(0.01)
    await sched.pause("batch")
    batch = [await sched.submit(0, pool="batch") for _ in range(2)]
    llm = [await sched.submit(0, pool="llm", tenant=t) for t in ("acme", "acme", "globex", "globex")]
    capped = await sched.submit(0, pool="limited", tenant="acme")
    limited = await sched.submit(0, pool="limited", tenant="globex")
    tree = [await sched.submit(0, pool="tree", tenant=t) for t in ("acme/search", "acme", "acme", "globex")]
    sub_capped = await sched.submit(0, pool="subcap", tenant="acme/search")
    deadline = await sched.submit(0, pool="subcap", tenant="acme/search", deadline=600)
    delayed = await sched.submit(0, pool="subcap", tenant="acme", delay=600)
    high = await sched.submit(0, pool="subcap", tenant="globex", priority="high")
    low = await sched.submit(0, pool="subcap", tenant="acme", priority="low")
    out = {}
    for name, task in (("fair", llm[1]), ("paused", batch[1]), ("capped", capped), ("rate_limited", limited),
                       ("own_tasks", tree[2]), ("sub_capped", sub_capped), ("deadline", deadline),
                       ("delayed", delayed), ("high", high), ("low", low)):
        out[name] = dataclasses.asdict((await task.explain()).waiting)
    print(json.dumps(out))
    sys.stdout.flush()
    os._exit(0)

asyncio.run(main())
"#;

/// The waiting of each task of the scenario, as the Rust embedded Scheduler explains it.
async fn rust_explain_scenario() -> serde_json::Value {
    let gate = Arc::new(tokio::sync::Notify::new());
    let hold = |gate: Arc<tokio::sync::Notify>| {
        move |_: Payload| {
            let gate = gate.clone();
            async move {
                gate.notified().await;
                Ok::<_, Error>(())
            }
        }
    };
    let mut llm = PoolConfig::new("llm");
    llm.fairness = Some(Fairness::weights([("acme", 3.0), ("globex", 1.0)]));
    let limited = PoolConfig::new("limited").tenant_limit("acme", 1).tenant_rate("globex", 0.1);
    let mut tree = PoolConfig::new("tree");
    tree.fairness = Some(Fairness::weights([("acme", 3.0), ("globex", 1.0), ("acme/search", 2.0)]));
    let subcap = PoolConfig::new("subcap").tenant_limit("acme/search", 1);
    let sched = Scheduler::builder(vec![llm, PoolConfig::new("batch"), limited, tree, subcap])
        .concurrency(4)
        .handler("llm", hold(gate.clone()))
        .handler("batch", hold(gate.clone()))
        .handler("limited", hold(gate.clone()))
        .handler("tree", hold(gate.clone()))
        .handler("subcap", hold(gate.clone()))
        .build()
        .unwrap();
    let first = [
        sched.submit(Task::new(0).pool("llm").tenant("globex")).await.unwrap(),
        sched.submit(Task::new(0).pool("limited").tenant("acme")).await.unwrap(),
        sched.submit(Task::new(0).pool("limited").tenant("globex")).await.unwrap(),
        sched.submit(Task::new(0).pool("subcap").tenant("acme/search")).await.unwrap(),
    ];
    for task in &first {
        while task.status().await.unwrap().state != TaskState::Running {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    sched.pause("batch").await.unwrap();
    let mut batch = Vec::new();
    for _ in 0..2 {
        batch.push(sched.submit(Task::new(0).pool("batch")).await.unwrap());
    }
    let mut llm = Vec::new();
    for tenant in ["acme", "acme", "globex", "globex"] {
        llm.push(sched.submit(Task::new(0).pool("llm").tenant(tenant)).await.unwrap());
    }
    let capped = sched.submit(Task::new(0).pool("limited").tenant("acme")).await.unwrap();
    let limited = sched.submit(Task::new(0).pool("limited").tenant("globex")).await.unwrap();
    let mut tree = Vec::new();
    for tenant in ["acme/search", "acme", "acme", "globex"] {
        tree.push(sched.submit(Task::new(0).pool("tree").tenant(tenant)).await.unwrap());
    }
    let subcap = |task: Task| sched.submit(task.pool("subcap"));
    let sub_capped = subcap(Task::new(0).tenant("acme/search")).await.unwrap();
    let deadline = subcap(Task::new(0).tenant("acme/search").deadline(Duration::from_secs(600))).await.unwrap();
    let delayed = subcap(Task::new(0).tenant("acme").delay(Duration::from_secs(600))).await.unwrap();
    let high = subcap(Task::new(0).tenant("globex").priority(Priority::High)).await.unwrap();
    let low = subcap(Task::new(0).tenant("acme").priority(Priority::Low)).await.unwrap();
    let mut out = serde_json::Map::new();
    let explained = [
        ("fair", &llm[1]),
        ("paused", &batch[1]),
        ("capped", &capped),
        ("rate_limited", &limited),
        ("own_tasks", &tree[2]),
        ("sub_capped", &sub_capped),
        ("deadline", &deadline),
        ("delayed", &delayed),
        ("high", &high),
        ("low", &low),
    ];
    for (name, task) in explained {
        // The handle asks the scheduler that made it, as `sched.explain(id)` does.
        let by_handle = task.explain().await.unwrap();
        let by_id = sched.explain(task.id()).await.unwrap();
        assert_eq!(by_handle.id, by_id.id);
        let state = if name == "delayed" { TaskState::Delayed } else { TaskState::Queued };
        assert_eq!(by_handle.state, state, "{name}");
        assert!(by_handle.history.is_empty());
        out.insert(name.to_string(), serde_json::to_value(by_handle.waiting.expect("a queued task waits")).unwrap());
    }
    serde_json::Value::Object(out)
}

#[tokio::test]
async fn explain_answers_as_the_python_scheduler_does() {
    let python = support::python_json(PYTHON_EXPLAIN_SCENARIO, b"");
    let rust = rust_explain_scenario().await;
    let timed = support::EXPLAIN_TIMED;
    for (name, mine) in rust.as_object().unwrap() {
        let theirs = &python[name];
        for (key, value) in mine.as_object().unwrap() {
            if timed.contains(&key.as_str()) {
                // Its figure is each side's own; whether there is one is not.
                assert_eq!(value.is_null(), theirs[key].is_null(), "{name}: {key} (Rust {mine}, Python {theirs})");
                continue;
            }
            if key == "nodes" {
                let (mine, theirs) = (value.as_array().unwrap(), theirs[key].as_array().unwrap());
                assert_eq!(mine.len(), theirs.len(), "{name}: nodes");
                for (m, t) in mine.iter().zip(theirs) {
                    for (field, v) in m.as_object().unwrap() {
                        if field == "ceiling" && !v.is_null() {
                            for part in ["limit", "running", "capped"] {
                                assert_eq!(v[part], t[field][part], "{name}: nodes.ceiling.{part}");
                            }
                        } else if timed.contains(&field.as_str()) {
                            assert_eq!(v.is_null(), t[field].is_null(), "{name}: nodes.{field}");
                        } else {
                            assert_eq!(v, &t[field], "{name}: nodes.{field}");
                        }
                    }
                }
                continue;
            }
            assert_eq!(value, &theirs[key], "{name}: {key} (Rust {mine}, Python {theirs})");
        }
    }
    // Every note says the same, whatever figures each side measured.
    let number = regex::Regex::new(r"[0-9]+(\.[0-9]+)?(e[+-][0-9]+)?").unwrap();
    for (name, mine) in rust.as_object().unwrap() {
        let words =
            |side: &serde_json::Value| number.replace_all(side["estimate_note"].as_str().unwrap(), "N").to_string();
        assert_eq!(words(mine), words(&python[name]), "{name}");
    }
    // What holds the task comes before any rate: the same words, the same figures.
    for name in ["paused", "capped", "sub_capped", "deadline"] {
        assert_eq!(rust[name]["estimate"], serde_json::Value::Null, "{name}");
        assert_eq!(rust[name]["estimate_note"], python[name]["estimate_note"], "{name}");
    }
    assert_eq!(rust["paused"]["estimate_note"], "pool 'batch' is paused: nothing starts until it is resumed");
    assert!(rust["capped"]["nodes"][0]["ceiling"]["capped"].as_bool().unwrap());
    let note = |side: &serde_json::Value| side["rate_limited"]["estimate_note"].as_str().unwrap().to_string();
    assert!(note(&rust).starts_with("globex rate-limited: next start in "), "{}", note(&rust));
    assert!(note(&python).starts_with("globex rate-limited: next start in "), "{}", note(&python));
    let (mine, theirs) =
        (rust["rate_limited"]["estimate"].as_f64().unwrap(), python["rate_limited"]["estimate"].as_f64().unwrap());
    assert!((5.0..=10.0).contains(&mine) && (mine - theirs).abs() < 5.0, "Rust {mine} s, Python {theirs} s");
    // The fair pool's place, share and lag agree (above); its estimate goes by the pool's dispatch
    // rate, which each scheduler measures on its own clock: the same sentence, its own figures.
    assert_eq!((rust["fair"]["queue_ahead"].as_u64(), rust["fair"]["tenant_share"].as_f64()), (Some(1), Some(0.75)));
    // A tenant with sub-tenants: its own tasks are one more child of its node, of weight 1, and the
    // task's share is the product down to that child (3/4 of the pool, then 1/3 of acme's).
    let own = &rust["own_tasks"];
    let names: Vec<_> =
        own["nodes"].as_array().unwrap().iter().map(|n| (n["name"].clone(), n["own_tasks"].clone())).collect();
    assert_eq!(names, [(json!("acme"), json!(false)), (json!("acme"), json!(true))]);
    assert_eq!(own["nodes"][1]["weight"], json!(1.0));
    assert!((own["tenant_share"].as_f64().unwrap() - 0.25).abs() < 1e-9, "{own}");
    assert_eq!(own["queue_ahead"], json!(1));
    let figures = regex::Regex::new(r"[0-9.]+(e[+-][0-9]+)?/s").unwrap();
    let sentence = |side: &serde_json::Value| {
        figures.replace_all(side["fair"]["estimate_note"].as_str().unwrap(), "R/s").to_string()
    };
    assert_eq!(sentence(&rust), sentence(&python));
    assert_eq!(
        sentence(&rust),
        "0 dispatches ahead at the pool's R/s, then 2 dispatches of its tenant's at its 75% share of them, if the rate \
         and the shares hold"
    );
    assert!(
        rust["fair"]["estimate"].as_f64().is_some_and(|s| s > 0.0) && rust["fair"]["dispatch_rate"].as_f64().is_some()
    );
}

#[tokio::test]
async fn explain_tells_how_each_attempt_ended() {
    let failures = Arc::new(AtomicU32::new(0));
    let seen = failures.clone();
    let sched = Scheduler::builder(vec![PoolConfig::new("default")])
        .handler("default", move |_: Payload| {
            let seen = seen.clone();
            async move {
                if seen.fetch_add(1, Ordering::SeqCst) == 0 {
                    return Err(Oops(1));
                }
                Ok(7)
            }
        })
        .build()
        .unwrap();
    let task = sched.submit(Task::new(0).max_retries(1)).await.unwrap();
    assert_eq!(task.result::<i64>().await.unwrap(), 7);
    let why = task.explain().await.unwrap();
    assert_eq!((why.state, why.attempts, why.max_retries, why.waiting), (TaskState::Succeeded, 2, 1, None));
    assert_eq!(why.history.len(), 2);
    assert_eq!(why.history[0].ended, cronoq::Ended::Retried);
    assert!(why.history[0].error.as_deref().is_some_and(|e| e.ends_with("oops 1")), "{:?}", why.history[0]);
    assert_eq!(why.history[1].ended, cronoq::Ended::Succeeded);
    assert!(matches!(sched.explain("0123").await, Err(Error::NotFound(_))));
}
