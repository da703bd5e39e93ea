//! Sharing by cost, with a rate, in the embedded scheduler: the snippet of rust/README.md, run.
//!
//! An LLM pool shared by tokens: each task's cost is the tokens of its call. globex queues eight
//! calls of 1,000 tokens, then acme two of 4,000, while the pool is paused; once it resumes, one
//! slot serves them in the fair order of summed cost: acme's one call for each four of globex's,
//! the same tokens each. A trial tenant may start one call every two seconds (a rate of 0.5); its
//! one call starts at once, in its fair turn.
//!
//! Run: `cargo run --example shares` (in rust/).

use std::sync::{Arc, Mutex};

use cronoq::{Payload, PoolConfig, Scheduler, ShareBy, Task};

#[tokio::main(flavor = "current_thread")]
async fn main() -> cronoq::Result<()> {
    // An LLM pool shared by tokens: each task's cost is the tokens of its call,
    // so a call of 4,000 tokens takes four times the share of one of 1,000.
    // A trial tenant may start one call every two seconds.
    let pool = PoolConfig::new("llm").share_by(ShareBy::Cost).tenant_rate("trial", 0.5);

    let order = Arc::new(Mutex::new(Vec::new()));
    let seen = order.clone();
    let sched = Scheduler::builder(vec![pool])
        .concurrency(1)
        .handler("llm", move |payload: Payload| {
            let seen = seen.clone();
            async move {
                let (tenant, tokens): (String, u32) = payload.decode()?;
                seen.lock().unwrap().push(format!("{tenant}:{tokens}"));
                Ok::<_, cronoq::Error>(tokens)
            }
        })
        .build()?;

    sched.pause("llm").await?;
    let mut handles = Vec::new();
    for (tenant, tokens, calls) in [("globex", 1000, 8), ("acme", 4000, 2), ("trial", 500, 1)] {
        for _ in 0..calls {
            let task = Task::new((tenant, tokens)).pool("llm").tenant(tenant).cost(f64::from(tokens));
            handles.push(sched.submit(task).await?);
        }
    }
    sched.resume("llm").await?;

    for handle in &handles {
        let _: u32 = handle.result().await?;
    }
    sched.close().await;
    let order = order.lock().unwrap();
    let letters: String = order.iter().map(|t| t.chars().next().unwrap()).collect();
    println!("dispatch order: {}", order.join(" "));
    println!("as letters:     {letters}");
    Ok(())
}
