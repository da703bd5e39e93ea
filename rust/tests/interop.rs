//! The Rust crate against the real broker of this checkout, with Python peers on the other side.
//!
//! (a) a Python worker serves tasks a Rust client submits; (b) a Rust worker serves tasks a Python
//! client submits; (c) the 3:1 fair order through the broker with a Rust client; (d) a token pinned
//! to a tenant, naming another, is refused with PermissionDenied; the client re-sends what is
//! outstanding after the broker crashes and restarts; `explain` reads the broker's answer for a
//! task waiting in a paused pool and for a retried one; a client and a worker given a primary
//! and its standby carry on with the standby after the primary is killed; requests fail at once
//! when no address can be reached; a client and a worker serve every member of a cluster; and
//! `call` (submit and wait in one request) returns the value, the failure or a timeout, and is
//! re-sent to a broker that crashed and came back.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cronoq::{Error, Fairness, Payload, PoolConfig, Priority, ShareBy, Task, TaskState, Value, Worker};
use serde::{Deserialize, Serialize};
use support::{run_python, Broker, Cluster, Scratch};

const LONG: Duration = Duration::from_secs(60);

const PYTHON_WORKER: &str = r#"
import asyncio, sys
import cronoq

async def run(payload):
    if payload == "fail":
        raise ValueError("bad input")
    return {"echo": payload, "by": "python"}

async def main():
    worker = cronoq.Worker(sys.argv[1], [cronoq.Pool("work", run)], concurrency=4, heartbeat_interval=0.2)
    print("python worker starting", flush=True)
    await worker.run()

asyncio.run(main())
"#;

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Job {
    n: u32,
    text: String,
}

