//! Fair sharing with the embedded scheduler: the snippet of the documentation, run.
//!
//! acme weighs 3 and globex 1. globex queues its 4 tasks first, acme its 12 after, while the pool
//! is paused; once it resumes, one slot serves them in the fair order: acme gets three dispatches
//! for each of globex's, although globex came first.
//!
//! Run: `cargo run --example fair_share` (in rust/).

use std::sync::{Arc, Mutex};

use cronoq::{Fairness, Payload, PoolConfig, Scheduler, Task};

#[tokio::main(flavor = "current_thread")]
async fn main() -> cronoq::Result<()> {
    let mut pool = PoolConfig::new("llm");
    pool.fairness = Some(Fairness::weights([("acme", 3.0), ("globex", 1.0)]));

    let order = Arc::new(Mutex::new(Vec::new()));
    let seen = order.clone();
    let sched = Scheduler::builder(vec![pool])
        .concurrency(1)
        .handler("llm", move |payload: Payload| {
            let seen = seen.clone();
            async move {
                let (tenant, n): (String, u32) = payload.decode()?;
                seen.lock().unwrap().push(format!("{tenant}-{n}"));
                Ok::<_, cronoq::Error>(format!("{tenant} done {n}"))
            }
        })
        .build()?;

    sched.pause("llm").await?;
    let mut handles = Vec::new();
    for n in 0..4 {
        let payload = ("globex", n);
        handles.push(sched.submit(Task::new(payload).pool("llm").tenant("globex")).await?);
    }
    for n in 0..12 {
        let payload = ("acme", n);
        handles.push(sched.submit(Task::new(payload).pool("llm").tenant("acme")).await?);
    }
    let payload = ("acme", 12);
    sched.submit(Task::new(payload).pool("llm").tenant("acme")).await?;
    sched.resume("llm").await?;

    for handle in &handles {
        let _: String = handle.result().await?;
    }
    sched.close().await;
    let order = order.lock().unwrap();
    let letters: String = order.iter().map(|t| if t.starts_with("acme") { 'a' } else { 'g' }).collect();
    println!("dispatch order: {}", order.join(" "));
    println!("as letters:     {letters}");
    Ok(())
}