#[derive(Debug, Deserialize, PartialEq)]
struct Echo {
    echo: Job,
    by: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_worker_serves_a_rust_client() {
    let dir = Scratch::new("a");
    let broker =
        Broker::start(&dir.0, "[[pools]]\nname = \"work\"\n[[pools]]\nname = \"idle\"\n", "durability = \"none\"", &[]);
    let mut worker = run_python(PYTHON_WORKER, &[&broker.workers], &dir.0, "python-worker");
    worker.wait_for("python worker starting", LONG);
    let sched = cronoq::connect(&broker.clients).await.unwrap();

    // Many submits in flight on one connection.
    let submits = (0..50).map(|n| {
        let sched = sched.clone();
        async move { sched.submit(Task::new(Job { n, text: format!("job {n}") }).pool("work").tenant("acme")).await }
    });
    let handles = futures_join(submits).await;
    for (n, handle) in handles.iter().enumerate() {
        let handle = handle.as_ref().expect("accepted");
        let echo: Echo = handle.result_timeout(LONG).await.unwrap();
        assert_eq!(echo, Echo { echo: Job { n: n as u32, text: format!("job {n}") }, by: "python".into() });
    }
    let info = sched.status(handles[0].as_ref().unwrap().id()).await.unwrap();
    assert_eq!(
        (info.state, info.attempts, info.pool.as_str(), info.tenant.as_deref()),
        (TaskState::Succeeded, 1, "work", Some("acme"))
    );

    // The Python handler's exception arrives as TaskFailed with its type, message and traceback.
    let failing = sched.submit(Task::new("fail").pool("work")).await.unwrap();
    match failing.result::<Value>().await {
        Err(Error::TaskFailed { r#type, message, traceback }) => {
            assert_eq!((r#type.as_str(), message.as_str()), ("ValueError", "bad input"));
            assert!(traceback.contains("Traceback"), "{traceback}");
        }
        other => panic!("expected TaskFailed, got {other:?}"),
    }

    // Deadlines, cancel, unknown pools and ids: the same codes as the Python client.
    let late = sched.submit(Task::new(1).pool("idle").deadline(Duration::from_millis(300))).await.unwrap();
    assert!(matches!(late.result::<Value>().await, Err(Error::DeadlineExceeded(_))));
    let waiting = sched.submit(Task::new(2).pool("idle").priority(Priority::Low)).await.unwrap();
    assert!(sched.cancel(waiting.id()).await.unwrap());
    assert!(matches!(waiting.result::<Value>().await, Err(Error::Cancelled(_))));
    assert!(!sched.cancel(waiting.id()).await.unwrap());
    assert!(matches!(sched.submit(Task::new(3).pool("nope")).await, Err(Error::NotFound(_))));
    assert!(matches!(sched.status("0123456789abcdef0123456789abcdef").await, Err(Error::NotFound(_))));
    assert_eq!(sched.max_payload_bytes(), Some(1 << 20));
    let big = vec![7u8; (1 << 20) + 1];
    assert!(
        matches!(sched.submit(Task::new(serde_bytes_like(big)).pool("work")).await, Err(Error::InvalidArgument(m)) if m.contains("max_payload_bytes"))
    );
    sched.close().await;
}

/// A Vec<u8> serializes as an array of ints; wrap it so that it travels as msgpack bin.
fn serde_bytes_like(bytes: Vec<u8>) -> Value {
    Value::Binary(bytes)
}

async fn futures_join<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let mut out = Vec::new();
    let futures: Vec<F> = futures.collect();
    let mut set = Vec::new();
    for f in futures {
        set.push(tokio::spawn(f));
    }
    for h in set {
        out.push(h.await.unwrap());
    }
    out
}

const PYTHON_CLIENT: &str = r#"
import asyncio, json, sys
import cronoq

async def main():
    async with cronoq.connect(sys.argv[1]) as sched:
        handles = [await sched.submit({"n": n, "text": f"job {n}"}, pool="work", tenant="globex") for n in range(30)]
        results = [await h.result(timeout=60) for h in handles]
        failing = await sched.submit({"n": 13, "text": "fail"}, pool="work")
        try:
            await failing.result(timeout=60)
            failure = None
        except cronoq.TaskFailed as exc:
            failure = {"type": exc.type, "message": exc.message, "code": exc.code}
    print("RESULT " + json.dumps({"results": results, "failure": failure}), flush=True)

asyncio.run(main())
"#;

#[derive(Debug)]
struct Refused(String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "refused: {}", self.0)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_worker_serves_a_python_client() {
    let dir = Scratch::new("b");
    let broker = Broker::start(&dir.0, "[[pools]]\nname = \"work\"\n", "durability = \"none\"", &[]);
    let worker = Worker::new(&broker.workers).concurrency(3).heartbeat(Duration::from_millis(200), 5).pool(
        PoolConfig::new("work"),
        |payload: Payload| async move {
            let job: Job = payload.decode().map_err(|e| Refused(e.to_string()))?;
            if job.text == "fail" {
                return Err(Refused(format!("job {} cannot be done", job.n)));
            }
            Ok(serde_json::json!({"doubled": job.n * 2, "by": "rust"}))
        },
    );
    let stopper = worker.stopper();
    let running = tokio::spawn(worker.run());

    let mut client = run_python(PYTHON_CLIENT, &[&broker.clients], &dir.0, "python-client");
    let out = tokio::task::spawn_blocking(move || client.finish(LONG)).await.unwrap();
    let line = out.lines().find_map(|l| l.strip_prefix("RESULT ")).unwrap_or_else(|| panic!("no result:\n{out}"));
    let got: serde_json::Value = serde_json::from_str(line).unwrap();
    let results = got["results"].as_array().unwrap();
    assert_eq!(results.len(), 30);
    for (n, r) in results.iter().enumerate() {
        assert_eq!(r, &serde_json::json!({"doubled": n * 2, "by": "rust"}));
    }
    assert_eq!(
        got["failure"],
        serde_json::json!({"type": "Refused", "message": "refused: job 13 cannot be done", "code": "TASK_FAILED"})
    );

    stopper.stop().await;
    running.await.unwrap().expect("a graceful stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_three_to_one_order_through_the_broker() {
    let dir = Scratch::new("c");
    // The defaults weigh and cap only tenants not listed: the 3:1 order stays (one slot).
    let pools = "[[pools]]\nname = \"llm\"\ndefault_weight = 2\ndefault_tenant_limit = 4\n\
                 [pools.tenant_weights]\nacme = 3\nglobex = 1\n";
    let broker = Broker::start(&dir.0, pools, "durability = \"none\"", &[]);
    let sched = cronoq::connect(&broker.clients).await.unwrap();
    sched.pause("llm").await.unwrap();
    let mut handles = Vec::new();
    for n in 0..4 {
        let payload = format!("globex-{n}");
        handles.push(sched.submit(Task::new(payload).pool("llm").tenant("globex")).await.unwrap());
    }
    for n in 0..12 {
        let payload = format!("acme-{n}");
        handles.push(sched.submit(Task::new(payload).pool("llm").tenant("acme")).await.unwrap());
    }

    // A worker whose pool says the broker's weights and defaults: agreeing settings are taken.
    let order = Arc::new(Mutex::new(Vec::new()));
    let seen = order.clone();
    let agreeing = || {
        let mut pool = PoolConfig::new("llm").default_weight(2.0).default_tenant_limit(4);
        pool.fairness = Some(Fairness::weights([("acme", 3.0), ("globex", 1.0)]));
        pool
    };
    let pool = agreeing();
    let worker = Worker::new(&broker.workers).concurrency(1).heartbeat(Duration::from_millis(200), 5).pool(
        pool,
        move |p: Payload| {
            let seen = seen.clone();
            async move {
                let name: String = p.decode()?;
                seen.lock().unwrap().push(name);
                Ok::<_, Error>(())
            }
        },
    );
    let stopper = worker.stopper();
    let running = tokio::spawn(worker.run());
    sched.resume("llm").await.unwrap();
    for h in &handles {
        h.result_timeout::<()>(LONG).await.unwrap();
    }
    let letters: String = order.lock().unwrap().iter().map(|t| t.chars().next().unwrap()).collect();
    assert_eq!(letters, "gaaagaaagaaagaaa");
    stopper.stop().await;
    running.await.unwrap().unwrap();

    // A worker whose settings disagree with the broker's config is refused, naming the pool.
    let mut wrong = PoolConfig::new("llm");
    wrong.fairness = Some(Fairness::weights([("acme", 1.0)]));
    let refused = tokio::time::timeout(
        LONG,
        Worker::new(&broker.workers).pool(wrong, |_: Payload| async { Ok::<_, Error>(()) }).run(),
    )
    .await
    .expect("refused at once");
    assert!(matches!(&refused, Err(Error::FailedPrecondition(m)) if m.contains("llm")), "{refused:?}");

    // So is one whose default weight or default ceiling disagrees, naming the setting.
    for (wrong, setting) in [
        (agreeing().default_weight(3.0), "default_weight"),
        (agreeing().default_tenant_limit(5), "default_tenant_limit"),
    ] {
        let refused = tokio::time::timeout(
            LONG,
            Worker::new(&broker.workers).pool(wrong, |_: Payload| async { Ok::<_, Error>(()) }).run(),
        )
        .await
        .expect("refused at once");
        assert!(
            matches!(&refused, Err(Error::FailedPrecondition(m)) if m.contains("llm") && m.contains(setting)),
            "{refused:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn costs_reach_the_broker_and_a_worker_declares_shares_rates_and_minimums() {
    let dir = Scratch::new("s");
    let pools = "[[pools]]\nname = \"llm\"\nshare_by = \"cost\"\nfair_share = true\n\
                 [pools.tenant_rates]\ntrial = 0.5\n[pools.tenant_minimums]\nacme = 1\n";
    let broker = Broker::start(&dir.0, pools, "durability = \"none\"", &[]);
    let sched = cronoq::connect(&broker.clients).await.unwrap();
    sched.pause("llm").await.unwrap();
    let mut handles = Vec::new();
    for n in 0..8 {
        let task = Task::new(format!("light-{n}")).pool("llm").tenant("light").cost(1.0);
        handles.push(sched.submit(task).await.unwrap());
    }
    for n in 0..3 {
        let task = Task::new(format!("heavy-{n}")).pool("llm").tenant("heavy").cost(4.0);
        handles.push(sched.submit(task).await.unwrap());
    }
    // The broker's `info` tells each task's cost (None: submitted without one, it counts 1).
    assert_eq!(sched.status(handles[0].id()).await.unwrap().cost, Some(1.0));
    assert_eq!(handles[8].status().await.unwrap().cost, Some(4.0));
    assert_eq!(handles[8].explain().await.unwrap().cost, Some(4.0));
    let plain = sched.submit(Task::new("plain").pool("llm").tenant("light")).await.unwrap();
    assert_eq!(plain.status().await.unwrap().cost, None);
    assert!(plain.cancel().await.unwrap());
    let refused = sched.submit(Task::new("x").pool("llm").cost(f64::NAN)).await;
    assert!(matches!(&refused, Err(Error::InvalidArgument(m)) if m.contains("cost")), "{refused:?}");

    // The worker says the broker's settings: agreeing ones are taken.
    let agreeing = || {
        let mut pool =
            PoolConfig::new("llm").share_by(ShareBy::Cost).tenant_rate("trial", 0.5).tenant_minimum("acme", 1);
        pool.fairness = Some(Fairness::equal());
        pool
    };
    let order = Arc::new(Mutex::new(String::new()));
    let seen = order.clone();
    let worker = Worker::new(&broker.workers).concurrency(1).heartbeat(Duration::from_millis(200), 5).pool(
        agreeing(),
        move |p: Payload| {
            let seen = seen.clone();
            async move {
                let name: String = p.decode()?;
                seen.lock().unwrap().push(name.chars().next().unwrap());
                Ok::<_, Error>(())
            }
        },
    );
    let stopper = worker.stopper();
    let running = tokio::spawn(worker.run());
    sched.resume("llm").await.unwrap();
    for h in &handles {
        h.result_timeout::<()>(LONG).await.unwrap();
    }
    // Each heavy task costs four light ones: the broker read every task's cost.
    assert_eq!(order.lock().unwrap().as_str(), "lhllllhlllh");
    stopper.stop().await;
    running.await.unwrap().unwrap();

    // A worker that disagrees on what a share counts is refused, naming the pool.
    let wrong = agreeing().share_by(ShareBy::Runtime);
    let refused = tokio::time::timeout(
        LONG,
        Worker::new(&broker.workers).pool(wrong, |_: Payload| async { Ok::<_, Error>(()) }).run(),
    )
    .await
    .expect("refused at once");
    assert!(matches!(&refused, Err(Error::FailedPrecondition(m)) if m.contains("llm")), "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_token_naming_another_tenant_is_refused() {
    let dir = Scratch::new("d");
    let body = "[[pools]]\nname = \"work\"\n\n[[auth.tokens]]\ntoken_env = \"T_CLIENT\"\nrole = \"client\"\ntenant = \"acme\"\n\n[[auth.tokens]]\ntoken_env = \"T_ADMIN\"\nrole = \"admin\"\n";
    let broker = Broker::start(
        &dir.0,
        body,
        "durability = \"none\"",
        &[("T_CLIENT", "client-secret"), ("T_ADMIN", "admin-secret")],
    );
    let sched = cronoq::connect(&broker.clients).token("client-secret").await.unwrap();
    let refused = sched.submit(Task::new("x").pool("work").tenant("globex")).await;
    assert!(matches!(&refused, Err(Error::PermissionDenied(_))), "{refused:?}");
    assert_eq!(refused.unwrap_err().code(), "PERMISSION_DENIED");
    let mine = sched.submit(Task::new("x").pool("work")).await.unwrap();
    assert_eq!(sched.status(mine.id()).await.unwrap().tenant.as_deref(), Some("acme"));
    assert!(matches!(sched.pause("work").await, Err(Error::PermissionDenied(_))));

    // An unknown token is refused when the client is made.
    let refused = cronoq::connect(&broker.clients).token("nobody").await;
    assert!(matches!(&refused, Err(Error::Unauthenticated(m)) if m.contains("unknown token")), "{refused:?}");
    let stranger = cronoq::connect(&broker.clients)
        .token("nobody")
        .request_timeout(Duration::from_secs(10))
        .lazy(true)
        .await
        .unwrap();
    // The broker answers an unknown connection once a second: the refusal of its `hello` fails the
    // submit at once, not after the request timeout.
    let t0 = std::time::Instant::now();
    assert!(matches!(stranger.submit(Task::new("x").pool("work")).await, Err(Error::Unauthenticated(_))));
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_resends_after_the_broker_restarts() {
    let dir = Scratch::new("e");
    let mut broker = Broker::durable(&dir.0, "work");
    let sched = cronoq::connect(&broker.clients).await.unwrap();
    let before = sched.submit(Task::new(Job { n: 1, text: "before".into() }).pool("work")).await.unwrap();

    broker.crash_and_restart();
    // Submitted while the new broker may still be starting: queued, re-sent, accepted once.
    let after = sched.submit(Task::new(Job { n: 2, text: "after".into() }).pool("work")).await.unwrap();
    let mut worker = run_python(PYTHON_WORKER, &[&broker.workers], &dir.0, "python-worker");
    worker.wait_for("python worker starting", LONG);
    let first: Echo = before.result_timeout(LONG).await.unwrap();
    let second: Echo = after.result_timeout(LONG).await.unwrap();
    assert_eq!((first.echo.n, second.echo.n), (1, 2));
    assert!(sched.reconnects() >= 1, "the monitor saw the new connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curve_encrypts_client_and_worker() {
    let dir = Scratch::new("f");
    let keys = dir.0.join("keys");
    let mut keygen = support::Proc::spawn(
        &["-m", "cronoq.client.cli", "keygen", "--dir", keys.to_str().unwrap()],
        &dir.0.join("keygen.log"),
        &[],
    );
    keygen.finish(LONG);
    let secret = keys.join("broker.key_secret");
    let public = keys.join("broker.key");
    let broker = Broker::start(
        &dir.0,
        "[[pools]]\nname = \"work\"\n",
        &format!("durability = \"none\"\ncurve_secret_key_file = \"{}\"", secret.display()),
        &[],
    );
    let worker = Worker::new(&broker.workers)
        .curve_server_key(public.to_str().unwrap())
        .heartbeat(Duration::from_millis(200), 5)
        .pool(
            PoolConfig::new("work"),
            |p: Payload| async move { Ok::<_, Error>(p.decode::<String>()?.to_uppercase()) },
        );
    let stopper = worker.stopper();
    let running = tokio::spawn(worker.run());
    let sched = cronoq::connect(&broker.clients).curve_server_key(public.to_str().unwrap()).await.unwrap();
    let task = sched.submit(Task::new("secret").pool("work")).await.unwrap();
    assert_eq!(task.result_timeout::<String>(LONG).await.unwrap(), "SECRET");

    // Without the key, or with another broker's, the handshake cannot succeed and nothing is sent in
    // clear: requests fail with Error::Connection naming the mistake, long before their request_timeout
    // (LONG bounds the wait, so waiting it out would fail the test).
    let plain = cronoq::connect(&broker.clients).request_timeout(Duration::from_secs(600)).lazy(true).await.unwrap();
    let refused = tokio::time::timeout(LONG, plain.ping()).await.expect("failed before its request_timeout");
    // The mismatch is named when libzmq reports it; on a busy machine the broker may drop the connection
    // first, and the answer says so and gives the same remedy. Either way: CURVE, and give the public key.
    assert!(
        matches!(&refused, Err(Error::Connection { message: m, .. })
            if m.contains("is encrypted (CURVE): give its public key")
                || m.contains("dropped the connection during the handshake: if it is encrypted (CURVE), give its public key")),
        "{refused:?}"
    );
    let mut other_keygen = support::Proc::spawn(
        &["-m", "cronoq.client.cli", "keygen", "--dir", dir.0.join("other").to_str().unwrap()],
        &dir.0.join("keygen-other.log"),
        &[],
    );
    other_keygen.finish(LONG);
    let wrong = cronoq::connect(&broker.clients)
        .curve_server_key(dir.0.join("other").join("broker.key").to_str().unwrap())
        .request_timeout(Duration::from_secs(600))
        .lazy(true)
        .await
        .unwrap();
    let refused = tokio::time::timeout(LONG, wrong.submit(Task::new("x").pool("work")))
        .await
        .expect("failed before its request_timeout");
    assert!(
        matches!(&refused, Err(Error::Connection { message: m, .. }) if m.contains("CURVE handshake with") && m.contains("is not this broker's")),
        "{refused:?}"
    );
    // And so does every later request, at once, until a handshake succeeds.
    assert!(matches!(wrong.ping().await, Err(Error::Connection { message: m, .. }) if m.contains("CURVE handshake")));
    // A worker without the key cannot serve: it stops, saying why, instead of trying for ever.
    let keyless = Worker::new(&broker.workers).pool(PoolConfig::new("work"), |_: Payload| async { Ok::<_, Error>(()) });
    let stopped = tokio::time::timeout(LONG, keyless.run()).await.expect("stopped at once");
    assert!(
        matches!(&stopped, Err(Error::Connection { address, message: m }) if m.contains("is encrypted (CURVE)") && address == &broker.workers),
        "{stopped:?}"
    );
    assert!(matches!(
        cronoq::connect(&broker.clients).curve_server_key("not a key").await,
        Err(Error::InvalidArgument(_))
    ));
    stopper.stop().await;
    running.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_fail_at_once_when_no_address_ever_takes_the_connection() {
    // Nothing listens on these ports: every connection is refused. The requests fail with
    // Error::Connection naming that once the refusals have gone on for a second, not after their
    // request_timeout of ten minutes (LONG bounds the wait: waiting it out fails the test).
    let closed = format!("tcp://127.0.0.1:{}", support::free_port());
    // Lazily: the client is made without asking the broker; its requests meet the refusals.
    let sched = cronoq::connect(&closed).request_timeout(Duration::from_secs(600)).lazy(true).await.unwrap();
    let refused =
        tokio::time::timeout(LONG, sched.submit(Task::new("x"))).await.expect("failed before its request_timeout");
    assert!(
        matches!(&refused, Err(Error::Connection { address, message: m })
            if m.contains(&format!("connection refused at {closed}")) && address == &closed),
        "{refused:?}"
    );
    let refused = refused.unwrap_err();
    assert_eq!((refused.code(), refused.is_local()), ("UNAVAILABLE", true));
    assert!(matches!(sched.status("0123456789abcdef0123456789abcdef").await, Err(Error::Connection { .. })));

    // A primary and its standby, both refusing: hopeless only once every address is.
    let standby = format!("tcp://127.0.0.1:{}", support::free_port());
    let both = cronoq::connect([closed.as_str(), standby.as_str()])
        .request_timeout(Duration::from_secs(600))
        .lazy(true)
        .await
        .unwrap();
    let refused = tokio::time::timeout(LONG, both.ping()).await.expect("failed before its request_timeout");
    assert!(
        matches!(&refused, Err(Error::Connection { message: m, .. }) if m.contains(&closed) && m.contains(&standby)),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sizes_are_checked_where_they_are_made() {
    let dir = Scratch::new("g");
    let broker =
        Broker::start(&dir.0, "[[pools]]\nname = \"work\"\n", "durability = \"none\"\nmax_payload_bytes = 4096", &[]);
    let worker = Worker::new(&broker.workers).heartbeat(Duration::from_millis(200), 5).pool(
        PoolConfig::new("work"),
        |p: Payload| async move {
            match p.decode::<String>().map_err(|e| Refused(e.to_string()))?.as_str() {
                "big result" => Ok("r".repeat(10_000)),
                "long failure" => Err(Refused("e".repeat(100_000))),
                other => Ok(other.to_string()),
            }
        },
    );
    let stopper = worker.stopper();
    let running = tokio::spawn(worker.run());
    let sched = cronoq::connect(&broker.clients).await.unwrap();

    // The client refuses a payload over the broker's limit itself, naming both sizes.
    let refused = sched.submit(Task::new("p".repeat(5000)).pool("work")).await;
    assert!(matches!(&refused, Err(Error::InvalidArgument(m)) if m.contains("4096")), "{refused:?}");
    // The worker does not send a result over it: that task fails, and the connection stays.
    let big = sched.submit(Task::new("big result").pool("work")).await.unwrap();
    match big.result::<String>().await {
        Err(Error::TaskFailed { r#type, message, .. }) => {
            assert_eq!(r#type, "InvalidArgument");
            assert!(message.contains("max_payload_bytes = 4096"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // A failure's text is cut to a bounded size, keeping its start and end.
    let long = sched.submit(Task::new("long failure").pool("work")).await.unwrap();
    match long.result::<String>().await {
        Err(Error::TaskFailed { message, .. }) => {
            assert!(message.len() <= 8 * 1024 && message.contains("bytes cut"), "{}", message.len());
        }
        other => panic!("{other:?}"),
    }
    // The worker still serves, and another connection reads a result by id.
    let fine = sched.submit(Task::new("fine").pool("work")).await.unwrap();
    let other = cronoq::connect(&broker.clients).await.unwrap();
    assert_eq!(other.result::<String>(fine.id()).await.unwrap(), "fine");
    stopper.stop().await;
    running.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_says_why_a_task_waits_and_how_its_attempts_ended() {
    let dir = Scratch::new("h");
    let body = "[[pools]]\nname = \"llm\"\nfair_share = true\n\n[[auth.tokens]]\ntoken_env = \"T_ACME\"\nrole = \"client\"\ntenant = \"acme\"\n\n[[auth.tokens]]\ntoken_env = \"T_ADMIN\"\nrole = \"admin\"\n\n[[auth.tokens]]\ntoken_env = \"T_WORKER\"\nrole = \"worker\"\n";
    let broker = Broker::start(
        &dir.0,
        body,
        "durability = \"none\"",
        &[("T_ACME", "acme-secret"), ("T_ADMIN", "admin-secret"), ("T_WORKER", "worker-secret")],
    );
    let sched = cronoq::connect(&broker.clients).token("admin-secret").await.unwrap();

    // Queued behind two others of its tenant in a paused pool that no worker serves yet.
    sched.pause("llm").await.unwrap();
    let mut handles = Vec::new();
    for n in 0..3 {
        handles.push(sched.submit(Task::new(n).pool("llm").tenant("acme")).await.unwrap());
    }
    let why = sched.explain(handles[2].id()).await.unwrap();
    assert_eq!(
        (why.id.as_str(), why.state, why.tenant.as_deref(), why.attempts, why.max_retries),
        (handles[2].id(), TaskState::Queued, Some("acme"), 0, 0)
    );
    assert!(why.history.is_empty() && why.submitted_at > 1e9, "{why:?}");
    let waiting = why.waiting.expect("a queued task says what it waits for");
    assert!(waiting.paused && waiting.fair && waiting.estimate.is_none(), "{waiting:?}");
    assert!(waiting.estimate_note.contains("paused"), "{}", waiting.estimate_note);
    assert_eq!((waiting.queue_ahead, waiting.queue_length, waiting.higher_classes_ahead), (Some(2), 3, 0));
    assert_eq!((waiting.workers, waiting.running), (0, 0));
    assert_eq!(waiting.nodes.iter().map(|n| (n.name.as_str(), n.share)).collect::<Vec<_>>(), [("acme", 1.0)]);
    // The handle explains its task as the client does (only the estimate's clock may move).
    let by_handle = handles[2].explain().await.unwrap();
    let by_handle_waiting = by_handle.waiting.clone().expect("still queued");
    assert_eq!((by_handle.id.as_str(), by_handle.state, by_handle.attempts), (handles[2].id(), TaskState::Queued, 0));
    assert_eq!((by_handle_waiting.queue_ahead, by_handle_waiting.paused), (Some(2), true));
    assert_eq!(handles[2].status().await.unwrap().state, TaskState::Queued);

    // A token pinned to another tenant cannot see it: NotFound, as for an id that never existed.
    let globex = sched.submit(Task::new("g").pool("llm").tenant("globex")).await.unwrap();
    let acme = cronoq::connect(&broker.clients).token("acme-secret").await.unwrap();
    assert!(matches!(acme.explain(globex.id()).await, Err(Error::NotFound(_))));
    assert!(matches!(sched.explain("0123456789abcdef0123456789abcdef").await, Err(Error::NotFound(_))));
    assert!(acme.explain(handles[0].id()).await.is_ok());

    // A task whose first run fails is retried; its explanation lists both attempts.
    let calls = Arc::new(Mutex::new(0u32));
    let counted = calls.clone();
    let worker = Worker::new(&broker.workers).token("worker-secret").heartbeat(Duration::from_millis(200), 5).pool(
        PoolConfig::new("llm"),
        move |p: Payload| {
            let counted = counted.clone();
            async move {
                let text: Value = p.decode().map_err(|e| Refused(e.to_string()))?;
                let call = {
                    let mut calls = counted.lock().unwrap();
                    *calls += 1;
                    *calls
                };
                if text.as_str() == Some("flaky") && call == 1 {
                    return Err(Refused("not yet".into()));
                }
                Ok(text)
            }
        },
    );
    let stopper = worker.stopper();
    let running = tokio::spawn(worker.run());
    sched.resume("llm").await.unwrap();
    for h in &handles {
        h.result_timeout::<Value>(LONG).await.unwrap();
    }
    globex.result_timeout::<Value>(LONG).await.unwrap();
    *calls.lock().unwrap() = 0;
    let flaky = sched.submit(Task::new("flaky").pool("llm").tenant("acme").max_retries(2)).await.unwrap();
    assert_eq!(flaky.result_timeout::<String>(LONG).await.unwrap(), "flaky");
    let why = sched.explain(flaky.id()).await.unwrap();
    assert_eq!((why.state, why.attempts, why.max_retries, why.waiting), (TaskState::Succeeded, 2, 2, None));
    assert_eq!(flaky.explain().await.unwrap().history, why.history);
    let ends: Vec<_> = why.history.iter().map(|e| (e.attempt, e.ended.clone(), e.error.clone())).collect();
    assert_eq!(
        ends,
        [
            (1, cronoq::Ended::Retried, Some("Refused: refused: not yet".to_string())),
            (2, cronoq::Ended::Succeeded, None)
        ]
    );
    assert!(why.history.iter().all(|e| e.at.is_some()), "{:?}", why.history);
    stopper.stop().await;
    running.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_and_worker_follow_the_standby_that_takes_over() {
    let dir = Scratch::new("i");
    let mut primary = Broker::durable(&dir.0, "work");
    let mut standby = primary.standby();

    // No address at all is the caller's mistake, named.
    for none in [vec![], vec![" , ".to_string()]] {
        let refused = cronoq::connect(none.clone()).await;
        assert!(matches!(&refused, Err(Error::InvalidArgument(m)) if m.contains("broker address")), "{refused:?}");
        let refused = Worker::new(none).pool(PoolConfig::new("work"), |_: Payload| async { Ok::<_, Error>(()) }).run();
        assert!(matches!(refused.await, Err(Error::InvalidArgument(_))));
    }

    // The primary first, then its standby, which refuses connections while it stands by: the client
    // (a list) and the worker (one string with a comma) are served by the primary.
    let sched = cronoq::connect(vec![primary.clients.clone(), standby.clients.clone()]).await.unwrap();
    let worker = Worker::new(format!("{},{}", primary.workers, standby.workers))
        .heartbeat(Duration::from_millis(200), 5)
        .pool(PoolConfig::new("work"), |p: Payload| async move { Ok::<_, Error>(p.decode::<u32>()? * 2) });
    let stopper = worker.stopper();
    let running = tokio::spawn(worker.run());
    let served = sched.submit(Task::new(1u32).pool("work")).await.unwrap();
    assert_eq!(served.result_timeout::<u32>(LONG).await.unwrap(), 2);

    // A task waiting in a paused pool when the primary dies: its result comes from the standby.
    sched.pause("work").await.unwrap();
    let before = sched.submit(Task::new(2u32).pool("work")).await.unwrap();
    primary.proc.kill();
    // Submitted while no broker serves: held, and sent to the standby once it has taken over.
    let submitting = sched.clone();
    let after = tokio::spawn(async move { submitting.submit(Task::new(3u32).pool("work")).await });
    standby.proc.wait_for("cronoq broker ready", LONG);
    let after = after.await.unwrap().unwrap();
    assert_eq!(sched.status(before.id()).await.unwrap().state, TaskState::Queued, "the journal carried it over");
    sched.resume("work").await.unwrap();
    assert_eq!(before.result_timeout::<u32>(LONG).await.unwrap(), 4);
    assert_eq!(after.result_timeout::<u32>(LONG).await.unwrap(), 6);
    assert!(sched.reconnects() >= 1, "the standby's handshake is a new connection");

    // The worker registered with the standby by itself; a client that only knows the standby's
    // address (and a dead one before it) is served too.
    let late = cronoq::connect([primary.clients.as_str(), standby.clients.as_str()]).await.unwrap();
    let task = late.submit(Task::new(5u32).pool("work")).await.unwrap();
    assert_eq!(task.result_timeout::<u32>(LONG).await.unwrap(), 10);
    stopper.stop().await;
    running.await.unwrap().unwrap();
}

/// The members of a cluster map that list `pool`.
fn owners_of(map: &cronoq::ClusterMap, pool: &str) -> Vec<String> {
    map.members.iter().filter(|m| m.pools.iter().any(|p| p == pool)).map(|m| m.name.clone()).collect()
}

/// Wait until every member's map says `pool` is `owner`'s: a reload reaches the members one by one, and
/// while they disagree a member not yet reloaded refuses the pool's new owner's submissions.
async fn until_every_member_says(cluster: &Cluster, pool: &str, owner: &str) {
    for member in cluster.names() {
        let probe = cronoq::connect(cluster.clients(&member)).routing(false).await.unwrap();
        until(&format!("{member} reloaded: {pool} is {owner}'s"), LONG, || {
            let probe = probe.clone();
            async move { probe.cluster().await.ok().flatten().is_some_and(|map| owners_of(&map, pool) == [owner]) }
        })
        .await;
    }
}

/// Poll `check` every 100 ms until it holds; panic naming `what` after `timeout`.
async fn until<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = std::time::Instant::now() + timeout;
    while !check().await {
        assert!(std::time::Instant::now() < end, "not within {timeout:?}: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_routes_over_a_cluster() {
    let dir = Scratch::new("j");
    let pools = "[[pools]]\nname = \"one\"\nmember = \"b1\"\n[[pools]]\nname = \"two\"\nmember = \"b2\"\n";
    let cluster = Cluster::start(&dir.0, &["b1", "b2"], pools, "durability = \"none\"");
    let serve = |address: String, pool: &str| {
        let worker = Worker::new(address)
            .heartbeat(Duration::from_millis(200), 5)
            .pool(PoolConfig::new(pool), |p: Payload| async move {
                Ok::<_, Error>(format!("{} done", p.decode::<String>()?))
            });
        (worker.stopper(), tokio::spawn(worker.run()))
    };
    let (stop_one, serving_one) = serve(cluster.workers("b1"), "one");
    let (stop_two, serving_two) = serve(cluster.workers("b2"), "two");

    // A member talked to alone refuses the other's pool, naming the owner (as before routing).
    let direct = cronoq::connect(cluster.clients("b1")).routing(false).await.unwrap();
    let refused = direct.submit(Task::new("x").pool("two")).await;
    assert!(
        matches!(&refused, Err(Error::NotOwner { pool, member, message })
            if pool == "two" && member == "b2" && message.contains("b2")),
        "{refused:?}"
    );
    assert_eq!(refused.unwrap_err().code(), "FAILED_PRECONDITION");

    // A client that knows b1 only: each pool's submits go to its owner, the ids name it.
    let sched = cronoq::connect(cluster.clients("b1")).await.unwrap();
    let one = sched.submit(Task::new("a").pool("one")).await.unwrap();
    let two = sched.submit(Task::new("b").pool("two")).await.unwrap();
    assert!(one.id().starts_with("b1:") && two.id().starts_with("b2:"), "{} {}", one.id(), two.id());
    assert_eq!(one.result_timeout::<String>(LONG).await.unwrap(), "a done");
    assert_eq!(two.result_timeout::<String>(LONG).await.unwrap(), "b done");
    // By id, from the client (and from a client that never submitted): the member the id names.
    let info = sched.status(two.id()).await.unwrap();
    assert_eq!((info.state, info.pool.as_str()), (TaskState::Succeeded, "two"));
    assert_eq!(sched.explain(two.id()).await.unwrap().state, TaskState::Succeeded);
    let other = cronoq::connect(cluster.clients("b1")).await.unwrap();
    assert_eq!(other.result::<String>(two.id()).await.unwrap(), "b done");
    assert!(matches!(direct.status(two.id()).await, Err(Error::NotFound(_))), "b1 alone does not know b2's task");

    // pause, cancel and resume reach the owner of the pool, or of the task.
    sched.pause("two").await.unwrap();
    let waiting = sched.submit(Task::new("c").pool("two")).await.unwrap();
    let kept = sched.submit(Task::new("d").pool("two")).await.unwrap();
    assert_eq!(other.explain(waiting.id()).await.unwrap().waiting.map(|w| w.paused), Some(true));
    assert!(other.cancel(waiting.id()).await.unwrap());
    assert_eq!(waiting.status().await.unwrap().state, TaskState::Cancelled);
    sched.resume("two").await.unwrap();
    assert_eq!(kept.result_timeout::<String>(LONG).await.unwrap(), "d done");
    // A call, given b1, goes to b2, which owns the pool (b1 would refuse it).
    assert_eq!(sched.call::<String>(Task::new("g").pool("two")).await.unwrap(), "g done");
    assert!(matches!(sched.submit(Task::new("e").pool("nobody")).await, Err(Error::NotFound(_))));

    // stats: every member's, merged, each pool naming its member.
    let stats = sched.stats().await.unwrap();
    let pool_member = |pool: &str| stats.pools[pool].member.clone().unwrap();
    assert_eq!((pool_member("one"), pool_member("two")), ("b1".to_string(), "b2".to_string()));

    // A reload moves "two" to b1. The client's map still says b2: b2 refuses, naming b1, and the
    // client reads the map again and submits there.
    cluster.write(&pools.replace("member = \"b2\"", "member = \"b1\""), "durability = \"none\"");
    cluster.reload();
    until_every_member_says(&cluster, "two", "b1").await;
    let moved = sched.submit(Task::new("f").pool("two")).await.unwrap();
    assert!(moved.id().starts_with("b1:"), "{}", moved.id());
    assert_eq!(moved.status().await.unwrap().pool, "two");
    let map = sched.cluster().await.unwrap().expect("a member answers with the map");
    assert_eq!(owners_of(&map, "two"), ["b1"]);

    // A member talked to alone still hands out the map.
    assert_eq!(direct.cluster().await.unwrap().map(|m| owners_of(&m, "one")), Some(vec!["b1".to_string()]));
    stop_one.stop().await;
    stop_two.stop().await;
    serving_one.await.unwrap().unwrap();
    serving_two.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_serves_every_member_that_owns_its_pools_and_follows_a_move() {
    let dir = Scratch::new("k");
    let pools =
        "[[pools]]\nname = \"one\"\nmember = \"b1\"\n[[pools]]\nname = \"two\"\nmember = \"b2\"\nmax_in_flight = 1\n";
    let cluster = Cluster::start(&dir.0, &["b1", "b2"], pools, "durability = \"none\"");
    // Tasks whose payload starts with "old" wait for the release.
    let (release, released) = tokio::sync::watch::channel(false);
    // Given b2's address only, it registers with b1 for "one" and with b2 for "two".
    let worker = Worker::new(cluster.workers("b2")).concurrency(2).heartbeat(Duration::from_millis(200), 5);
    let worker = ["one", "two"].iter().fold(worker, |w, pool| {
        let (pool, released) = (pool.to_string(), released.clone());
        w.pool(PoolConfig::new(&pool), move |p: Payload| {
            let (pool, mut released) = (pool.clone(), released.clone());
            async move {
                let text = p.decode::<String>()?;
                if text.starts_with("old") {
                    let _ = released.wait_for(|r| *r).await;
                }
                Ok::<_, Error>(format!("{text} in {pool}"))
            }
        })
    });
    let stopper = worker.stopper();
    let serving = tokio::spawn(worker.run());
    let sched = cronoq::connect(cluster.clients("b1")).await.unwrap();
    let one = sched.submit(Task::new("a").pool("one")).await.unwrap();
    let two = sched.submit(Task::new("b").pool("two")).await.unwrap();
    assert!(one.id().starts_with("b1:") && two.id().starts_with("b2:"));
    assert_eq!(one.result_timeout::<String>(LONG).await.unwrap(), "a in one");
    assert_eq!(two.result_timeout::<String>(LONG).await.unwrap(), "b in two");
    let b2 = cronoq::connect(cluster.clients("b2")).routing(false).await.unwrap();
    assert_eq!(b2.stats().await.unwrap().workers, 1, "the worker serves b2");

    // Held on b2 (one running, the others queued behind max_in_flight) when a reload moves "two"
    // to b1. The worker reads the new map from its members: it serves "two" on b1 from then on, and
    // on b2 until b2 has drained it; then it leaves b2, which owns nothing of it any more.
    let mut old = Vec::new();
    for n in 0..3 {
        old.push(sched.submit(Task::new(format!("old-{n}")).pool("two")).await.unwrap());
    }
    assert!(old.iter().all(|h| h.id().starts_with("b2:")));
    cluster.write(&pools.replace("member = \"b2\"", "member = \"b1\""), "durability = \"none\"");
    cluster.reload();
    until_every_member_says(&cluster, "two", "b1").await;
    let moved = sched.submit(Task::new("new").pool("two")).await.unwrap();
    assert!(moved.id().starts_with("b1:"), "{}", moved.id());
    assert_eq!(moved.result_timeout::<String>(LONG).await.unwrap(), "new in two");
    release.send(true).unwrap();
    for (n, h) in old.iter().enumerate() {
        assert_eq!(h.result_timeout::<String>(LONG).await.unwrap(), format!("old-{n} in two"), "drained on b2");
    }
    until("the worker left b2", LONG, || {
        let b2 = b2.clone();
        async move { b2.stats().await.is_ok_and(|stats| stats.workers == 0) }
    })
    .await;
    stopper.stop().await;
    serving.await.unwrap().expect("a graceful stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_is_never_lost() {
    let dir = Scratch::new("stop");
    let broker = Broker::start(&dir.0, "[[pools]]\nname = \"work\"\n", "durability = \"none\"", &[]);
    let worker =
        || Worker::new(&broker.workers).pool(PoolConfig::new("work"), |_: Payload| async { Ok::<_, Error>(()) });
    // Right after spawning: the spawned `run` has not been polled yet when the stop is asked.
    let spawned = worker();
    let stopper = spawned.stopper();
    let running = tokio::spawn(spawned.run());
    tokio::time::timeout(LONG, stopper.stop()).await.expect("stop returned");
    tokio::time::timeout(LONG, running).await.expect("run returned").unwrap().unwrap();
    // Before `run` at all: it returns at once, having served nothing.
    let unstarted = worker();
    let stopper = unstarted.stopper();
    stopper.stop().await;
    tokio::time::timeout(LONG, unstarted.run()).await.expect("run returned at once").unwrap();
    // While it serves, and again after it returned: both return.
    let serving = worker();
    let stopper = serving.stopper();
    let running = tokio::spawn(serving.run());
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::time::timeout(LONG, stopper.stop()).await.expect("stop returned");
    running.await.unwrap().unwrap();
    tokio::time::timeout(LONG, stopper.stop()).await.expect("a second stop returns at once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_result_future_withdraws_its_wait() {
    // The broker holds at most 1,024 waits per task. A `result()` dropped by `tokio::time::timeout`
    // must withdraw its wait, or after 1,024 of them every client's `result` of the task fails with
    // ResourceExhausted.
    let dir = Scratch::new("unwait");
    let broker = Broker::start(&dir.0, "[[pools]]\nname = \"work\"\n", "durability = \"none\"", &[]);
    let client = cronoq::connect(&broker.clients).await.unwrap();
    let task = client.submit(Task::new("later").pool("work")).await.unwrap(); // no worker yet: it waits
    for _ in 0..1100 {
        let dropped = tokio::time::timeout(Duration::from_millis(2), client.result::<String>(task.id())).await;
        assert!(dropped.is_err(), "the task has no worker: its result cannot come");
    }
    client.ping().await.unwrap(); // every wait and unwait above has reached the broker
    let other = cronoq::connect(&broker.clients).await.unwrap();
    let waited = other.result_timeout::<String>(task.id(), Duration::from_millis(200)).await;
    assert!(matches!(waited, Err(Error::Timeout(_))), "{waited:?}");
    let worker = Worker::new(&broker.workers).pool(PoolConfig::new("work"), |p: Payload| async move {
        Ok::<_, Error>(p.decode::<String>()?.to_uppercase())
    });
    let stopper = worker.stopper();
    let running = tokio::spawn(worker.run());
    let waiting = tokio::spawn({
        let other = other.clone();
        let id = task.id().to_string();
        async move { other.result_timeout::<String>(&id, LONG).await }
    });
    assert_eq!(client.result_timeout::<String>(task.id(), LONG).await.unwrap(), "LATER");
    assert_eq!(waiting.await.unwrap().unwrap(), "LATER");
    stopper.stop().await;
    running.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mistakes_are_named_at_once() {
    let dir = Scratch::new("mistakes");
    let broker = Broker::start(&dir.0, "[[pools]]\nname = \"work\"\n", "durability = \"none\"", &[]);
    let noop = |_: Payload| async { Ok::<_, Error>(()) };

    // A client given the broker's worker endpoint: refused when it is made, naming the right one.
    let refused = tokio::time::timeout(LONG, cronoq::connect(&broker.workers)).await.expect("at once");
    assert!(
        matches!(&refused, Err(Error::WrongEndpoint { address, message })
            if address == &broker.workers && message.contains(&broker.clients)),
        "{refused:?}"
    );
    assert_eq!(refused.unwrap_err().code(), "INVALID_ARGUMENT");
    // A worker given its client endpoint: run() stops at once, naming the right one.
    let stopped = tokio::time::timeout(LONG, Worker::new(&broker.clients).pool(PoolConfig::new("work"), noop).run())
        .await
        .expect("stopped at once");
    assert!(
        matches!(&stopped, Err(Error::WrongEndpoint { message, .. }) if message.contains(&broker.workers)),
        "{stopped:?}"
    );

    // A dead address: connect fails once the connections have been refused for a second (the
    // Python client's first request takes as long), not after the request timeout. It is this
    // side's finding (Error::Connection, is_local), not a broker's UNAVAILABLE.
    let closed = format!("tcp://127.0.0.1:{}", support::free_port());
    let started = std::time::Instant::now();
    let refused = cronoq::connect(&closed).request_timeout(Duration::from_secs(600)).await;
    assert!(
        matches!(&refused, Err(e @ Error::Connection { address, message })
            if message.contains(&format!("connection refused at {closed}")) && address == &closed && e.is_local()),
        "{refused:?}"
    );
    assert!(started.elapsed() < LONG, "failed before its request_timeout");

    // A token variable that is not set: named, before anything is sent.
    let variable = "CRONOQ_TEST_TOKEN_THAT_IS_NOT_SET";
    let missing = cronoq::connect(&broker.clients).token_env(variable).await;
    assert!(matches!(&missing, Err(Error::MissingToken { variable: v }) if v == variable), "{missing:?}");
    assert!(missing.unwrap_err().to_string().contains(variable));
    let missing = Worker::new(&broker.workers).token_env(variable).pool(PoolConfig::new("work"), noop).run().await;
    assert!(matches!(&missing, Err(Error::MissingToken { .. })), "{missing:?}");
    // Concurrency 0 is refused, as the embedded scheduler refuses it.
    let zero = Worker::new(&broker.workers).concurrency(0).pool(PoolConfig::new("work"), noop).run().await;
    assert!(matches!(&zero, Err(Error::InvalidArgument(m)) if m.contains("concurrency")), "{zero:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_token_is_explained_the_rust_way() {
    let dir = Scratch::new("notoken");
    let broker = Broker::start(
        &dir.0,
        "[[pools]]\nname = \"work\"\n[[auth.tokens]]\ntoken_env = \"CRONOQ_T_CLIENT\"\nrole = \"client\"\n",
        "durability = \"none\"",
        &[("CRONOQ_T_CLIENT", "client-secret")],
    );
    let refused = tokio::time::timeout(LONG, cronoq::connect(&broker.clients)).await.expect("at once");
    assert!(
        matches!(&refused, Err(Error::Unauthenticated(m)) if m.contains(".token(") && !m.contains("cronoq.connect")),
        "{refused:?}"
    );
    // The variable, when set, is read when the client is made.
    std::env::set_var("CRONOQ_T_CLIENT_FOR_RUST", "client-secret");
    let client = cronoq::connect(&broker.clients).token_env("CRONOQ_T_CLIENT_FOR_RUST").await.unwrap();
    client.ping().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_returns_the_value_the_failure_or_a_timeout() {
    let dir = Scratch::new("call");
    let pools = "[[pools]]\nname = \"work\"\n[[pools]]\nname = \"held\"\n";
    let broker = Broker::start(&dir.0, pools, "durability = \"none\"", &[]);
    // "held" runs a task only when the test lets one go, and records that it ran.
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let finished = Arc::new(Mutex::new(Vec::<String>::new()));
    let held = {
        let (release, finished) = (release.clone(), finished.clone());
        move |payload: Payload| {
            let (release, finished) = (release.clone(), finished.clone());
            async move {
                release.acquire().await.expect("never closed").forget();
                let text: String = payload.decode()?;
                finished.lock().unwrap().push(text.clone());
                Ok::<_, Error>(text)
            }
        }
    };
    let worker = Worker::new(&broker.workers)
        .concurrency(4)
        .heartbeat(Duration::from_millis(200), 5)
        .pool(PoolConfig::new("work"), |payload: Payload| async move {
            let job: Job = payload.decode().map_err(|e| Refused(e.to_string()))?;
            if job.text == "fail" {
                return Err(Refused(format!("job {} cannot be done", job.n)));
            }
            Ok(Job { n: job.n * 2, text: job.text })
        })
        .pool(PoolConfig::new("held"), held);
    let stopper = worker.stopper();
    let running = tokio::spawn(worker.run());
    let sched = cronoq::connect(&broker.clients).await.unwrap();

    let call = sched.call(Task::new(Job { n: 21, text: "x".into() }).pool("work").tenant("acme"));
    let doubled: Job = tokio::time::timeout(LONG, call).await.expect("the outcome answers the call").unwrap();
    assert_eq!(doubled, Job { n: 42, text: "x".into() });
    // Many calls in flight on one connection, each answered with its own task's value.
    let calls = (0..20).map(|n| {
        let sched = sched.clone();
        async move { sched.call::<Job>(Task::new(Job { n, text: "many".into() }).pool("work")).await }
    });
    for (n, value) in futures_join(calls).await.into_iter().enumerate() {
        assert_eq!(value.unwrap().n, 2 * n as u32);
    }
    // The handler's error comes back as TaskFailed, as from `result`; refusals as from `submit`.
    match sched.call::<Value>(Task::new(Job { n: 13, text: "fail".into() }).pool("work")).await {
        Err(Error::TaskFailed { r#type, message, .. }) => {
            assert_eq!((r#type.as_str(), message.as_str()), ("Refused", "refused: job 13 cannot be done"));
        }
        other => panic!("expected TaskFailed, got {other:?}"),
    }
    assert!(matches!(sched.call::<Value>(Task::new(1).pool("nope")).await, Err(Error::NotFound(_))));
    let big = Task::new(serde_bytes_like(vec![7u8; (1 << 20) + 1])).pool("work");
    assert!(
        matches!(sched.call::<Value>(big).await, Err(Error::InvalidArgument(m)) if m.contains("max_payload_bytes"))
    );

    // Past its timeout: Timeout, naming the pool, and the task goes on to its end.
    let late = sched.call_timeout::<String>(Task::new("late").pool("held"), Duration::from_millis(300)).await;
    assert!(
        matches!(&late, Err(Error::Timeout(m)) if m.contains("pool \"held\"") && m.contains("within 0.3 s")),
        "{late:?}"
    );
    release.add_permits(1);
    until("the timed-out call's task ran to its end", LONG, || {
        let finished = finished.clone();
        async move { *finished.lock().unwrap() == ["late"] }
    })
    .await;
    // A call dropped by the caller (a `select!` that lost) is forgotten the same way.
    let dropped =
        tokio::time::timeout(Duration::from_millis(100), sched.call::<String>(Task::new("dropped").pool("held")));
    assert!(dropped.await.is_err(), "nothing lets the task run yet");
    release.add_permits(1);
    until("the dropped call's task ran to its end", LONG, || {
        let finished = finished.clone();
        async move { finished.lock().unwrap().len() == 2 }
    })
    .await;
    // The late outcomes of both reached a connection that no longer waits for them: the next call
    // on it gets its own value.
    release.add_permits(1);
    assert_eq!(sched.call_timeout::<String>(Task::new("next").pool("held"), LONG).await.unwrap(), "next");

    stopper.stop().await;
    running.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_is_resent_to_a_broker_that_crashed_and_finds_its_first_task() {
    let dir = Scratch::new("call-restart");
    let mut broker = Broker::durable(&dir.0, "work");
    let sched = cronoq::connect(&broker.clients).await.unwrap();
    let pending = tokio::spawn({
        let sched = sched.clone();
        async move { sched.call_timeout::<String>(Task::new("once").pool("work"), LONG).await }
    });
    // No worker yet: the task waits in the broker's journal when the broker is killed.
    until("the call's task is queued", LONG, || {
        let sched = sched.clone();
        async move { sched.stats().await.unwrap().pools["work"].queued == 1 }
    })
    .await;
    broker.crash_and_restart();
    let worker = Worker::new(&broker.workers).concurrency(2).heartbeat(Duration::from_millis(200), 5).pool(
        PoolConfig::new("work"),
        |p: Payload| async move { Ok::<_, Error>(p.decode::<String>()?.to_uppercase()) },
    );
    let stopper = worker.stopper();
    let running = tokio::spawn(worker.run());
    assert_eq!(pending.await.unwrap().unwrap(), "ONCE");
    assert!(sched.reconnects() >= 1, "the monitor saw the new connection");
    // The re-sent call found the task the first one made: a second task would be queued, running or
    // dispatched here too.
    let stats = sched.stats().await.unwrap();
    let work = &stats.pools["work"];
    assert_eq!((work.queued, work.running, work.dispatched), (0, 0, 1));
    stopper.stop().await;
    running.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_to_an_older_broker_takes_its_accepted_and_waits_on_for_the_outcome() {
    let dir = Scratch::new("call-older");
    // The real broker as it was before it knew `outcome_only`: it answers every submit with
    // `accepted`, a call's too, and sends the outcome after it.
    let Some(older) = support::cronoq_before("outcome_only", "cronoq/broker/clients.py", &dir.0) else { return };
    let pools = "[[pools]]\nname = \"work\"\n[[pools]]\nname = \"idle\"\n";
    let broker = Broker::start_from(&older, &dir.0, pools, "durability = \"none\"", &[]);
    let worker = Worker::new(&broker.workers).heartbeat(Duration::from_millis(200), 5).pool(
        PoolConfig::new("work"),
        |p: Payload| async move {
            let text: String = p.decode().map_err(|e| Refused(e.to_string()))?;
            if text == "fail" {
                return Err(Refused(text));
            }
            Ok(text.to_uppercase())
        },
    );
    let stopper = worker.stopper();
    let running = tokio::spawn(worker.run());
    let sched = cronoq::connect(&broker.clients).await.unwrap();
    let value = tokio::time::timeout(LONG, sched.call::<String>(Task::new("older").pool("work"))).await;
    assert_eq!(value.expect("the outcome came after the accepted").unwrap(), "OLDER");
    let failed = sched.call_timeout::<Value>(Task::new("fail").pool("work"), LONG).await;
    assert!(matches!(&failed, Err(Error::TaskFailed { message, .. }) if message == "refused: fail"), "{failed:?}");
    // Accepted, then no outcome within the timeout: Timeout, as from a newer broker.
    let late = sched.call_timeout::<Value>(Task::new(1).pool("idle"), Duration::from_millis(300)).await;
    assert!(matches!(&late, Err(Error::Timeout(m)) if m.contains("pool \"idle\"")), "{late:?}");
    stopper.stop().await;
    running.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_given_up_on_is_not_sent_again_on_a_new_connection() {
    // A broker without a journal comes back empty: a call still held for re-sending would make a
    // task there again.
    let dir = Scratch::new("call-forgotten");
    let mut broker = Broker::start(&dir.0, "[[pools]]\nname = \"work\"\n", "durability = \"none\"", &[]);
    let sched = cronoq::connect(&broker.clients).await.unwrap();
    let late = sched.call_timeout::<Value>(Task::new("timed out").pool("work"), Duration::from_millis(200)).await;
    assert!(matches!(late, Err(Error::Timeout(_))), "no worker serves the pool: {late:?}");
    let dropped =
        tokio::time::timeout(Duration::from_millis(200), sched.call::<Value>(Task::new("dropped").pool("work")));
    assert!(dropped.await.is_err());
    assert_eq!(sched.stats().await.unwrap().pools["work"].queued, 2, "both calls made their task");

    broker.crash_and_restart();
    // Accepted on the new connection: whatever its handshake re-sent left with it, ahead of the stats below.
    sched.submit(Task::new("after").pool("work")).await.unwrap();
    assert!(sched.reconnects() >= 1, "the monitor saw the new connection");
    assert_eq!(sched.stats().await.unwrap().pools["work"].queued, 1, "only the task submitted after the restart");
}
